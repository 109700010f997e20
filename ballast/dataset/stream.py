"""BatchStream: the corpus as seeded, resumable global batches under a token budget.

Samples. A training sequence of length s holds s + 1 tokens: inputs t[0..s-1] and targets
t[1..s]. A document of n tokens has n - 1 targets, so it yields ceil((n - 1) / max_len) samples
(none if n < 2): chunk c holds tokens [c*max_len, min((c+1)*max_len + 1, n)) and trains on
min(max_len, n - 1 - c*max_len) of them. Consecutive chunks share one token (the last target of
one is the first input of the next), so every next-token prediction of the document is trained
exactly once and the lengths of its chunks sum to n - 1.

Sample ids. Samples are numbered in corpus order, document by document, chunk by chunk:
id = (samples of documents before it) + chunk, dense in 0..num_samples-1. They depend only on
the corpus and max_len, so a trainer can log them and check each epoch covers every id once.

Order. Epoch e visits the samples in the permutation drawn from numpy's PCG64 seeded with
(seed, e). Samples, not documents, are shuffled: with max_len below the typical document a
document's chunks back to back would fill whole batches with full-length chunks of one file,
leaving the planners no length variety and the loss swinging with the file. A global batch is the longest run of
consecutive samples whose lengths sum to at most tokens_per_step (at least one sample, so a
sample longer than the budget is a batch alone); a batch never crosses an epoch's end, so the
last one of an epoch may be small, and an epoch is a whole number of batches.

State. The stream's position is (epoch, samples of the epoch consumed): `state_dict()` after
a batch and `load_state_dict` in a fresh stream over the same corpus, seed and max_len give the
same following batches. The budget may differ on resume (the position is in samples).

Order, batches and state are `EpochStream`'s, shared with the video clip streams (`video.py`),
which differ only in what a sample is.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from .corpus import TokenCorpus

STATE_FORMAT = 1


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's samples. A text sample samples[i] holds lengths[i] + 1 ids: the
    inputs are samples[i][:-1] and the targets samples[i][1:]. A video sample is a `Clip`."""

    sample_ids: list[int]
    lengths: list[int]
    """Training tokens of every sample."""
    samples: list
    """What the model trains on (`ParallelModel.loss`)."""
    epoch: int
    shapes: list | None = None
    """Every clip's (frames, height, width) in latent patches; None for text (its lengths)."""

    @property
    def planned(self) -> list:
        """What the planner plans: the clips' shapes, or the text lengths."""
        return self.lengths if self.shapes is None else self.shapes

    @property
    def num_tokens(self) -> int:
        """Training tokens (targets) in the batch: the loss normaliser."""
        return sum(self.lengths)


