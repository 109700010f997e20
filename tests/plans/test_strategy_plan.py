"""StrategyPlan (`plans/strategy_plan.py`): a step's parts on a strategy's pipelines, their checks,
their pricing (`plans/strategy_timeline.py`) and any planner placed on the pipelines
(`planners/strategies.py`)."""
from __future__ import annotations

import dataclasses

import pytest

from ballast.planners.strategies import StrategyPlanner
from ballast.plans.plan import Group, MicroBatch, Plan, PlanError, Wave
from ballast.plans.strategy_plan import StrategyPlan
from ballast.plans.strategy_timeline import simulate_strategy
from ballast.plans.timeline import simulate
from ballast.pricing.coefficients import InfeasibleError
from ballast.pricing.cost_sources import get_cost_model, strategy_cost_models
from ballast.pricing.parameter_movement import movement_prices
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.sharding import Sharding
from ballast.vocabulary.strategy import Strategy

TINY = get_model_shape("tiny")
CPU8 = get_cluster("cpu", 8, device_memory_gb=0.05)
HETERO = Strategy.parse("2x2,2x1,1x1,1x1")
LENGTHS = [1500, 900, 700, 400, 300, 200, 120, 60]


@pytest.fixture(scope="module")
def costs():
    return strategy_cost_models("analytic", TINY, CPU8, HETERO)


def one_group(lengths: list[int], tokens: int, tp: int, pp: int) -> Plan:
    return Plan(lengths, [Wave([Group(0, 1, [MicroBatch([j]) for j in range(len(lengths))])])], tokens, tp=tp, pp=pp)


def test_cost_models_are_each_pipelines_own(costs):
    assert [(c.mesh.tp, c.mesh.pp, c.world_size) for c in costs] == [(2, 2, 1), (2, 1, 1), (1, 1, 1), (1, 1, 1)]
    assert all(c.device.sharding is Sharding.CANONICAL and c.device.canonical.ranks == 8 for c in costs)
    # The canonical share of the state of record is an eighth of the model's on every rank, so a
    # lone (1,1) rank holds less than a replicated one would (its whole optimizer state).
    replicated = get_cost_model("analytic", TINY, get_cluster("cpu", 1, device_memory_gb=0.05))
    assert costs[2].states < replicated.states
    with pytest.raises(ValueError, match="priced from --cost analytic or published"):
        strategy_cost_models("profile.json", TINY, CPU8, HETERO)


def test_every_planner_on_the_pipelines_partitions_and_validates(costs):
    for name in ("ballast", "static", "flexsp", "wlb-llm"):
        plan = StrategyPlanner(name, HETERO, CPU8, costs).plan(LENGTHS)
        plan.validate(CPU8, costs)
        assert sorted(j for ids in plan.ids for j in ids) == list(range(len(LENGTHS)))
        assert all(part.tokens == sum(LENGTHS) for part in plan.parts)
        assert all(ids for ids in plan.ids), f"{name} left a pipeline idle with {len(LENGTHS)} sequences"
        assert StrategyPlan.from_json(plan.to_json()).to_dict() == plan.to_dict()
    table = plan.table()
    assert "pipeline 0 (2,2) (ranks 0..3)" in table and "pipeline 3 (1,1) (ranks 7..7)" in table


def test_the_longest_sequence_goes_where_it_fits():
    # At 20 MB a device, a 4,500-token sequence fits only the (2,2) pipeline: a quarter of the
    # model per rank, where (2,1) holds half and (1,1) all of it (each TP rank keeps half the
    # activations); the assignment puts it there.
    cluster = get_cluster("cpu", 8, device_memory_gb=0.02)
    costs = strategy_cost_models("analytic", TINY, cluster, HETERO)
    assert [c.min_degree(4500) is not None for c in costs] == [True, False, False, False]
    plan = StrategyPlanner("ballast", HETERO, cluster, costs).plan([4500, 300, 200, 100])
    assert plan.ids[0][0] == 0
    plan.validate(cluster, costs)
    with pytest.raises(InfeasibleError, match="sequence 0 .*fits no pipeline"):
        StrategyPlanner("ballast", HETERO, cluster, costs).plan([6000, 100])


