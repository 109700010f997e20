"""The TP terms of a profile: what a tensor-parallel group's all-reduce of hidden states costs on
the profiled ranks, so that `--check --tp` (and simulate, train and bench with a profile under
`--tp`) price a TP rank from this machine's link rather than a preset's.

A TP rank computes its shard of every matmul (the coefficients over t, `pricing/tensor_parallel`)
and all-reduces the hidden state of every token 4 times per block and twice outside them
(`tensor_parallel.ALL_REDUCES_PER_LAYER`, `ROOT_ALL_REDUCES`). The profile times those
all-reduces alone, on groups of every TP degree the world and the model allow, over tensors of
[tokens, hidden] in the executor's dtype at a ladder of token counts, and fits per degree

    seconds per call = latency + 2 (t - 1) / t x bytes / bandwidth

(a ring all-reduce's bytes per rank), the same least squares as the all-to-alls' link
(`fit._link`). `TensorLink` is what `tensor_parallel.sharded` prices with.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..pricing.tensor_parallel import TensorLink, ring_bytes
from ..vocabulary.model_shape import ModelShape
from .fit import _link

TOKENS = (256, 1024, 4096, 16384)
"""Token counts of the timed all-reduces: from latency-bound to bandwidth-bound on gloo."""
CALLS = 8
"""All-reduces per timing: one call of a small tensor is shorter than the clock's noise."""


def tensor_degrees(shape: ModelShape, world_size: int) -> list[int]:
    """TP degrees t >= 2 that the profile's ranks (one node) can run for `shape`: powers of two up
    to the world that split its heads, kv heads, MLP width and vocabulary evenly (text models)."""
    if shape.pattern.clips:
        return []
    return [t for t in (1 << i for i in range(1, world_size.bit_length())) if t <= world_size and
            all(value % t == 0 for value in (shape.heads, shape.kv_heads, shape.ffn, shape.vocab))]


def time_all_reduces(shape: ModelShape, degrees: Sequence[int], repeats: int, dtype) -> list[dict]:
    """Run on every rank: per degree t (a group of ranks 0..t-1) and token count, the least over
    `repeats` rounds of one all-reduce's seconds of a [tokens, hidden] tensor of `dtype` (as the
    profile's other points take the fastest or typical round, the link is what the group does
    when nothing else takes it). Ranks outside a group wait at the barrier that ends it."""
    import torch
    import torch.distributed as dist

    from ..runtime import rank_device

    device, rank, out = rank_device(), dist.get_rank(), []
    for t in degrees:
        group = dist.new_group(list(range(t)))  # every rank calls new_group, as torch requires
        for tokens in TOKENS:
            if rank < t:
                tensor = torch.ones(tokens, shape.hidden, dtype=dtype, device=device)
                dist.all_reduce(tensor, group=group)  # warm-up: buffers and connections
                best = float("inf")
                for _ in range(repeats):
                    dist.barrier(group=group)
                    start = time.perf_counter()
                    for _ in range(CALLS):
                        dist.all_reduce(tensor, group=group)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    best = min(best, (time.perf_counter() - start) / CALLS)
                out.append(dict(degree=t, tokens=tokens, bytes=tensor.numel() * tensor.element_size(),
                                value_bytes=tensor.element_size(), seconds=best))
            dist.barrier()
        dist.destroy_process_group(group)
    return out


def fit_tensor_link(rows: Sequence[dict]) -> dict[int, TensorLink]:
    """Each degree's link from its timed all-reduces (`time_all_reduces` of one rank: every rank of
    a group waits for the slowest, so each measures the group's time)."""
    links = {}
    for t in sorted({row["degree"] for row in rows}):
        mine = [row for row in rows if row["degree"] == t]
        bandwidth, latency = _link(np.ones(len(mine)), np.array([ring_bytes(row["bytes"], t) for row in mine]),
                                   np.array([row["seconds"] for row in mine]))
        links[t] = TensorLink(float(bandwidth), float(latency), mine[0]["value_bytes"])
    return links
