"""The lower bound against remapped plans (`remapping.bound_terms`): no remapped wave beats it
(exhaustive search on tiny instances), and its `led` term (a long sequence's slot leaves ranks
idle) prices hand-made cases as worked out in their comments."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ballast.pricing import remapping
from ballast.pricing.bounds import lower_bound
from ballast.plans.exhaustive import cluster_for, optimum, remapped_optimum
from ballast.vocabulary.layouts import ANY_SPLIT
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.plans.timeline import step_time

from exhaustive_instances import hand_cost, tiny_instances


@settings(max_examples=25)
@given(tiny_instances(), st.booleans())
def test_no_remapped_wave_beats_the_lower_bound(instance, any_split):
    # Every one-wave plan that is one remap domain, by exhaustive search (each slot at the level
    # it needs), on tiny instances; with any split too, so context-parallel groups hold their
    # gathered K and V in the domain. Remaps that pay are among them: a bound whose `led`
    # charged a remapped sequence 1.3 x its area failed this search within 300 examples.
    cost, lengths = instance
    assume(cost.world_size >= 2)
    cost = cost.under(ANY_SPLIT) if any_split else cost
    lengths = lengths[:4]
    # relative 1e-9: the bound and the timeline add the same terms in different orders
    assert lower_bound(cost, lengths) <= remapped_optimum(cost, lengths) * (1 + 1e-9)


def _two_ranks_at_most(a: float):
    """A round cost on 4 ranks whose 2 heads stop Ulysses at degree 2 (a remap domain may still
    spread linear work over all 4): 1000 tokens fit a device without recomputation, b = 1e-3,
    r = 1, k = 0.1, 4 layers, g = 0 and all-to-alls all but free."""
    return hand_cost(a=a, b=1e-3, g=0.0, heads=2, kv_heads=2, bytes_per_token=1e-6, states=0.0,
                     device_memory=1000 * 1e5, layers=4, recompute=1.0, kept=0.1, bandwidth={2: 1e12, 4: 1e12})


def test_a_remap_that_leaves_ranks_idle_is_charged_for_them():
    # Four sequences of 4000 tokens, attention-heavy (a s^2 = 16 s beside b s = 4 s). Alone:
    # degree 1 recomputes every layer, 40 s; degree 2 holds 2000 a rank and recomputes 3/4 of
    # the layers (2000 (0.75 k + 0.25) = 650 <= 1000 tokens), 20 x 1.75 / 2 = 17.5 s, 35
    # device-seconds; the best plan runs two waves of two such groups, 35 s (exhaustive search).
    cost = _two_ranks_at_most(1e-6)
    lengths = [4000] * 4
    assert optimum(cost, lengths) == pytest.approx(35.0, rel=1e-9)
    # The old relaxation: in a domain of 4 at level 1/4 the group's ranks keep 4/17 of 2000 for
    # attention and a balanced share of at most (1000 - 0.75 4/17 2000) / (0.75 13/17 + 0.025)
    # = 1081 >= 4000 / 4 beside it, and its area was its group's attention and its linear work,
    # 16 x 1.25 + 4 x 1.25 = 25 device-seconds: a bound of 4 x 25 / 4 = 25 s.
    s, q = np.asarray(lengths, dtype=np.float64), cost.units(lengths)
    others = (35.0 - 4.0) / 4000  # what any sequence takes per token beyond b s, at its best degree
    _, area, led = remapping.bound_terms(cost, s, q, others)
    assert area[1] == pytest.approx([25.0] * 4, rel=1e-9)
    # led: that slot lasts 16 x 1.25 / 2 = 10 s on all 4 ranks, and beside its 4000 tokens the
    # domain holds at most 4 x 1081 - 4000 = 324 others, charged `others` each: 40 + 5 - 324 x
    # 0.00775 = 42.5 device-seconds. Its least over sizes and levels: level 1/2, a balanced
    # share of at most (1000 - 0.5 4/17 2000) / (0.5 13/17 + 0.05) = 1768.7 tokens,
    # 4 x 16 x 1.5 / 2 + 4 x 1.5 - (4 x 1768.7 - 4000) 0.00775 = 30.17 device-seconds.
    most = (1000 - 0.5 * 4 / 17 * 2000) / (0.5 * 13 / 17 + 0.05)
    filled = 4 * 12 + 6 - (4 * most - 4000) * others
    assert led[1] == pytest.approx([filled] * 4, rel=1e-9)
    assert lower_bound(cost, lengths) == pytest.approx(filled, rel=1e-6)  # was 25 s
    assert 25.0 < filled < 35.0


def test_a_remap_that_saves_is_still_allowed():
    # Linear-heavy (a s^2 = 0.16 s beside b s = 4 s): the 4000 tokens recompute 3/4 of the layers
    # on their 2 ranks, 3.64 s, or, remapped over all 4 with two short sequences beside them, run
    # at level 1/4 with their linear work spread: 1.41 s. The bound must let that remap be.
    cost = _two_ranks_at_most(1e-8)
    lengths = [4000, 100, 100]
    assert optimum(cost, lengths) == pytest.approx(3.64, rel=1e-9)
    plan = Plan(lengths, [Wave([Group(0, 2, [MicroBatch([0])]), Group(2, 1, [MicroBatch([1])]),
                                Group(3, 1, [MicroBatch([2])])], [(0, 4)])])
    plan.waves[0].groups = plan.leveled(0, (0, 4), cost)
    plan.validate(cluster_for(cost), cost)
    # slot: 0.16 x 1.25 / 2 attention + 4.2 x 1.25 / 4 linear, moved tokens all but free
    assert step_time(plan, cost) == pytest.approx(0.1 + 5.25 / 4, rel=1e-6)
    assert lower_bound(cost, lengths) <= step_time(plan, cost) * (1 + 1e-9)


def test_the_remap_layers_own_overhead_is_priced_per_slot():
    # The plan above with the layer's overhead profiled: 0.05 s a slot and 1e-4 s per token of a
    # rank's balanced share (4200 / 4 = 1050), both x (1 + 1/4 x 1/2) at level 1/4 (a recomputed
    # block repeats its forward exchanges): 0.155 x 1.125 on top of the slot.
    cost = dataclasses.replace(_two_ranks_at_most(1e-8), remap_latency=0.05, remap_per_token=1e-4)
    lengths = [4000, 100, 100]
    plan = Plan(lengths, [Wave([Group(0, 2, [MicroBatch([0])]), Group(2, 1, [MicroBatch([1])]),
                                Group(3, 1, [MicroBatch([2])])], [(0, 4)])])
    plan.waves[0].groups = plan.leveled(0, (0, 4), cost)
    assert step_time(plan, cost) == pytest.approx(0.1 + 5.25 / 4 + 0.155 * 1.125, rel=1e-6)
    # The bound leaves the overhead out: still below.
    assert lower_bound(cost, lengths) <= step_time(plan, cost)