def test_validate_names_the_broken_rule(costs):
    plan = StrategyPlanner("ballast", HETERO, CPU8, costs).plan(LENGTHS)
    plan.validate(CPU8, costs)

    def broken(**change) -> StrategyPlan:
        return dataclasses.replace(plan, **change)

    total = sum(LENGTHS)
    ids = [list(ids) for ids in plan.ids]
    moved = [ids[0] + ids[1][:1], ids[1][1:]] + ids[2:]
    cases = [
        (broken(ids=[ids[0] + ids[1][:1]] + ids[1:]), "is in pipeline 0 .* and in pipeline 1"),
        (broken(ids=[ids[0], []] + ids[2:], parts=[plan.parts[0], Plan([], [], total, tp=2)] + plan.parts[2:]),
         "is in no pipeline"),
        (broken(ids=moved), "pipeline 0 .*lengths are not those"),
        (broken(parts=[dataclasses.replace(plan.parts[0], tokens=7)] + plan.parts[1:]),
         "pipeline 0 .*normalises the loss by 7 tokens"),
        (broken(parts=plan.parts[:2] + [dataclasses.replace(plan.parts[2], tp=2)] + plan.parts[3:]),
         "pipeline 2 .*made for TP 2 x PP 1"),
    ]
    for case, match in cases:
        with pytest.raises(PlanError, match=match):
            case.validate(CPU8, costs)
    with pytest.raises(PlanError, match="5 pipelines, but the plan gives 4 parts"):
        StrategyPlan(Strategy.parse("2x2,2x1,1x1,1x1,1x1"), plan.parts, plan.ids, LENGTHS)
    with pytest.raises(PlanError, match="holds 9 ranks"):
        StrategyPlan(Strategy.parse("2x2,2x1,1x1,2x1"), plan.parts, plan.ids, LENGTHS).validate(CPU8)
    # A part's own plan errors come with its pipeline's name: a (1,1) rank cannot hold 4,500 tokens.
    big = [4500, 100, 100, 100]
    tight = get_cluster("cpu", 8, device_memory_gb=0.02)
    tight_costs = strategy_cost_models("analytic", TINY, tight, HETERO)
    parts = [one_group([100], 4800, 2, 2), one_group([100], 4800, 2, 1), one_group([4500], 4800, 1, 1),
             one_group([100], 4800, 1, 1)]
    with pytest.raises(PlanError, match=r"pipeline 2 \(1,1\) \(ranks 6..6\): wave 0, group 0 .*need"):
        StrategyPlan(HETERO, parts, [[1], [2], [0], [3]], big).validate(tight, tight_costs)


def test_the_step_is_the_slowest_pipeline_between_the_movement(costs):
    plan = StrategyPlanner("ballast", HETERO, CPU8, costs).plan(LENGTHS)
    movement = movement_prices(HETERO, TINY, CPU8)
    metrics = simulate_strategy(plan, costs, movement)
    alone = [simulate(part, cost, cost.world_size).step_time for part, cost in zip(plan.parts, costs)]
    assert metrics.pipelines_time == max(alone)
    assert metrics.step_time == pytest.approx(movement.gather + max(alone) + movement.reduction + movement.optimizer)
    assert metrics.assigned_bound <= metrics.step_time


def test_a_mesh_is_the_strategy_of_one_pipeline():
    cluster = get_cluster("cpu", 4)
    plan = Plan(LENGTHS[:4], [Wave([Group(0, 4, [MicroBatch([0, 1, 2, 3])])])])
    whole = StrategyPlan.of_plan(Strategy.parse("1x1x4"), plan)
    assert whole.ids == [[0, 1, 2, 3]] and whole.parts == [plan]
    whole.validate(cluster)
    with pytest.raises(PlanError, match="malformed strategy plan data"):
        StrategyPlan.from_dict({"strategy": [[1, 1, 4]], "parts": []})
