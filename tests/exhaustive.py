"""Exhaustive search for tiny instances, shared by the simulator's and the planners' tests.

`brute_force` finds the fastest one-wave plan over every aligned group layout, every
assignment of sequences to groups and every packing into micro-batches (each at its least
fitting checkpoint level); `tiny_instances` draws cost models and batches small enough for it,
`tiny_shaped_instances` the same with video clips under every attention pattern. Batches are
lists of samples (`ballast.samples`): lengths or (frames, height, width) clips.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from hypothesis import strategies as st

from ballast.cluster import Cluster
from ballast.cost import CostModel
from ballast.plans import Group, MicroBatch, Plan, Wave
from ballast.samples import is_shaped, tokens


def hand_cost(**change) -> CostModel:
    """Round coefficients, so micro-batch times can be worked out by hand:
    time = (1e-6 sum s^2 + 1e-3 sum s)(1 + 0.5 c) / d + 1000 sum s / (d bw(d)) + 0.01."""
    fields = dict(source="test", model="toy", a=1e-6, b=1e-3, g=0.01, bandwidth={2: 1e9, 4: 5e8},
                  bytes_per_token=1000.0, act_per_token=1e5, states=1e8, device_memory=1.1e9,
                  layers=4, heads=8, kv_heads=4, world_size=4, recompute=0.5, kept=0.1)
    return CostModel(**{**fields, **change})



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
    them, over every split into micro-batches, each at its least fitting checkpoint level."""
    n = len(lengths)
    single = [np.inf] * (1 << n)
    for mask in range(1, 1 << n):
        seqs = [lengths[i] for i in range(n) if mask >> i & 1]
        c = cost.min_checkpoint(sum(map(tokens, seqs)), degree)
        if c is not None and degree in cost.degrees:
            single[mask] = cost.time(seqs, degree, c)
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
        split, mbs = tables[d][1], []
        while mask:
            ids = [i for i in range(n) if split[mask] >> i & 1]
            mbs.append(MicroBatch(ids, cost.min_checkpoint(sum(tokens(lengths[i]) for i in ids), d)))
            mask ^= split[mask]
        groups.append(Group(start, d, mbs))
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


@st.composite
def tiny_instances(draw):
    world = draw(st.sampled_from([1, 2, 4]))
    kept = draw(st.sampled_from([0.1, 0.5]))
    cap = draw(st.integers(200, 6000))                 # tokens per device without checkpointing
    cost = hand_cost(
        world_size=world, kept=kept, layers=draw(st.sampled_from([1, 2, 4])),
        a=draw(st.sampled_from([1e-9, 1e-7, 1e-6, 1e-5])), b=draw(st.sampled_from([1e-5, 1e-4, 1e-3])),
        g=draw(st.sampled_from([0.0, 1e-3, 0.05, 0.5])), recompute=draw(st.sampled_from([0.0, 1 / 3, 1.0])),
        recompute_attention=draw(st.sampled_from([None, 0.1, 1.0])),  # None: docs/design.md's single r
        heads=draw(st.sampled_from([2, 8])), kv_heads=2, states=0.0, device_memory=cap * 1e5,
        bandwidth={d: draw(st.sampled_from([1e6, 1e8, 1e10])) for d in (2, 4) if d <= world},
        bytes_per_token=draw(st.sampled_from([10.0, 1e3, 1e5])))
    limit = cost.max_tokens(cost.degrees[-1], 1.0)
    lengths = draw(st.lists(st.integers(1, limit), min_size=1, max_size=6))
    return cost, lengths


@st.composite
def tiny_shaped_instances(draw):
    """`tiny_instances` whose batches hold clips (frames, height, width) of up to a few hundred
    tokens beside text, under a causal, full or spatial-temporal pattern: the attention work of
    two samples of equal tokens differs, which the bound and the planners must see."""
    cost, lengths = draw(tiny_instances())
    pattern = draw(st.sampled_from(["causal", "full", "spatial-temporal"]))
    cost = dataclasses.replace(cost, attention=pattern, spatial_share=draw(st.sampled_from([0.5, 0.2, 0.9])))
    limit = cost.max_tokens(cost.degrees[-1], 1.0)
    samples = []
    for s in lengths:
        frames, height = draw(st.integers(1, 5)), draw(st.integers(1, 5))
        width = max(1, s // (frames * height))
        clip = draw(st.booleans()) and frames * height * width <= limit
        samples.append((frames, height, width) if clip else s)
    return cost, samples
