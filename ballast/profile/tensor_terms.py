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
- **the compute share**: the grid's two longest sequences at its reduced depths, with no block
  and every block recomputed (`tensor_points`), run in every round on the TP-split model and on
  the whole model one after the other (`measure_tensor_points`), fit one factor phi, a TP rank's
  compute over its shard's share of the whole model's as measured beside it (a and b times
  phi / t, `fit_compute_factor`): a shard does not split the norms, residual adds and
  element-wise work on the whole hidden state, and its smaller matmuls run less efficiently. On
  the tiny GPT on 2 gloo ranks phi = 1 left every TP plan of the check 12% under-predicted; a
  phi fitted against the grid's prediction instead of a measurement beside it moved with the
  machine's drift between the grid and the TP points (1.18 and 1.26 in two profiles, the check
  +-10%). Reduced depths, as the grid's: a model TP is for may not fit one device whole.
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


def tensor_points(shape: ModelShape, lengths: Sequence[int], depths: Sequence[int]) -> list[Point]:
    """The micro-batches a TP rank is measured on: the grid's two longest sequences at each of its
    depths, with no block and every block recomputed (the recomputed forward's all-reduces and
    compute)."""
    longest = sorted(set(lengths))[-2:]
    return [Point(depth, (n,), 1, k) for depth in sorted(set(depths)) for n in longest for k in (0, depth)]


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
                          repeats: int, seed: int, precision: Precision) -> dict[int, dict[str, list[list[float]]]]:
    """Run on every rank: per TP degree t, each point's micro-batch seconds on this rank in each
    of `repeats` rounds (after `warmup`), on the model split over TP groups of t ("tp") and right
    after on the whole model ("whole"), every pool rank running a copy of the point: the two
    measured side by side, so that the machine's drift is in both."""
    import torch.distributed as dist

    from ..models import build_model
    from ..runtime import parallelize
    from .measure import plan_samples, point_plan

    world = dist.get_world_size()
    cluster = get_cluster("cpu", world_size=world)
    out = {}
    for t in degrees:
        mesh = JobMesh.of(cluster, tp=t, shape=shape)
        runs = {}
        for depth in sorted({p.layers for p in points}):
            model = dataclasses.replace(shape, layers=depth)
            runs[depth] = {layout: parallelize(build_model(model, seed), cluster, mesh=m,
                                               precision=precision, lr=1e-9)
                           for layout, m in (("tp", mesh), ("whole", JobMesh.of(cluster)))}
        plans = {"tp": [dataclasses.replace(point_plan(p, mesh.pool), tp=t) for p in points],
                 "whole": [point_plan(p, world) for p in points]}
        rounds = {layout: [[] for _ in points] for layout in plans}
        for r in range(warmup + repeats):
            for i, point in enumerate(points):
                for layout in ("tp", "whole"):
                    plan = plans[layout][i]
                    (mb,) = runs[point.layers][layout].step(plan, plan_samples(plan, shape, seed + i)).micro_batches
                    if r >= warmup:
                        rounds[layout][i].append(mb.seconds)
        out[t] = rounds
    return out


def fit_tensor_terms(all_reduces: Sequence[dict], points: Sequence[Point], seconds: dict[int, dict[str, list[float]]],
                     costs: dict[int, CostModel], shape: ModelShape) -> tuple[dict[int, TensorTerms], dict[int, float]]:
    """Each degree's terms: its link from its timed all-reduces (`time_all_reduces` of one rank:
    every rank of a group waits for the slowest, so each measures the group's time), then its
    compute factor from its points' measured `seconds` ("tp" and "whole", reduced over rounds and
    ranks) under the whole-layer profile at each depth (`costs`) sharded over that link, held to
    [1, t]; beside them each measured degree's factor as fitted, before the bounds (the report
    keeps both, so that a bounded factor is seen)."""
    terms, fitted = {}, {}
    for t in sorted({row["degree"] for row in all_reduces}):
        mine = [row for row in all_reduces if row["degree"] == t]
        bandwidth, latency = _link(np.ones(len(mine)), np.array([ring_bytes(row["bytes"], t) for row in mine]),
                                   np.array([row["seconds"] for row in mine]))
        link = TensorTerms(float(bandwidth), float(latency), mine[0]["value_bytes"])
        factor = 1.0
        if t in seconds:
            fitted[t] = fit_compute_factor(link, points, seconds[t], costs, shape, t)
            # A shard computes at least its share of the whole (nothing runs faster for being split)
            # and at most the whole. A fit outside says the link's fixed terms, timed alone, took
            # more of the TP run than they did (a CI run saw -1.3 when the machine ran 22% slower
            # than during the grid): the bound keeps the price sane, the report shows the fit.
            factor = min(max(fitted[t], 1.0), float(t))
        terms[t] = dataclasses.replace(link, compute_factor=factor)
    return terms, fitted


def fit_compute_factor(link: TensorTerms, points: Sequence[Point], seconds: dict[str, Sequence[float]],
                       costs: dict[int, CostModel], shape: ModelShape, tp: int) -> float:
    """phi of least relative error over the points. Both layouts' predictions are linear in the
    compute's scale: the whole model's W = A_w + C, a TP rank's T = A_t + phi C / t (A: the
    all-reduces and fixed costs, C: the compute). The compute is taken as measured beside the TP
    run, C = M_w - A_w, so T = A_t + phi D with D = (M_w - A_w) / t and, against the TP run's
    measured M_t, phi = sum (D/M_t)(1 - A_t/M_t) / sum (D/M_t)^2."""
    mesh = JobMesh(world_size=tp, devices_per_node=tp, tp=tp)

    def predicted(point: Point, scale: float, sharded_over: TensorTerms | None) -> float:
        cost = costs[point.layers]
        scaled = dataclasses.replace(cost, a=cost.a * scale, b=cost.b * scale)
        at_depth = dataclasses.replace(shape, layers=point.layers)
        rank = sharded(scaled, at_depth, sharded_over, mesh) if sharded_over is not None else scaled
        return rank.time(list(point.lengths), point.degree, point.recompute_layers / point.layers)

    def fixed(point: Point, sharded_over: TensorTerms | None) -> float:
        # Two scales give the line (0 would make a cost model of no attention with a span cost).
        once, twice = predicted(point, 1.0, sharded_over), predicted(point, 2.0, sharded_over)
        return 2 * once - twice

    whole, measured = np.asarray(seconds["whole"], dtype=float), np.asarray(seconds["tp"], dtype=float)
    compute = (whole - np.array([fixed(p, None) for p in points])) / tp
    rest = 1.0 - np.array([fixed(p, link) for p in points]) / measured
    d = compute / measured
    return float(np.dot(d, rest) / np.dot(d, d))
