"""The timeline's NIC terms (ballast/nics.py through ballast/timeline.py) on hand-made plans over
the cpu preset's 2 emulated nodes of 2 ranks, each rank under its own NIC, by hand."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import get_model_shape
from ballast.pricing.nics import link_rate
from ballast.plans.plan import Group, MicroBatch, Plan, PlanError, Wave
from ballast.plans.timeline import nic_bytes, simulate, step_time

EXACT = 1e-12  # relative: a few float terms; the hand values follow the same formulas
TWO_NODES = get_cluster("cpu", world_size=4, nodes=2)
COST = analytic_cost(get_model_shape("tiny"), TWO_NODES)
ONE_NODE = dataclasses.replace(COST, network=get_cluster("cpu", world_size=4))


def _plan(wave: Wave) -> Plan:
    return Plan([400, 100, 100], [wave])


def test_a_group_across_the_nodes_pays_only_the_hand_offs_when_routed():
    wave = Wave([Group(0, 4, [MicroBatch([0, 1, 2])])])
    unrouted = step_time(_plan(wave), COST)
    # One rank per NIC: the NICs are evenly loaded, the price is the degree's bandwidth alone.
    assert unrouted == step_time(_plan(wave), ONE_NODE)
    routed = step_time(_plan(dataclasses.replace(wave, routed=True)), COST)
    # Routed: each rank sends half its payload across, hands half of that to its node's other
    # rank, takes as much as its proxy, and the far side combines as much again.
    payload = COST.exchange_bytes(4) * 600 / 4
    assert routed - unrouted == pytest.approx((payload / 4 + payload / 4) / link_rate(COST), rel=1e-9)
    # Every NIC sends its rank's half payload; routed, the same (spread over 2 NICs of 1 rank each).
    for w in (wave, dataclasses.replace(wave, routed=True)):
        assert nic_bytes(_plan(w), COST) == pytest.approx(np.full(4, payload / 2), rel=EXACT)


def test_a_remap_move_across_the_nodes_on_its_nics():
    # Ranks 0-1 hold 600 tokens for attention (rows 0-299, 300-599), ranks 2 and 3 nothing; the
    # move re-partitions the rows contiguously, 150 each: rank 0 sends rows 150-299 to rank 1
    # (inside node 0), rank 1 sends rows 300-599 to ranks 2 and 3: all through NIC 1.
    groups = [Group(0, 2, [MicroBatch([0, 1, 2])]), Group(2, 1), Group(3, 1)]
    plan = _plan(Wave(groups, [(0, 4)]))
    bpt, rate = COST.bytes_per_token, 0.7e9
    assert nic_bytes(plan, COST) == pytest.approx([0, 300 * bpt, 0, 0], rel=EXACT)
    # The per-rank price one node gives (the largest surplus, 150 tokens, at bandwidth[4]) misses
    # that NIC 1 carries 300.
    assert step_time(plan, COST) - step_time(plan, ONE_NODE) == pytest.approx(150 * bpt / rate, rel=1e-9)
    # Routed over both NICs: 150 each after rank 1 hands 150 to rank 0 (chunk 1 of both pieces),
    # and before ranks 2 and 3 hand each other the 75 that entered under the other's NIC:
    # 150 + 150 + 75 at gloo's rate, whose links are no faster than its NICs: routing loses 75.
    routed = _plan(Wave(groups, [(0, 4)], routed=True))
    assert step_time(routed, COST) - step_time(plan, COST) == pytest.approx(75 * bpt / rate, rel=1e-9)
    assert nic_bytes(routed, COST) == pytest.approx([150 * bpt, 150 * bpt, 0, 0], rel=EXACT)


def test_metrics_carry_the_nic_bytes_and_one_node_has_none():
    plan = _plan(Wave([Group(0, 4, [MicroBatch([0, 1, 2])])]))
    assert simulate(plan, COST, 4).nic_bytes.sum() > 0
    assert len(simulate(plan, ONE_NODE, 4).nic_bytes) == 0


def test_a_routed_wave_on_one_node_is_refused():
    plan = _plan(Wave([Group(0, 4, [MicroBatch([0, 1, 2])])], routed=True))
    plan.validate(TWO_NODES)
    with pytest.raises(PlanError, match="wave 0 is routed, but cluster 'cpu' is one node"):
        plan.validate(get_cluster("cpu", world_size=4))
    assert Plan.from_json(plan.to_json()).waves[0].routed
