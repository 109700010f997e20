"""The TP terms of a profile: what a tensor-parallel rank pays on the profiled ranks beyond its
shard of the whole layers, so that `--check --tp` (and simulate, train and bench with a profile
under `--tp`) price a TP rank from this machine rather than from a preset
(`tensor_parallel.TensorTerms`, which `tensor_parallel.sharded` prices with).

A TP rank computes its shard of every matmul and all-reduces the hidden state of every token 4
times per block and twice outside them (`tensor_parallel.ALL_REDUCES_PER_LAYER`,
`ROOT_ALL_REDUCES`). The profile measures both halves on groups of every TP degree the world
and the model allow (`tensor_degrees`):

- **the link**: all-reduces of [tokens, hidden] in the executor's dtype at a ladder of token
  counts, alone (`time_all_reduces`), fitted per degree as seconds per call = latency +
  2 (t - 1) / t x bytes / bandwidth (a ring's bytes per rank; the all-to-alls' least squares,
  `fit._link`);
- **the compute share**: a few full-depth micro-batches run on the TP-split model
  (`tensor_points`, `measure_tensor_points`), whose seconds fit one factor phi over the
  sharded prediction's compute, a and b times phi / t (`fit_compute_factor`): a shard does not
  split the norms, residual adds and element-wise work on the whole hidden state, and its
  smaller matmuls run less efficiently. On the tiny GPT on 2 gloo ranks phi = 1 left every TP
  plan of the check 12% under-predicted.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from ..pricing.cost import CostModel
from ..pricing.tensor_parallel import TensorTerms, ring_bytes, sharded
from ..vocabulary.cluster import get_cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.precision import Precision
from .fit import _link
from .grid import Point

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


def tensor_points(shape: ModelShape, lengths: Sequence[int]) -> list[Point]:
    """The full-depth micro-batches a TP rank is measured on: the grid's two longest sequences,
    with no block and every block recomputed (the recomputed forward's all-reduces and compute)."""
    longest = sorted(set(lengths))[-2:]
    return [Point(shape.layers, (n,), 1, k) for n in longest for k in (0, shape.layers)]


def time_all_reduces(shape: ModelShape, degrees: Sequence[int], repeats: int, dtype) -> list[dict]:
    """Run on every rank: per degree t (a group of ranks 0..t-1) and token count, the least over
    `repeats` rounds of one all-reduce's seconds of a [tokens, hidden] tensor of `dtype` (what the
    group's link does when nothing else takes it). Ranks outside a group wait at the barrier that
    ends it."""
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


def measure_tensor_points(shape: ModelShape, points: Sequence[Point], degrees: Sequence[int], warmup: int,
                          repeats: int, seed: int, precision: Precision) -> dict[int, list[list[float]]]:
    """Run on every rank: per TP degree t, each point's micro-batch seconds on this rank in each
    of `repeats` rounds (after `warmup`), the model split over TP groups of t and every pool rank
    running a copy of the point."""
    import torch.distributed as dist

    from ..models import build_model
    from ..runtime import parallelize, rank_device
    from .measure import plan_samples, point_plan

    world = dist.get_world_size()
    cluster = get_cluster("cpu", world_size=world)
    out = {}
    for t in degrees:
        mesh = JobMesh.of(cluster, tp=t, shape=shape)
        executor = parallelize(build_model(shape, seed).to(rank_device()), cluster, mesh=mesh, precision=precision,
                               lr=1e-9)
        plans = [dataclasses.replace(point_plan(point, mesh.pool), tp=t) for point in points]
        samples = [plan_samples(plan, shape, seed + i) for i, plan in enumerate(plans)]
        rounds: list[list[float]] = [[] for _ in points]
        for r in range(warmup + repeats):
            for i, (plan, batch) in enumerate(zip(plans, samples)):
                (mb,) = executor.step(plan, batch).micro_batches
                if r >= warmup:
                    rounds[i].append(mb.seconds)
        out[t] = rounds
        del executor
    return out


def fit_tensor_terms(all_reduces: Sequence[dict], points: Sequence[Point], seconds: dict[int, Sequence[float]],
                     cost: CostModel, shape: ModelShape) -> dict[int, TensorTerms]:
    """Each degree's terms: its link from its timed all-reduces (`time_all_reduces` of one rank:
    every rank of a group waits for the slowest, so each measures the group's time), then its
    compute factor from its points' measured `seconds` (reduced over rounds and ranks) under the
    whole-layer profile `cost` sharded over that link."""
    terms = {}
    for t in sorted({row["degree"] for row in all_reduces}):
        mine = [row for row in all_reduces if row["degree"] == t]
        bandwidth, latency = _link(np.ones(len(mine)), np.array([ring_bytes(row["bytes"], t) for row in mine]),
                                   np.array([row["seconds"] for row in mine]))
        link = TensorTerms(float(bandwidth), float(latency), mine[0]["value_bytes"])
        factor = fit_compute_factor(link, points, seconds[t], cost, shape, t) if t in seconds else 1.0
        terms[t] = dataclasses.replace(link, compute_factor=factor)
    return terms


def fit_compute_factor(link: TensorTerms, points: Sequence[Point], seconds: Sequence[float], cost: CostModel,
                       shape: ModelShape, tp: int) -> float:
    """phi of least relative error over the points: a TP rank's predicted seconds are linear in
    it, A + phi B (A: the all-reduces and fixed costs, B: the sharded compute), so it is closed
    form, phi = sum (B/M)(1 - A/M) / sum (B/M)^2 over measured seconds M."""
    mesh = JobMesh(world_size=tp, devices_per_node=tp, tp=tp)

    def predicted(factor: float) -> np.ndarray:
        rank = sharded(cost, shape, dataclasses.replace(link, compute_factor=factor), mesh)
        return np.array([rank.time(list(p.lengths), p.degree, p.recompute_layers / shape.layers) for p in points])

    # Two factors give the line (0 would make a cost model of no attention with a span cost).
    compute = predicted(2.0) - predicted(1.0)
    fixed = predicted(1.0) - compute
    measured = np.asarray(seconds, dtype=float)
    b, rest = compute / measured, 1.0 - fixed / measured
    return float(np.dot(b, rest) / np.dot(b, b))
