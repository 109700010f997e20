"""Which planners route a wave over every NIC (`Wave.routed`): zeppelin every wave whose
all-to-alls cross nodes, ballast the ones routing makes faster, every other planner none."""
from __future__ import annotations

import dataclasses

import pytest

from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import get_model_shape
from ballast.planners import PlannerOptions, get_planner
from ballast.plans.timeline import wave_time

CLUSTER = get_cluster("a800-16")
COST = analytic_cost(get_model_shape("gpt-7b"), CLUSTER)
# Two sequences long enough to need both nodes beside many short ones: waves that cross nodes.
BATCHES = [[262144, 131072] + [2048] * 60, [196608] + [8192] * 40 + [512] * 100]


def _plans(name: str, routing: bool = True):
    planner = get_planner(name, CLUSTER, COST, PlannerOptions(max_len=262144, routing=routing))
    return planner, [planner.plan(batch) for batch in BATCHES]


def test_zeppelin_routes_every_wave_that_crosses_nodes():
    _, plans = _plans("zeppelin")
    waves = [w for plan in plans for w in plan.waves]
    assert any(w.crosses_nodes(8) for w in waves), "the batches must make waves that cross nodes"
    assert all(w.routed == w.crosses_nodes(8) for w in waves)
    _, plans = _plans("zeppelin", routing=False)
    assert not any(w.routed for plan in plans for w in plan.waves)


def test_ballast_routes_a_wave_only_where_that_ends_it_sooner():
    planner, plans = _plans("ballast")
    crossing = 0
    for plan in plans:
        for wave in plan.waves:
            crossing += wave.crosses_nodes(8)
            other = dataclasses.replace(wave, routed=not wave.routed)
            if wave.routed:
                assert wave_time(plan, wave, planner.cost) < wave_time(plan, other, planner.cost)
            else:
                assert not wave.crosses_nodes(8) or \
                    wave_time(plan, wave, planner.cost) <= wave_time(plan, other, planner.cost)
    assert crossing, "the batches must make waves that cross nodes"


@pytest.mark.parametrize("name", ["static", "dcp", "hydraulis", "megatron-dynamic-cp", "wlb-llm"])
def test_rivals_never_route(name):
    _, plans = _plans(name)
    assert not any(w.routed for plan in plans for w in plan.waves)


def test_ballast_routes_a_remap_move_that_loads_a_few_nics():
    # Node 0's ranks hold a slot's tokens, node 1's nothing: the contiguous move sends ranks 4-7's
    # rows (all of them) across, through NICs 2 and 3 only (a800: two ranks per NIC). Routed over
    # all 4 NICs they carry half as much each, after hand-offs over NVLink, 6x faster than a NIC.
    from ballast.plans.plan import Group, MicroBatch, Plan, Wave
    planner = get_planner("ballast", CLUSTER, COST, PlannerOptions(max_len=262144))
    wave = Wave([Group(0, 8, [MicroBatch([0])])] + [Group(r, 1) for r in range(8, 16)], [(0, 16)])
    plan = Plan([65536], [wave])
    unrouted = wave_time(plan, wave, planner.cost)
    planner._route(plan)
    assert wave.routed and wave_time(plan, wave, planner.cost) < unrouted
