"""Bounds on a step's time under a cost model: what no plan can beat (docs/design.md, section 5).

`CostModel.lower_bound` and `CostModel.longest_alone` call these. They price samples the way
`cost.py` and `timeline.py` do, so a bound holds for every plan the simulator prices,
remapped ones included (`remapped`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .samples import Sample, tokens as sample_tokens

if TYPE_CHECKING:
    from .cost import CostModel


def longest_alone(cost: CostModel, samples: Sequence[Sample]) -> float:
    """The slowest sample alone at its best degree (least checkpointing) plus g: no plan
    without remapping ends the step sooner. The lower bound may sit below it, since a remap
    domain may spread a sample's linear work wider than its group."""
    return float(np.min(cost.sequence_times(samples), axis=0).max()) + cost.g if len(samples) else 0.0


def remapped(cost: CostModel, s: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alone, area), each [degree index, sequence]: the least time without g of a remap slot
    holding a sequence of s tokens and q attention units in a group of each degree, and the
    least device-seconds that sequence takes of it (inf where no slot holds it; area inf also
    where a remap cannot take less than the sequence's group alone).

    In a domain of `size` ranks at the slot's level L the sequence's group runs its attention
    and all-to-alls (a q (1 + L r_attn) / d + comm), the domain at least its linear work
    (b s (1 + L r) / size), and the group's ranks hold at least s / d tokens for attention.
    Memory (`CostModel.remap_memory`) then caps the balanced share a rank can hold beside them,
    `most`; a slot's share is at least s / size, and the timeline moves at least s / d - most
    tokens off each of the group's ranks (`timeline.remap_slots`). The group's d ranks spend
    the attention and that move on this sequence alone, and its linear work is done somewhere:
    the area. A sequence that fits its group without checkpointing needs no move at L = 0, so
    its least slot spreads the linear work over the whole cluster and its area is its own."""
    from .cost import ATTENTION_SHARE

    n = cost.world_size
    sizes = sorted({n, *(1 << i for i in range(1, n.bit_length()))} - {1})  # domains: 2+ ranks
    free = (cost.device_memory - cost.states) / cost.act_per_token
    levels = np.arange(cost.layers + 1)[:, None] / cost.layers
    alone = np.full((len(cost.degrees), len(s)), np.inf)
    area = np.full_like(alone, np.inf)
    attention = cost.attention_time(s, q)
    for i, d in enumerate(cost.degrees):
        # Summed in the order the bound always had, so that unremapped results stay bit-identical.
        comm = cost.exchange_bytes(d) * s / cost.bandwidth[d] / d if d > 1 else np.zeros_like(s)
        alone[i] = attention / d + comm + cost.b * s / n
        tight = np.flatnonzero(s / d > free)
        if not len(tight):
            continue
        held = s[tight] / d
        most = ((free - (1.0 - levels) * ATTENTION_SHARE * held)
                / ((1.0 - levels) * (1.0 - ATTENTION_SHARE) + levels * cost.kept))
        group = attention[tight] * (1.0 + levels * cost.recompute_attention) / d + comm[tight]
        linear = cost.b * s[tight] * (1.0 + levels * cost.recompute)
        slot, used = np.full(len(tight), np.inf), np.full(len(tight), np.inf)
        for size in sizes:
            if size < d:
                continue
            moved = np.maximum(held - most, 0.0) * cost.bytes_per_token / cost.remap_bandwidth(size)
            fits = most >= s[tight] / size
            slot = np.minimum(slot, np.where(fits, group + linear / size + moved, np.inf).min(axis=0))
            used = np.minimum(used, np.where(fits, d * (group + moved) + linear, np.inf).min(axis=0))
        alone[i, tight], area[i, tight] = slot, used
    return alone, area


def lower_bound(cost: CostModel, samples: Sequence[Sample]) -> float:
    """No plan's step time can be below this: the least T that passes three bounds.

    longest: max_k min_d alone(s_k, d) + g -- a sequence is never faster than alone, where
             alone is time() in its group or a remap slot's (`remapped`).
    area:    sum_k min_d d time(s_k, d) / N + g -- docs/design.md's bound, with g counted once
             because sequences packed into one micro-batch share it (busy ranks B <= N each
             pay at least one g, so makespan >= (work + B g) / B >= work / N + g); a
             sequence's device-seconds in its group, or in a remap slot (`remapped`).
    memory:  the area bound without its per-sequence checkpointing, plus the least
             overhead that memory forces on a rank that holds x tokens per device.
             A micro-batch of y tokens per device recomputes at least (y - cap) / (1 - k)
             of them (cap = what fits without checkpointing), each costing at least r b
             (a token of a sequence s costs r b + r_attn a s), or the
             rank splits its tokens over more micro-batches, each costing g. Relaxing the
             micro-batch count to a real number, the least overhead is
             F(x) = g + (x - cap)+ min(r b / (1 - k), g / cap), convex and increasing, so
             by Jensen the busiest rank pays at least F(total tokens / N).
    In a plan of makespan T a sequence runs at a degree where it alone takes at most T, so
    the minima above may range over those degrees only. Both sides then depend on T: the
    bound is the least T with T >= max(longest, area(T), memory(T)), found by bisection
    (the right side never grows with T). docs/design.md's plain area term ignores memory and
    this coupling; with FlexSP's published g they are worth 5-10% of a step.
    """
    if len(samples) == 0:
        return 0.0
    cost.check_fits(samples)
    s = np.fromiter(map(sample_tokens, samples), dtype=np.float64, count=len(samples))
    q = cost.units(samples)
    n = cost.world_size
    times = cost.sequence_times(samples)
    remapped_alone, remapped_area = remapped(cost, s, q)
    degrees = np.asarray(cost.degrees, dtype=np.float64)[:, None]
    # A remap domain may hold a sequence with less recomputation than its group alone.
    area_at = np.minimum(times * degrees, remapped_area)
    comm_area = np.zeros_like(times)
    for i, d in enumerate(cost.degrees[1:], start=1):
        comm_area[i] = cost.exchange_bytes(d) * s / cost.bandwidth[d]
    cap = (cost.device_memory - cost.states) / cost.act_per_token
    slope = min(cost.recompute * cost.b / (1.0 - cost.kept), cost.g / cap)
    overhead = cost.g + max(0.0, float(s.sum()) / n - cap) * slope
    alone = np.minimum(times, remapped_alone)
    # Where a sequence fits at all: its group alone, or a remap slot (which may hold it where
    # its group cannot).
    memory_at = np.where(np.isfinite(alone), cost.attention_time(s, q) + cost.b * s + comm_area, np.inf)
    longest = float(np.min(alone, axis=0).max()) + cost.g

    def bound(target: float) -> float:
        allowed = alone + cost.g <= target
        area = float(np.min(np.where(allowed, area_at, np.inf), axis=0).sum()) / n + cost.g
        memory = float(np.min(np.where(allowed, memory_at, np.inf), axis=0).sum()) / n + overhead
        return max(longest, area, memory)

    low = bound(math.inf)
    high = bound(low)
    if high <= low:
        return low
    # Below `low` no T passes; `high` passes (the right side only falls as T grows).
    while high - low > 1e-6 * high:
        mid = 0.5 * (low + high)
        if bound(mid) <= mid:
            high = mid
        else:
            low = mid
    return low
