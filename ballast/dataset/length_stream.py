"""Batches of samples for planning without training: a `LengthSource`'s draws cut into steps.

`LengthStream` is the simulation's counterpart of `stream.BatchStream`: both cut a stream of
sequences into global batches by a count or a token budget and apply `max_len` (here by a
policy, `BatchSpec.overlong`; a corpus always splits). BatchStream holds a corpus and its
tokens and resumes from a checkpoint; LengthStream draws iid lengths from a distribution, which
is all `ballast simulate` and the benchmarks need.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator, Literal

import numpy as np

from ..vocabulary.samples import Sample, split_sample, tokens
from .length_source import LengthSource


Overlong = Literal["split", "drop", "error"]


@dataclass(frozen=True)
class BatchSpec:
    """How a step's batch is cut from the length stream; exactly one of batch/tokens_per_step."""

    batch: int | None = None
    """N documents per step: N draws that survive the overlong policy. Under "split" the
    chunks of a document stay in its step, so a step may hold more than N sequences (the
    step still trains on N documents, which is what a batch size means to a user)."""
    tokens_per_step: int | None = None
    """Token budget: the longest prefix of the (split or filtered) sequence stream whose tokens
    fit the budget, at least one sequence; the next sequence starts the next step. Chunks of a
    split document may straddle steps. With budget >= max_len every step fits the budget."""
    max_len: int = 393216
    """Longest sequence a plan must hold; longer draws go through `overlong`."""
    overlong: Overlong = "split"
    """"split": chunks of max_len plus the remainder (a clip: runs of whole frames; at most
    `LengthStream.MAX_SPLIT_CHUNKS` of them, a longer draw is an error); "drop":
    discard the draw (as a corpus filter would); "error": ValueError naming the length and
    the limit."""

    def __post_init__(self) -> None:
        if (self.batch is None) == (self.tokens_per_step is None):
            raise ValueError("BatchSpec: give exactly one of batch (sequences per step) "
                             "or tokens_per_step (token budget per step)")
        for field in ("batch", "tokens_per_step", "max_len"):
            value = getattr(self, field)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"BatchSpec: {field} must be a positive integer, got {value!r}")
        if self.overlong not in ("split", "drop", "error"):
            raise ValueError(f"BatchSpec: overlong must be 'split', 'drop' or 'error', "
                             f"got {self.overlong!r}")


class LengthStream:
    """Endless, seeded stream of batches (lists of samples: lengths or clip shapes) from a
    source under a BatchSpec: for
    `ballast simulate`, what `BatchStream` is for training (which cuts a corpus's samples, with
    their tokens, by a token budget).

    Counters (drawn_*, split_*, dropped_*) cover the draws consumed so far, so `report()` can
    tell how much of the corpus the overlong policy touched.
    """

    DRAW_BLOCK = 1024
    """Draws fetched from the source at once (vectorised sampling); part of the seeded stream."""
    MAX_DROPS_IN_A_ROW = 10_000
    """Under "drop", this many consecutive overlong draws means max_len excludes (nearly) the
    whole source: a configuration error, not something to loop on forever."""
    MAX_SPLIT_CHUNKS = 4096
    """Under "split", the most chunks one draw may become (a 1M-token book at max_len 256 is
    about 3900): a longer draw is refused before any chunk is made, where splitting it would
    build (and plan) millions of sequences for one document."""

    def __init__(self, source: LengthSource, spec: BatchSpec, seed: int) -> None:
        self.source, self.spec = source, spec
        self._rng = np.random.default_rng(seed)
        self._draws: deque[Sample] = deque()
        self._pending: deque[Sample] = deque()  # sequences of a document not yet batched
        self.drawn_sequences = self.drawn_tokens = 0
        self.split_sequences = self.split_chunks = self.split_tokens = 0
        self.dropped_sequences = self.dropped_tokens = 0

    def _draw(self) -> Sample:
        if not self._draws:
            draws = self.source.sample(self._rng, self.DRAW_BLOCK).tolist()
            self._draws.extend(x if isinstance(x, int) else tuple(x) for x in draws)
        sample = self._draws.popleft()
        self.drawn_sequences += 1
        self.drawn_tokens += tokens(sample)
        return sample

    def _next_document(self) -> list[Sample]:
        """The next draw as sequences that fit max_len: itself, its chunks, or (drop) the next."""
        limit = self.spec.max_len
        for _ in range(self.MAX_DROPS_IN_A_ROW):
            sample = self._draw()
            length = tokens(sample)
            if length <= limit:
                return [sample]
            if self.spec.overlong == "error":
                raise ValueError(f"{self.source.name}: sequence of {length} tokens is longer than "
                                 f"max_len={limit} (overlong='error'; use 'split' or 'drop')")
            if self.spec.overlong == "split":
                if length > self.MAX_SPLIT_CHUNKS * limit:
                    raise ValueError(f"{self.source.name}: a sequence of {length} tokens would split into "
                                     f"{-(-length // limit)} or more chunks of max_len={limit}, more than the "
                                     f"{self.MAX_SPLIT_CHUNKS} one sequence may become; raise max_len, or use "
                                     f"overlong='drop'")
                chunks = split_sample(sample, limit)
                self.split_sequences += 1
                self.split_chunks += len(chunks)
                self.split_tokens += length
                return chunks
            self.dropped_sequences += 1
            self.dropped_tokens += length
        raise ValueError(f"{self.source.name}: {self.MAX_DROPS_IN_A_ROW} draws in a row were longer than "
                         f"max_len={limit} and dropped; raise max_len or use overlong='split'")

    def next_batch(self) -> list[Sample]:
        if self.spec.batch is not None:
            return [s for _ in range(self.spec.batch) for s in self._next_document()]
        budget, batch, total = self.spec.tokens_per_step, [], 0
        while True:
            if not self._pending:
                self._pending.extend(self._next_document())
            if batch and total + tokens(self._pending[0]) > budget:
                return batch
            total += tokens(self._pending[0])
            batch.append(self._pending.popleft())

    def __iter__(self) -> Iterator[list[Sample]]:
        return self

    def __next__(self) -> list[Sample]:
        return self.next_batch()

    def report(self) -> str:
        """One line on what the overlong policy did, for `ballast simulate`'s output."""
        def seqs(n: int) -> str:
            return f"{n} sequence{'s' * (n != 1)}"

        limit, share = self.spec.max_len, 100 / max(1, self.drawn_tokens)
        if self.split_sequences:
            return (f"split {seqs(self.split_sequences)} longer than {limit} tokens into "
                    f"{self.split_chunks} chunks ({self.split_tokens} tokens, "
                    f"{self.split_tokens * share:.2f}% of {self.drawn_tokens} drawn)")
        if self.dropped_sequences:
            return (f"dropped {seqs(self.dropped_sequences)} longer than {limit} tokens "
                    f"({self.dropped_tokens} tokens, {self.dropped_tokens * share:.2f}% of "
                    f"{self.drawn_tokens} drawn)")
        return f"no sequence longer than {limit} tokens among {seqs(self.drawn_sequences)} drawn"
