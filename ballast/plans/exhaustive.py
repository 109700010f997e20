"""The exact optimum of tiny instances (<= 4 ranks, <= 6 sequences), by exhaustive search: the
reference the lower bound (`bounds.py`) stays below and the planners are measured against (the
tests, bench/optimum_gap.py).

`brute_force` finds the fastest one-wave plan over every aligned group layout, every
assignment of sequences to groups and every packing into micro-batches (each at its least
fitting recompute level); `optimum` the fastest step with any number of waves. Neither
remaps; `remapped_optimum` is the fastest one wave that is one remap domain, priced by the
timeline. `pipeline_optimum` is the fastest one-wave plan of a pipeline (the cost model's
stages), where the micro-batches' order counts too. Batches are lists of samples (`samples.py`):
lengths or (frames, height, width) clips.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

from ..vocabulary.cluster import Cluster
from ..pricing.cost import CostModel
from .plan import Group, MicroBatch, Plan, Wave, fill_idle
from ..vocabulary.samples import is_shaped, tokens
from .timeline import step_time


def cluster_for(cost: CostModel) -> Cluster:
    """A one-node cluster matching a hand-made cost model (validate needs one)."""
    n = cost.world_size
    return Cluster("toy", 1, n, cost.device_memory, 1e12, 1.0,
                   {d: cost.bandwidth.get(d, 1.0) for d in (2, 4, 8) if d <= n}, 0.0)


def layouts(n: int, start: int = 0):
    """Every list of aligned power-of-two blocks (start, size) that tiles ranks start..n-1."""
    if start == n:
        yield []
        return
    d = 1
    while start % d == 0 and start + d <= n:
        for rest in layouts(n, start + d):
            yield [(start, d), *rest]
        d *= 2


def best_group_times(cost: CostModel, lengths: list, degree: int):
    """For every subset (bitmask) of sequences: the least time a group of `degree` needs to run
    them, over every (Ulysses x CP) split the cost's rule allows and every packing into
    micro-batches, each at its least fitting recompute level; and the packing and split."""
    tables = [(_split_times(cost, lengths, degree, cp), cp) for cp in cost.catalogue.context_parts(degree)]
    if not tables:
        return [0.0] + [np.inf] * ((1 << len(lengths)) - 1), [0] * (1 << len(lengths)), [1] * (1 << len(lengths))
    best = [min(range(len(tables)), key=lambda k: tables[k][0][0][mask]) for mask in range(1 << len(lengths))]
    return ([tables[k][0][0][mask] for mask, k in enumerate(best)],
            [tables[k][0][1][mask] for mask, k in enumerate(best)],
            [tables[k][1] for k in best])


def _split_times(cost: CostModel, lengths: list, degree: int, cp: int):
    """best_group_times at one split."""
    n = len(lengths)
    single = [np.inf] * (1 << n)
    for mask in range(1, 1 << n):
        seqs = [lengths[i] for i in range(n) if mask >> i & 1]
        c = cost.min_recompute(sum(map(tokens, seqs)), degree, cp)
        if c is not None:
            single[mask] = cost.time(seqs, degree, c, cp)
    best, split = [0.0] * (1 << n), [0] * (1 << n)
    for mask in range(1, 1 << n):
        low = mask & -mask
        best[mask] = np.inf
        sub = mask
        while sub:                               # every micro-batch holding the lowest sequence
            if sub & low and single[sub] + best[mask ^ sub] < best[mask]:
                best[mask], split[mask] = single[sub] + best[mask ^ sub], sub
            sub = (sub - 1) & mask
    return best, split


def brute_force(cost: CostModel, lengths: list[int]) -> tuple[float, Plan]:
    """The fastest one-wave plan: every group layout, every assignment of sequences to groups,
    every packing into micro-batches."""
    n, world = len(lengths), cost.world_size
    tables = {d: best_group_times(cost, lengths, d) for d in (1, 2, 4, 8) if d <= world}
    best_time, best_plan = np.inf, None
    for layout in layouts(world):
        for assign in itertools.product(range(len(layout)), repeat=n):
            masks = [0] * len(layout)
            for i, g in enumerate(assign):
                masks[g] |= 1 << i
            t = max(tables[d][0][m] for (_, d), m in zip(layout, masks))
            if t < best_time:
                best_time, best_plan = t, (layout, masks)
    layout, masks = best_plan
    groups = []
    for (start, d), mask in zip(layout, masks):
        split, mbs, cp = tables[d][1], [], tables[d][2][mask]
        while mask:
            ids = [i for i in range(n) if split[mask] >> i & 1]
            mbs.append(MicroBatch(ids, cost.min_recompute(sum(tokens(lengths[i]) for i in ids), d, cp)))
            mask ^= split[mask]
        groups.append(Group(start, d, mbs, cp))
    return best_time, Plan(list(map(tokens, lengths)), [Wave(groups)],
                           shapes=list(lengths) if is_shaped(lengths) else None)


def submasks(mask: int):
    """Every subset of `mask`, itself and the empty one included."""
    sub = mask
    while True:
        yield sub
        if sub == 0:
            return
        sub = (sub - 1) & mask


def one_wave_optimum(cost: CostModel, lengths: list[int]) -> list[float]:
    """For every subset (bitmask) of sequences: the least time of one wave running exactly them,
    over every group layout, assignment and packing (a min-max over the layout's groups, so it
    runs in 3^n per group instead of brute_force's layouts x groups^n)."""
    n, world = len(lengths), cost.world_size
    tables = {d: best_group_times(cost, lengths, d)[0] for d in (1, 2, 4, 8) if d <= world}
    best = [np.inf] * (1 << n)
    for layout in layouts(world):
        reach = [0.0] + [np.inf] * ((1 << n) - 1)   # groups so far running exactly `mask`
        for _, d in layout:
            reach = [min(max(tables[d][sub], reach[mask ^ sub]) for sub in submasks(mask))
                     for mask in range(1 << n)]
        best = [min(b, r) for b, r in zip(best, reach)]
    return best


def optimum(cost: CostModel, lengths: list[int]) -> float:
    """The fastest plan with any number of waves (none remapped): waves run one after another,
    so the step is the cheapest split of the batch into subsets, each run as its best wave."""
    wave = one_wave_optimum(cost, lengths)
    best = [0.0] + [np.inf] * ((1 << len(lengths)) - 1)
    for mask in range(1, len(best)):
        low = mask & -mask
        best[mask] = min(wave[sub] + best[mask ^ sub] for sub in submasks(mask) if sub & low)
    return best[-1]


def packings(ids: list[int]):
    """Every way to run `ids` as micro-batches: each partition into non-empty blocks, in every order."""
    for labels in itertools.product(range(len(ids)), repeat=len(ids)):
        used = sorted(set(labels))
        if used == list(range(len(used))):  # each partition once per order of its blocks
            yield [[i for i, label in zip(ids, labels) if label == k] for k in used]


def remapped_optimum(cost: CostModel, lengths: list) -> float:
    """The fastest one-wave plan whose wave is one remap domain over the whole cluster: every
    group layout, assignment, packing (its order decides the slots) and split, each slot at
    the least level it fits (`Plan.leveled`); inf if none fits. The reference the bound's remap
    terms are checked against (2 ranks or more; a few sequences: it is exponential twice)."""
    n, world = len(lengths), cost.world_size
    assert world >= 2, "a remap domain needs 2 ranks"
    best = np.inf
    for layout in layouts(world):
        splits = [cost.catalogue.context_parts(d) if d > 1 else [1] for _, d in layout]
        for assign in itertools.product(range(len(layout)), repeat=n):
            ids = [[i for i in range(n) if assign[i] == k] for k in range(len(layout))]
            for packed in itertools.product(*(list(packings(i)) for i in ids)):
                for cps in itertools.product(*splits):
                    groups = [Group(start, d, [MicroBatch(b) for b in mbs], cp)
                              for (start, d), mbs, cp in zip(layout, packed, cps)]
                    plan = Plan(list(map(tokens, lengths)), [Wave(groups, [(0, world)])],
                                shapes=list(lengths) if is_shaped(lengths) else None)
                    leveled = plan.leveled(0, (0, world), cost)
                    if leveled is not None:
                        plan.waves[0].groups = leveled
                        best = min(best, step_time(plan, cost))
    return best


def pipeline_optimum(cost: CostModel, lengths: list[int], fitted: CostModel) -> float:
    """The fastest one-wave plan of the cost model's pipeline (`cost.stages`): every group layout,
    assignment, split, packing and order of the micro-batches, each micro-batch at the least level
    the cost model `fitted` fits it at (`cost` for the plans a planner may make, a relaxed one for
    a superset). A wave's groups run on lanes of their own, so each group's best is found alone."""
    n = len(lengths)

    @functools.lru_cache(maxsize=None)
    def group(degree: int, mask: int) -> float:
        ids = [i for i in range(n) if mask >> i & 1]
        best = np.inf
        for cp in cost.catalogue.context_parts(degree) if degree > 1 else [1]:
            for mbs in packings(ids):
                levels = [fitted.min_recompute(sum(tokens(lengths[i]) for i in b), degree, cp) for b in mbs]
                if None not in levels:
                    wave = Wave(fill_idle([Group(0, degree, [MicroBatch(b, c) for b, c in zip(mbs, levels)], cp)],
                                          cost.world_size))
                    best = min(best, step_time(Plan(list(map(tokens, lengths)), [wave]), cost))
        return best

    best = np.inf
    for layout in layouts(cost.world_size):
        for assign in itertools.product(range(len(layout)), repeat=n):
            masks = [sum(1 << i for i, g in enumerate(assign) if g == k) for k in range(len(layout))]
            best = min(best, max(group(d, m) if m else 0.0 for (_, d), m in zip(layout, masks)))
    return best
