"""Hydraulis' offline proposal of strategies from a length histogram (its repository's
`strategy/static.py`, `dynamic_programming`), for `--strategy auto`: the strategies a step may take,
one per bucket of the longest length, before any step is planned.

Types: every (t, p) with t a power of two inside a node, p dividing the layers, t p ranks a power
of two (so that pipelines placed largest first sit inside a node or on whole nodes), whose states
fit at the job's canonical layout; c_k(s) = a stage's seconds on a sequence of s tokens alone plus
a micro-batch's fixed cost (the pipeline's cost model: Hydraulis' a s^2 + b s + c), cap_k the
tokens one rank holds without recomputation (Hydraulis runs none: `hydraulis_strategies.py`).

Lengths fall into buckets of `step` tokens. C_k(lo, hi], a replica of type k training every
sequence of the histogram in (lo, hi]: sum count c_k(s) + (p - 1) c_k(longest), its 1F1B warm-up
and cool-down. T[n][b], the least makespan of n ranks training every sequence up to bucket b:

    T[0][0] = 0,    T[n][b] = min over k with cap_k >= the longest in (b - l, b], l >= 1,
                               d replicas of t_k p_k ranks each:  max(T[n - d t_k p_k][b - l], C_k(b - l, b] / d)

n counts ranks in steps of `unit` (Hetu's N_STEP): the smallest type's size, or the least power
of two of at least world / COUNTS where that is larger and divides the world, so the table has
at most COUNTS + 1 rows (1,024 ranks: steps of 16); a type smaller than the step takes replicas
in packs that fill it.

Each bucket b's plan (its intervals, each on d replicas of one type) is the strategy for data
capped at b; the distinct ones, at most POOL of them spread over the buckets that hold lengths,
are the pool. Deviations: T counts exactly n ranks (a strategy covers the world; Hetu's "at most n"
may leave ranks out), and the pool is capped at POOL strategies (every step plans each that holds
its batch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..pricing.coefficients import InfeasibleError
from ..pricing.cost import CostModel, tokens_array
from ..pricing.cost_sources import strategy_cost_models
from ..vocabulary.cluster import Cluster
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.samples import Sample
from ..vocabulary.strategy import PipelineLayout, Strategy

BUCKETS = 32  # length buckets up to the longest length (Hetu: S / S_STEP, 32 for its 32B planner)
POOL = 4  # strategies kept at most
COUNTS = 64  # rank counts of the table at most (module docstring)
HISTOGRAM = 100_000
"""Lengths the histogram is drawn from at most: simulate's further draws of --lengths, train's sample of
the training data (Hydraulis' is the whole dataset)."""


def pipeline_types(spec: str, shape: ModelShape, cluster: Cluster,
                   device_memory_gb: float | None = None) -> dict[PipelineLayout, CostModel]:
    """Every (t, p) a pipeline of the job may take (module docstring), with its cost model."""
    world, node = cluster.world_size, cluster.devices_per_node
    types = {}
    for t in (2 ** i for i in range(int(math.log2(node)) + 1)):
        for p in range(1, shape.layers + 1):
            size = t * p
            if shape.layers % p or size > world or size & (size - 1) or world % size:
                continue
            layout = PipelineLayout(t, p)
            try:
                types[layout] = strategy_cost_models(spec, shape, cluster, Strategy((layout,) * (world // size)),
                                                     device_memory_gb)[0]
            except (InfeasibleError, ValueError):
                continue  # its states do not fit, or its TP does not divide the heads
    if not types:
        raise ValueError(f"no (t, p) pipeline of {shape.name!r} fits {cluster.name!r}'s devices: give more memory")
    return types


def propose(types: dict[PipelineLayout, CostModel], samples: Sequence[Sample], world: int) -> list[Strategy]:
    """The pool for the histogram of `samples` (module docstring), longest bucket's strategy first."""
    table = Table.of(types, samples, world)
    held = [b for b in range(table.buckets, 0, -1) if np.isfinite(table.best[-1, b]) and table.longest[b] > 0]
    if not held or held[0] != table.buckets:
        raise ValueError(f"no strategy of {world} ranks holds the longest length ({int(table.longest.max())} tokens) "
                         f"without recomputation, as Hydraulis' pipelines must: give a shorter --max-len, more "
                         f"devices or more memory")
    pool: list[Strategy] = []
    for b in held:
        strategy = table.strategy(b)
        if strategy not in pool:
            pool.append(strategy)
    if len(pool) <= POOL:
        return pool
    picks = np.unique(np.linspace(0, len(pool) - 1, POOL).round().astype(int))
    return [pool[i] for i in picks]


@dataclass(frozen=True)
class Table:
    """T (module docstring): `best[n, b]` the least makespan of n steps of `unit` ranks training
    every sequence up to bucket b, `trace[n, b]` its last interval (type index, replicas, lo,
    the steps before)."""

    layouts: list[PipelineLayout]
    unit: int
    best: np.ndarray
    trace: dict[tuple[int, int], tuple[int, int, int, int]]
    longest: np.ndarray
    """The longest length in each bucket (0: none)."""

    @property
    def buckets(self) -> int:
        return self.best.shape[1] - 1

    @classmethod
    def of(cls, types: dict[PipelineLayout, CostModel], samples: Sequence[Sample], world: int) -> Table:
        lengths = tokens_array(samples).astype(np.int64)
        step = max(1, math.ceil(int(lengths.max()) / BUCKETS))
        bucket = (lengths - 1) // step + 1  # 1..B
        B = int(bucket.max())
        layouts = list(types)
        sizes = np.array([k.tp * k.pp for k in layouts])
        unit = rank_step(world, int(sizes.min()))
        longest = np.zeros(B + 1, dtype=np.int64)
        np.maximum.at(longest, bucket, lengths)
        interval = [_interval_costs(types[k], k.pp, samples, bucket, B) for k in layouts]
        caps = np.array([types[k].max_tokens(1, 0.0) for k in layouts])
        # top[lo, hi]: the longest length in buckets (lo, hi]
        top = np.maximum.accumulate(np.triu(np.tile(longest, (B + 1, 1)), 1), axis=1)
        counts_n = world // unit + 1
        best = np.full((counts_n, B + 1), np.inf)
        best[0, 0] = 0.0
        trace: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        for n in range(1, counts_n):
            for b in range(1, B + 1):
                for k, size in enumerate(sizes):
                    g, pack = max(1, size // unit), max(1, unit // size)  # steps per pack, replicas per pack
                    if g > n:
                        continue
                    lo = np.arange(b)  # interval (lo, b]
                    holds = caps[k] >= top[lo, b]
                    if not holds.any():
                        continue
                    d = np.arange(1, n // g + 1)[:, None]  # packs
                    before = best[n - d * g, lo[None, :]]
                    value = np.where(holds[None, :], np.maximum(before, interval[k][lo, b][None, :] / (d * pack)),
                                     np.inf)
                    at = np.unravel_index(np.argmin(value), value.shape)
                    if value[at] < best[n, b]:
                        packs = int(d[at[0], 0])
                        best[n, b] = value[at]
                        trace[n, b] = (k, packs * pack, int(lo[at[1]]), n - packs * g)
        return cls(layouts, unit, best, trace, longest)

    def strategy(self, b: int) -> Strategy:
        """The strategy of T[world][b]'s plan: its replicas, the largest blocks first (then TP first)."""
        pipelines: list[PipelineLayout] = []
        n = self.best.shape[0] - 1
        while b > 0:
            k, d, lo, n = self.trace[n, b]
            pipelines += [self.layouts[k]] * d
            b = lo
        return Strategy(tuple(sorted(pipelines, key=lambda p: (-p.tp * p.pp, -p.tp))))


def rank_step(world: int, smallest: int) -> int:
    """The table's step in ranks (module docstring): `smallest` (a type's size, a power of two
    dividing `world`) or the least power of two of at least world / COUNTS, as far as it divides
    `world`."""
    coarse = math.gcd(world, 1 << (math.ceil(world / COUNTS) - 1).bit_length())
    return max(smallest, coarse)


def auto_strategies(spec: str, shape: ModelShape, cluster: Cluster, device_memory_gb: float | None,
                    samples: Sequence[Sample]) -> tuple[Strategy, ...]:
    """`--strategy auto`: the pool for the histogram of `samples` on `cluster`."""
    return tuple(propose(pipeline_types(spec, shape, cluster, device_memory_gb), samples, cluster.world_size))


def _interval_costs(cost: CostModel, stages: int, samples: Sequence[Sample], bucket: np.ndarray, B: int
                    ) -> np.ndarray:
    """C[lo, hi]: a replica's seconds on every sample in buckets (lo, hi] (module docstring)."""
    seconds = cost.work(tokens_array(samples), cost.units(samples)) / stages + cost.g
    summed = np.zeros(B + 1)
    np.add.at(summed, bucket, seconds)
    worst = np.zeros(B + 1)
    np.maximum.at(worst, bucket, seconds)
    prefix = np.concatenate([[0.0], np.cumsum(summed[1:])])
    lo, hi = np.meshgrid(np.arange(B + 1), np.arange(B + 1), indexing="ij")
    tail = np.maximum.accumulate(np.triu(np.tile(worst, (B + 1, 1)), 1), axis=1)
    return np.where(hi > lo, prefix[hi] - prefix[lo] + (stages - 1) * tail, np.inf)
