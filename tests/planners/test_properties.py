"""Properties every registered planner must have, on random batches, clusters and memory budgets.

Batches are text (lengths) or mixed with video clips (frames, height, width), under a causal,
full or spatial-temporal attention pattern: every plan is valid, holds every sample once and
never beats the lower bound, whatever the samples' shapes.

The tests iterate over `ballast.planners.PLANNERS`, so a planner registered later is covered
without touching this file. Planners that take over a second per plan (FlexSP's MILP) get few
examples and a short solver time limit.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.vocabulary.cluster import Cluster
from ballast.pricing.cost_sources import analytic_cost
from ballast.plans.plan import Plan
from ballast.planners import PLANNERS, PlannerOptions, get_planner
from ballast.vocabulary.model_shape import ModelShape, get_model_shape
from ballast.vocabulary.samples import tokens
from ballast.plans.timeline import simulate, step_time
from ballast.pricing.bounds import longest_alone

EXAMPLES = 60
SLOW = {"flexsp": 3}          # planners that may need > 1 s per plan: few examples
TIME_LIMIT = 0.5              # seconds per MILP solve, for planners that read it

SHAPES = [
    get_model_shape("tiny"),                                   # degrees up to 8 (8 heads)
    ModelShape("wide", 2, 256, 16, 16, 512, 128),              # degrees up to 16
    ModelShape("mqa", 2, 64, 2, 1, 128, 64),                   # one kv head, replicated at degree 2
]
PATTERNS = [("causal", 0.5), ("full", 0.5), ("spatial-temporal", 0.5), ("spatial-temporal", 0.25)]


def sample(draw, tokens: int, limit: int, shaped: bool):
    """A text sequence of `tokens`, or (if `shaped`, half the time) a clip of about as many
    tokens, at most `limit`: F frames of H x W patches, F and H drawn small."""
    if not shaped or draw(st.booleans()):
        return tokens
    frames, height = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    clip = (frames, height, max(1, tokens // (frames * height)))
    return clip if frames * height * clip[2] <= limit else tokens


@st.composite
def setups(draw, name, lockstep=None):
    """(cluster, cost, samples, options): 1-16 ranks in 1-2 nodes, a memory budget from a few
    dozen to 50K tokens per device, and a long-tailed batch up to the longest planner `name`
    can plan under its split rule (half the time with clips, under a random attention pattern)."""
    nodes = draw(st.sampled_from([1, 2]))
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    intra = draw(st.sampled_from([1e9, 1e11]))
    inter = intra / draw(st.sampled_from([1, 10, 20]))
    bandwidth = {1 << i: intra if 1 << i <= per_node else inter for i in range(1, (nodes * per_node).bit_length())}
    cluster = Cluster("random", nodes, per_node, 1e18, draw(st.sampled_from([5e10, 1e14])),
                      draw(st.sampled_from([0.3, 1.0])), bandwidth, draw(st.sampled_from([0.0, 2e-3, 0.05])))
    shaped = draw(st.booleans())
    shape = draw(st.sampled_from(SHAPES))
    if shaped:
        pattern, share = draw(st.sampled_from(PATTERNS))
        shape = dataclasses.replace(shape, attention=pattern, spatial_share=share)
    cost = analytic_cost(shape, cluster)
    cap = draw(st.integers(32, 50_000))     # tokens a device holds without recomputation
    # beside the states, or what a step holds after backward where that is more (FSDP on 1 rank)
    memory = max(cost.states, cost.device.after_backward) + cap * cost.act_per_token
    cluster = dataclasses.replace(cluster, device_memory=memory)
    # Attention's recomputation priced like the rest (docs/design.md) or apart, as profiles find it.
    # A clip's conditioning on every rank of its group (`rank_sample_seconds`), as profiles of
    # clip models find it: planners pass their micro-batches' counts, the bound its area.
    whole = draw(st.sampled_from([0.0, 0.05 * cost.g])) if shaped else 0.0
    cost = dataclasses.replace(cost, device_memory=memory, rank_sample_seconds=whole,
                               recompute_attention=draw(st.sampled_from([cost.recompute, 0.1, 0.8])))
    ruled = get_planner(name, cluster, cost, PlannerOptions()).cost
    limit = ruled.max_tokens(ruled.degrees[-1], 1.0)
    # fractions of the limit, cubed: mostly short sequences with a long tail up to the limit
    fractions = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=48))
    samples = [sample(draw, max(1, round(f ** 3 * limit)), limit, shaped) for f in fractions]
    max_len = draw(st.one_of(st.none(), st.integers(max(map(tokens, samples)), limit)))
    options = PlannerOptions(max_len=max_len, seed=draw(st.integers(0, 3)), time_limit=TIME_LIMIT,
                             lockstep=draw(st.booleans()) if lockstep is None else lockstep)
    return cluster, cost, samples, options


def run(name: str, examples: int, check, lockstep=None) -> None:
    @settings(max_examples=min(examples, SLOW.get(name, examples)),
              suppress_health_check=[HealthCheck.too_slow])
    @given(setups(name, lockstep))
    def inner(setup):
        check(*setup)
    inner()


@pytest.mark.parametrize("name", list(PLANNERS))
def test_plans_are_valid_and_never_beat_the_lower_bound(name):
    def check(cluster, cost, samples, options):
        plan = get_planner(name, cluster, cost, options).plan(samples)
        plan.validate(cluster, cost)              # every sequence once, aligned, fits memory, ...
        lengths = list(map(tokens, samples))
        assert plan.lengths == lengths and plan.tokens == sum(lengths)
        assert plan.samples == samples            # shapes kept, so the simulator prices them
        assert plan.planner == name
        assert Plan.from_json(plan.to_json()) == plan
        metrics = simulate(plan, cost, cluster.world_size)
        # planners compare plans with step_time(); it must be the simulator's step time
        assert step_time(plan, cost) == pytest.approx(metrics.step_time, rel=1e-9)
        # no plan beats the lower bound (1e-9: the same terms summed in different orders)
        assert metrics.step_time >= metrics.lower_bound * (1 - 1e-9), \
            f"{name}: step {metrics.step_time} < lower bound {metrics.lower_bound}"
        # nor, without a remap domain, the slowest sample alone at its best degree
        if not any(wave.remap for wave in plan.waves):
            assert metrics.step_time >= longest_alone(cost, samples) * (1 - 1e-9)
    run(name, EXAMPLES, check)


@pytest.mark.parametrize("name", list(PLANNERS))
def test_lockstep_option_is_honoured(name):
    # PlannerOptions.lockstep: "Emit lockstep plans (FSDP/ZeRO-3): equal micro-batch counts per
    # group in every wave." validate() checks the counts of a plan marked lockstep.
    def check(cluster, cost, samples, options):
        plan = get_planner(name, cluster, cost, options).plan(samples)
        assert plan.lockstep, f"{name} ignored PlannerOptions(lockstep=True)"
        plan.validate(cluster, cost)
    run(name, 10, check, lockstep=True)


@pytest.mark.parametrize("name", list(PLANNERS))
def test_same_input_same_plan(name):
    # Every rank may plan the step itself: the plan must depend on the input (and seed) only.
    # A planner with a wall-clock solver limit (FlexSP's MILP) returns whatever the solver had
    # when time ran out, which depends on the machine's load; such planners are exempt.
    if name in SLOW:
        pytest.skip(f"{name} stops its solver on a wall-clock limit")
    def check(cluster, cost, samples, options):
        first = get_planner(name, cluster, cost, options).plan(samples)
        again = get_planner(name, cluster, cost, dataclasses.replace(options)).plan(list(samples))
        assert first.to_dict() == again.to_dict()
    run(name, 5, check)
