"""Packing helpers shared by planners: sequences into micro-batches, micro-batches onto groups."""
from __future__ import annotations

import bisect
import heapq
from typing import Sequence

from ..pricing.cost import CostModel
from ..plans.plan import Group, MicroBatch, Wave, fill_idle
from ..vocabulary.samples import SampleBatch


def best_fit_decreasing(seq_ids: Sequence[int], lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of sequence ids, each holding at most `capacity` tokens, by best-fit decreasing."""
    order = sorted(seq_ids, key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    # free_keys is sorted (free tokens, bin index): the best fit is the first bin with enough room.
    free_keys: list[tuple[int, int]] = []
    for i in order:
        s = lengths[i]
        assert s <= capacity, f"sequence {i} of {s} tokens exceeds the bin capacity {capacity}"
        pos = bisect.bisect_left(free_keys, (s, -1))
        if pos < len(free_keys):
            free, b = free_keys.pop(pos)
        else:
            free, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        bisect.insort(free_keys, (free - s, b))
    return bins


def micro_batch(seq_ids: list[int], lengths: Sequence[int], degree: int, cost: CostModel,
                recompute: float | None = None) -> MicroBatch:
    """A micro-batch at the given recompute level, or the least level at which it fits."""
    if recompute is None:
        recompute = cost.min_recompute(sum(lengths[i] for i in seq_ids), degree)
        assert recompute is not None, f"micro-batch {seq_ids} does not fit at degree {degree}"
    return MicroBatch(list(seq_ids), recompute)


def mb_time(mb: MicroBatch, batch: SampleBatch, degree: int, cost: CostModel) -> float:
    s = sum(batch.lengths[i] for i in mb.seq_ids)
    return cost.time_from_sums(batch.units_of(mb.seq_ids), s, degree, mb.recompute, samples=len(mb.seq_ids))


def longest_processing_time(times: Sequence[float], bins: int) -> list[list[int]]:
    """Indices of `times` spread over `bins` by LPT: longest first onto the least-loaded bin."""
    heap = [(0.0, b) for b in range(bins)]
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(range(len(times)), key=lambda i: -times[i]):
        load, b = heapq.heappop(heap)
        out[b].append(i)
        heapq.heappush(heap, (load + times[i], b))
    return out


def deal_by_time(micro_batches: list[MicroBatch], batch: SampleBatch, degree: int,
                 cost: CostModel, groups: int) -> list[list[MicroBatch]]:
    """Micro-batches spread over `groups` equal groups by LPT on their time."""
    times = [mb_time(mb, batch, degree, cost) for mb in micro_batches]
    return [[micro_batches[i] for i in idx] for idx in longest_processing_time(times, groups)]


def lockstep_wave(per_group: list[list[MicroBatch]], batch: SampleBatch, degree: int,
                  cost: CostModel, world_size: int) -> Wave:
    """One lockstep wave: group g (ranks g*degree...) runs per_group[g], padded to equal counts.

    Each group's micro-batches run longest first, so that under the per-index
    synchronisation of lockstep the slow ones line up instead of waiting on each other.
    """
    depth = max(len(mbs) for mbs in per_group)
    groups = []
    for g, mbs in enumerate(per_group):
        mbs = sorted(mbs, key=lambda mb: -mb_time(mb, batch, degree, cost))
        groups.append(Group(g * degree, degree, mbs + [MicroBatch([], 0.0) for _ in range(depth - len(mbs))]))
    return Wave(fill_idle(groups, world_size))


def fixed_run(cost: CostModel, lengths: Sequence[int], max_len: int | None,
              degree: int | None = None, at_least: int = 1) -> tuple[int, int, float]:
    """(max_len, SP degree, recompute level) of a run whose layout is fixed in advance.

    The degree is the given one or the smallest from `at_least` up that holds `max_len`; the
    recompute level is the least at which `max_len` fits that degree, set once for the run as
    users of static frameworks set it.
    """
    max_len = max_len or max(lengths)
    longest = max(lengths)
    if longest > max_len:
        raise ValueError(f"sequence {list(lengths).index(longest)} has {longest} tokens, more than "
                         f"max_len {max_len}")
    degree = degree or cost.min_degree(max_len, at_least)
    if degree is None:
        raise ValueError(f"max_len {max_len} fits no SP degree from {at_least} up to {cost.degrees[-1]}")
    assert degree in cost.degrees, (degree, cost.degrees)  # a forced degree: Planner checked it
    return max_len, degree, fixed_recompute(cost, max_len, degree)


def fixed_recompute(cost: CostModel, max_len: int, degree: int) -> float:
    """The least recompute level, set once for a run, at which `max_len` tokens fit `degree`
    at the split the planner's rule gives it (`SplitCatalogue.split`)."""
    cp = cost.catalogue.split(degree)
    level = cost.min_recompute(max_len, degree, cp)
    if level is None:
        split = f" (Ulysses {degree // cp} x CP {cp})" if cp > 1 else ""
        raise ValueError(f"a {max_len}-token sequence (--max-len) does not fit SP degree {degree}{split} even with "
                         f"full recomputation (at most {cost.max_tokens(degree, 1.0, cp)} tokens at "
                         f"{cost.device_memory / 1e9:.3g} GB per device): raise --degree or "
                         f"--device-memory-gb, or lower --max-len")
    return level


def pad_lockstep(wave: Wave, batch: SampleBatch, cost: CostModel) -> Wave:
    """The wave made lockstep: every group runs its micro-batches longest first, padded with
    empty ones to the wave's largest count (groups may have different degrees)."""
    depth = max((len(g.micro_batches) for g in wave.groups), default=0)
    groups = []
    for g in wave.groups:
        mbs = sorted(g.micro_batches, key=lambda mb: -mb_time(mb, batch, g.degree, cost))
        groups.append(Group(g.start, g.degree, mbs + [MicroBatch([], 0.0) for _ in range(depth - len(mbs))], g.cp))
    return Wave(groups, list(wave.remap), wave.routed)