class EpochStream(ABC):
    """What BatchStream and the video streams (`video.ClipStream`) share: the seeded epoch
    order, the budgeted batches, the position and its state (see the module docstring).
    A subclass sets `num_samples` and says each sample's tokens, how ids become a `GlobalBatch` and
    what its state is only valid for besides the seed and max_len."""

    num_samples: int
    """Samples per epoch; ids are 0..num_samples-1."""

    def __init__(self, tokens_per_step: int, max_len: int, seed: int) -> None:
        kind = type(self).__name__
        for name, value in (("tokens_per_step", tokens_per_step), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{kind}: {name} must be a positive integer, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"{kind}: seed must be a non-negative integer, got {seed!r}")
        self.tokens_per_step, self.max_len, self.seed = tokens_per_step, max_len, seed
        self.epoch = 0
        """Epoch of the next batch."""
        self._cursor = 0
        """Samples of `epoch` already yielded; always < num_samples."""
        self._order_epoch = -1
        self._order = self._cum = np.zeros(0, np.int64)

    @abstractmethod
    def sample_lengths(self, sample_ids: np.ndarray | list[int]) -> np.ndarray:
        """Training tokens of each sample id."""

    @abstractmethod
    def make_batch(self, sample_ids: np.ndarray, epoch: int) -> GlobalBatch:
        """The batch of these samples, drawn in `epoch`."""

    @abstractmethod
    def state_identity(self) -> dict:
        """What a state is valid for besides seed and max_len, e.g. {"corpus": fingerprint}."""

    @abstractmethod
    def sample_name(self, sample_id: int) -> str:
        """The sample and where it comes from (a document, a clip's file), for messages."""

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Sample ids of `epoch` in the order the stream yields them."""
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def planned_samples(self, sample_ids: np.ndarray | list[int]) -> list:
        """What a planner plans of each sample id (`GlobalBatch.planned`): its tokens here."""
        return self.sample_lengths(sample_ids).tolist()

    def next_ids(self) -> tuple[np.ndarray, int]:
        """The next batch's sample ids and the epoch they are drawn in, without the samples."""
        if self._order_epoch != self.epoch:  # one epoch's order and running lengths are kept
            self._order = self.epoch_order(self.epoch)
            self._cum = np.cumsum(self.sample_lengths(self._order))
            self._order_epoch = self.epoch
        start, epoch = self._cursor, self.epoch
        before = int(self._cum[start - 1]) if start else 0
        end = int(np.searchsorted(self._cum, before + self.tokens_per_step, side="right"))
        end = max(end, start + 1)
        ids = self._order[start:end]
        self._cursor = end
        if end == self.num_samples:  # so `epoch` is always the next batch's
            self.epoch, self._cursor = epoch + 1, 0
        return ids, epoch

    def next_batch(self) -> GlobalBatch:
        return self.make_batch(*self.next_ids())

    def __iter__(self) -> Iterator[GlobalBatch]:
        return self

    def __next__(self) -> GlobalBatch:
        return self.next_batch()

    def state_dict(self) -> dict:
        """The stream's position and what it is only valid for; JSON-serialisable."""
        return {"format": STATE_FORMAT, **self.state_identity(), "seed": self.seed,
                "max_len": self.max_len, "tokens_per_step": self.tokens_per_step,
                "epoch": self.epoch, "position": self._cursor}

    def load_state_dict(self, state: dict) -> None:
        """Resume at `state`'s position; ValueError if it belongs to another stream."""
        kind = type(self).__name__
        expected = {"format": STATE_FORMAT, **self.state_identity(),
                    "seed": self.seed, "max_len": self.max_len}
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(f"{kind} state is for {key}={state.get(key)!r}, "
                                 f"this stream has {key}={value!r}")
        epoch, position = state.get("epoch"), state.get("position")
        if not (isinstance(epoch, int) and epoch >= 0 and isinstance(position, int)
                and 0 <= position < self.num_samples):
            raise ValueError(f"{kind} state has an invalid position "
                             f"(epoch {epoch!r}, position {position!r} of {self.num_samples})")
        self.epoch, self._cursor = epoch, position


class BatchStream(EpochStream):
    """Endless stream of global batches over `corpus` (see the module docstring)."""

    def __init__(self, corpus: TokenCorpus, tokens_per_step: int, max_len: int, seed: int) -> None:
        super().__init__(tokens_per_step, max_len, seed)
        self.corpus = corpus
        self._doc_len = corpus.document_lengths()
        chunks = (np.maximum(self._doc_len - 1, 0) + max_len - 1) // max_len
        self._chunks = chunks
        self._first = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
        self.num_samples = int(self._first[-1])
        if self.num_samples == 0:
            raise ValueError(f"{corpus.name}: no document has the 2 tokens a sample needs")

    def locate(self, sample_ids: np.ndarray | list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(document, chunk) of each sample id."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        assert ids.size == 0 or (ids.min() >= 0 and ids.max() < self.num_samples)
        doc = np.searchsorted(self._first, ids, side="right") - 1
        return doc, ids - self._first[doc]

    def sample_lengths(self, sample_ids: np.ndarray | list[int]) -> np.ndarray:
        """Training tokens of each sample id."""
        doc, chunk = self.locate(sample_ids)
        return np.minimum(self.max_len, self._doc_len[doc] - 1 - chunk * self.max_len)

    def sample_tokens(self, sample_id: int) -> np.ndarray:
        """The sample's length + 1 token ids, as int64."""
        doc, chunk = (int(x[0]) for x in self.locate([sample_id]))
        start = chunk * self.max_len
        out = self.corpus.document(doc)[start:start + self.max_len + 1].astype(np.int64)
        assert out.size >= 2
        return out

    def make_batch(self, sample_ids: np.ndarray, epoch: int) -> GlobalBatch:
        return GlobalBatch(sample_ids=sample_ids.tolist(), lengths=self.sample_lengths(sample_ids).tolist(),
                     samples=[torch.from_numpy(self.sample_tokens(int(i))) for i in sample_ids],
                     epoch=epoch)

    def state_identity(self) -> dict:
        return {"corpus": self.corpus.fingerprint}

    def sample_name(self, sample_id: int) -> str:
        doc, chunk = (int(x[0]) for x in self.locate([sample_id]))
        return f"sample {sample_id} ({self.corpus.name} document {doc}, chunk {chunk})"
