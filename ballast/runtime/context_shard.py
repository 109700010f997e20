"""The context-parallel (CP) sharding of a micro-batch's packed stream, as index arithmetic.

Over c ranks, every sequence of the stream is cut on its own:
  - causal attention: into 2c chunks, rank j holding chunks j and 2c-1-j, so each rank gets an
    early (cheap) and a late (expensive) chunk of every document: the head-tail balance of
    Megatron's THD CP and WLB-LLM;
  - bidirectional attention: into c contiguous chunks, rank j holding chunk j (every query
    costs the same there).
Chunk sizes of a sequence differ by at most one token (`shard_sizes`), with no padding: a
sequence shorter than 2c (or c) tokens leaves some ranks without a token of it. A rank's rows
are its chunks in stream order of sequences, head before tail; their rotary positions stay each
token's global position in its sequence.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .shard_sizes import shard_sizes


def held_chunks(bounds: tuple[int, ...], degree: int, index: int, causal: bool) -> tuple[tuple[int, int, int], ...]:
    """(sequence start, chunk start, chunk end) in the stream of every non-empty chunk that CP
    rank `index` of `degree` holds, in its row order."""
    assert 0 <= index < degree, (index, degree)
    pieces = 2 * degree if causal else degree
    mine = (index, pieces - 1 - index) if causal else (index,)
    chunks = []
    for start, end in zip(bounds, bounds[1:]):
        cuts = [start]
        for size in shard_sizes(end - start, pieces):
            cuts.append(cuts[-1] + size)
        chunks += [(start, cuts[p], cuts[p + 1]) for p in mine if cuts[p + 1] > cuts[p]]
    return tuple(chunks)


def held_indices(chunks: tuple[tuple[int, int, int], ...]) -> Tensor:
    """The stream indices of the rows that hold `chunks`, in row order."""
    if not chunks:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(a, b) for _, a, b in chunks])
