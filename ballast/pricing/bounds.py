"""Bounds on a step's time under a cost model: what no plan can beat (docs/design.md, section 5).

They price samples the way `cost.py`, `remapping.py` and `timeline.py` do, so a bound holds
for every plan the simulator prices, remapped ones included (`remapping.bound_terms`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .cost import CostModel, tokens_array
from .fits import check_fits
from ..vocabulary.layouts import ANY_SPLIT
from .remapping import bound_terms
from ..vocabulary.samples import Sample
from .sequence_times import sequence_times


def uncapped_lower_bound(cost: CostModel, samples: Sequence[Sample]) -> float:
    """`lower_bound` over every split of every degree (Ulysses x CP): what reports compare plans to."""
    return lower_bound(cost.under(ANY_SPLIT), samples)


def longest_alone(cost: CostModel, samples: Sequence[Sample]) -> float:
    """The slowest sample alone at its best degree and split (least recomputation) plus g: no plan
    without remapping ends the step sooner. The lower bound may sit below it, since a remap
    domain may spread a sample's linear work wider than its group."""
    if not len(samples):
        return 0.0
    return float(np.min(sequence_times(cost.under(ANY_SPLIT), samples, every_split=True), axis=0).max()) + cost.g


def lower_bound(cost: CostModel, samples: Sequence[Sample]) -> float:
    """No plan's step time can be below this: the least T that passes four bounds. Plans of
    every split `cost.splits` allows count (each term takes the least over them): a planner
    bounds its own plans with its own model; reports pass `cost.under(ANY_SPLIT)`, the bound of
    every plan the hardware allows, whatever the heads.

    longest: max_k min_d alone(s_k, d) + g -- a sequence is never faster than alone, where
             alone is time() in its group or a remap slot's (`remapping.bound_terms`).
    area:    sum_k min_d d time(s_k, d) / N + g -- docs/design.md's bound, with g counted once
             because sequences packed into one micro-batch share it (busy ranks B <= N each
             pay at least one g, so makespan >= (work + B g) / B >= work / N + g); a
             sequence's device-seconds in its group, or in a remap slot (`remapping.bound_terms`).
    memory:  the area bound without its per-sequence recomputation, plus the least
             overhead that memory forces on a rank that holds x tokens per device.
             A micro-batch of y tokens per device recomputes at least (y - cap) / (1 - k)
             of them (cap = what fits without recomputation), each costing at least r b
             (a token of a sequence s costs r b + r_attn a s), or the
             rank splits its tokens over more micro-batches, each costing g. Relaxing the
             micro-batch count to a real number, the least overhead is
             F(x) = g + (x - cap)+ min(r b / (1 - k), g / cap), convex and increasing, so
             by Jensen the busiest rank pays at least F(total tokens / N).
    led:     the area bound, uncoupled from T (below), with a sequence that saves in a remap slot
             charged the ranks that slot leaves idle (`remapping.bound_terms`): a domain that
             spares a long sequence's group memory holds few other tokens beside it, too few
             to keep its other ranks busy while that group's attention runs.
    In a plan of makespan T a sequence runs at a degree where it alone takes at most T, so
    the minima above may range over those degrees only. Both sides then depend on T: the
    bound is the least T with T >= max(longest, area(T), memory(T), led), found by bisection
    (the right side never grows with T). docs/design.md's plain area term ignores memory and
    this coupling; with FlexSP's published g they are worth 5-10% of a step.
    """
    if len(samples) == 0:
        return 0.0
    check_fits(cost, samples)
    return bound_of(cost, tokens_array(samples), cost.units(samples), sequence_times(cost, samples, every_split=True))


def bound_of(cost: CostModel, s: np.ndarray, q: np.ndarray, times: np.ndarray) -> float:
    """`lower_bound` of samples that fit, given their tokens `s`, attention units `q` and times
    alone (`sequence_times(cost, ..., every_split=True)`): these are per sample, so a planner that
    holds them for its batch bounds any part of it by slicing, without pricing the part afresh."""
    if len(s) == 0:
        return 0.0
    n = cost.world_size
    degrees = np.asarray(cost.degrees, dtype=np.float64)[:, None]
    # The most device-seconds per token, beyond its linear work, any sequence takes in its group
    # at its least-area degree: what a remap slot's other sequences are charged at most (led).
    others = float(np.max((np.min(times * degrees, axis=0) - cost.b * s) / s))
    remapped_alone, remapped_area, remapped_led = bound_terms(cost, s, q, others)
    # A remap domain may hold a sequence with less recomputation than its group alone.
    area_at = np.minimum(times * degrees, remapped_area)
    led = float(np.min(np.minimum(times * degrees, remapped_led), axis=0).sum()) / n + cost.g
    comm_area = np.zeros_like(times)
    for i, d in enumerate(cost.degrees[1:], start=1):
        comm_area[i] = d * np.min([cost.exchange_seconds(s, d, cp) for cp in cost.catalogue.context_parts(d)], axis=0)
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
        return max(longest, area, memory, led)

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
