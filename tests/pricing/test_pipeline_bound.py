"""The pipeline's lower bound (`pricing/pipeline_bound.py`): tight where it should be, below every
plan of tiny instances by exhaustive search (every layout, assignment, packing, order and
level), and below every planner's plans."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.planners import PLANNERS, PlannerOptions, get_planner
from ballast.plans.exhaustive import pipeline_optimum
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.plans.timeline import simulate, step_time
from ballast.pricing.cost_sources import get_cost_model
from ballast.pricing.pipeline import stage_activation_bytes
from ballast.pricing.pipeline_bound import (longest_chain, pipeline_lower_bound, relaxed_memory,
                                            unavoidable_bubble)
from ballast.pricing.stages import StagePrices
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import get_model_shape

from exhaustive_instances import hand_cost, tiny_instances

SLACK = 1e-9  # relative: the bound and the timeline sum the same float terms in other orders


def test_one_micro_batch_alone_meets_the_bound():
    # One sequence on a pool of one rank: its chain F0, F1, B1, B0 and two crossings is the step,
    # and both of the bound's terms are exactly that.
    cluster = get_cluster("cpu", world_size=2)
    cost = get_cost_model("analytic", get_model_shape("tiny"), cluster, mesh=JobMesh.of(cluster, pp=2))
    plan = Plan([1000], [Wave([Group(0, 1, [MicroBatch([0])])])], pp=2)
    step = step_time(plan, cost)
    assert pipeline_lower_bound(cost, [1000]) == pytest.approx(step, rel=1e-12)
    assert longest_chain(relaxed_memory(cost), [1000]) == pytest.approx(step, rel=1e-12)


def test_the_bubble_term_is_the_shortest_samples_warm_up_and_cool_down():
    # By hand, one rank and 3 stages: 100 tokens alone take 1e-6 * 100^2 + 1e-3 * 100 + 0.01 =
    # 0.12 s, a stage a third; its rows 4 bytes x 250 values x 100 tokens at 1 GB/s = 1e-4 s each
    # way; two stages' warm-up and cool-down: 2 (0.04 + 2e-4).
    cost = dataclasses.replace(hand_cost(world_size=1, bandwidth={}), stages=StagePrices((0.0,) * 3, 250, 1e9, 0.0))
    assert unavoidable_bubble(cost, [100]) == pytest.approx(2 * (0.04 + 2e-4), rel=1e-12)
    # Longer samples change nothing: the shortest sets it.
    assert unavoidable_bubble(cost, [300, 100, 2000]) == unavoidable_bubble(cost, [100])


def test_the_relaxed_memory_holds_what_the_last_stage_holds():
    # A micro-batch keeps at least 1 / p of its activations on the last stage, so whatever fits
    # there (with that stage's states) fits the relaxed model.
    cluster = get_cluster("h100-64")
    cost = get_cost_model("analytic", get_model_shape("llama3-8b"), cluster, mesh=JobMesh.of(cluster, pp=4))
    relaxed = relaxed_memory(cost)
    for tokens, degree, level in itertools.product((1000, 30_000, 200_000), (1, 4, 16), (0.0, 0.5, 1.0)):
        kept = stage_activation_bytes(cost, [tokens], degree, level, None, 3, 4)
        assert relaxed.activation_bytes(tokens, degree, level) <= 4 * kept * (1 + 1e-12)
    assert relaxed.device_memory - relaxed.states == pytest.approx(4 * (cost.device_memory - cost.stages.states[-1]))


@settings(max_examples=40, deadline=None)
@given(tiny_instances(), st.integers(2, 4), st.sampled_from([1e6, 1e9]), st.sampled_from([0.0, 1e-3]))
def test_no_one_wave_pipeline_plan_beats_the_bound(instance, p, bandwidth, latency):
    cost, lengths = instance
    if cost.world_size > 2 or len(lengths) > 4:
        cost = dataclasses.replace(cost, world_size=min(cost.world_size, 2),
                                   bandwidth={d: b for d, b in cost.bandwidth.items() if d <= 2})
        lengths = lengths[:4]
    # p stages of the instance's blocks each: a pipeline cuts its layers evenly (`check_stages`),
    # and its levels count in a stage's blocks (`CostModel.level_blocks`).
    cost = dataclasses.replace(cost, layers=cost.layers * p,
                               stages=StagePrices((cost.states,) * p, 64, bandwidth, latency))
    # Every plan whose stages fit memory fits the relaxed model (`relaxed_memory`): a superset.
    best = pipeline_optimum(cost, lengths, relaxed_memory(cost))
    assert pipeline_lower_bound(cost, lengths) <= best * (1 + SLACK)


@pytest.mark.parametrize("model, cluster, tp, pp", [("llama3-8b", "h100-64", 1, 4), ("gpt-7b", "a100-64", 2, 2)])
def test_no_planner_beats_the_bound(model, cluster, tp, pp):
    the_cluster = get_cluster(cluster)
    mesh = JobMesh.of(the_cluster, tp=tp, pp=pp)
    cost = get_cost_model("analytic", get_model_shape(model), the_cluster, mesh=mesh)
    pool = mesh.pool_cluster(the_cluster)
    rng = np.random.default_rng(0)
    batches = [[65_536], [65_536, 16_384, 4096, 4096, 512],
               np.clip(rng.lognormal(7, 1.6, 48), 1, 65_536).astype(int).tolist()]
    options = PlannerOptions(max_len=65_536, time_limit=0.5)
    for name in PLANNERS:
        planner = get_planner(name, pool, cost, options)
        for lengths in batches:
            plan = planner.plan(lengths)
            plan.validate(pool, cost)
            metrics = simulate(plan, cost, pool.world_size)
            assert metrics.step_time >= metrics.lower_bound * (1 - SLACK), (name, lengths)
