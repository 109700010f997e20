"""Each planner plans in the (Ulysses x CP) splits its rule allows, on models whose heads cap
Ulysses (3 or 6 heads, GQA or not): megatron-dynamic-cp and wlb-llm context parallelism alone,
zeppelin Ulysses inside a node times CP across, static --cp its fixed CP part, and dcp, flexsp,
hydraulis Ulysses alone (their published behaviour), so their degrees stop where the heads do.
Every plan is valid and never beats the uncapped lower bound (every split the hardware allows)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import ModelShape
from ballast.planners import PlannerOptions, get_planner
from ballast.plans.timeline import simulate
from strategies import make_cluster

CAPPED = [ModelShape("three-heads", 2, 96, 3, 3, 192, 256),       # Ulysses: degree 1 only
          ModelShape("six-heads", 2, 192, 6, 2, 384, 256)]        # Ulysses: 1, 2; GQA (2 kv heads)


def context_alone(planner, group) -> bool:
    return group.cp == group.degree


def ulysses_in_node(planner, group) -> bool:
    # the largest Ulysses part the heads allow inside a node, CP over the rest
    heads, node = planner.cost.heads, planner.cluster.devices_per_node
    u = max(u for u in (1, 2, 4, 8, 16) if u <= min(node, group.degree) and heads % u == 0 and group.degree % u == 0)
    return group.ulysses == u


def ulysses_alone(planner, group) -> bool:
    return group.cp == 1 and planner.cost.heads % group.degree == 0


def fixed_context(planner, group) -> bool:
    return group.cp == planner.options.cp   # its degree is at least --cp


RULES = {"megatron-dynamic-cp": context_alone, "wlb-llm": context_alone, "zeppelin": ulysses_in_node,
         "static": fixed_context, "dcp": ulysses_alone, "flexsp": ulysses_alone, "hydraulis": ulysses_alone}
EXAMPLES = {"flexsp": 4}


def budget(cluster, shape, tokens):
    """The cluster and the shape's cost model at a memory budget of `tokens` per device without
    recomputation."""
    cost = analytic_cost(shape, cluster)
    memory = cost.states + tokens * cost.act_per_token
    return dataclasses.replace(cluster, device_memory=memory), dataclasses.replace(cost, device_memory=memory)


@st.composite
def capped_setups(draw, name):
    """(cluster, cost, lengths, options): 4-16 ranks in 1-2 nodes, a capped model, a budget of a
    few hundred to 20K tokens per device, and a long-tailed batch up to what `name` can plan."""
    cluster, cost = budget(make_cluster(draw(st.sampled_from([1, 2])), draw(st.sampled_from([2, 4, 8])), 1e12,
                                        draw(st.sampled_from([0.0, 1e-3]))),
                           draw(st.sampled_from(CAPPED)), draw(st.integers(300, 20_000)))
    options = PlannerOptions(cp=2 if name == "static" else None, time_limit=0.5, lockstep=draw(st.booleans()))
    ruled = get_planner(name, cluster, cost, options).cost
    limit = ruled.max_tokens(ruled.degrees[-1], 1.0)
    fractions = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=32))
    return cluster, cost, [max(1, round(f ** 3 * limit)) for f in fractions], options


@pytest.mark.parametrize("name", list(RULES))
def test_plans_use_their_rules_split_on_capped_heads(name):
    @settings(max_examples=EXAMPLES.get(name, 40), suppress_health_check=[HealthCheck.too_slow])
    @given(capped_setups(name))
    def check(setup):
        cluster, cost, lengths, options = setup
        planner = get_planner(name, cluster, cost, options)
        plan = planner.plan(lengths)
        plan.validate(cluster, cost)
        for wave in plan.waves:
            for group in wave.groups:
                if any(mb.seq_ids for mb in group.micro_batches):
                    assert RULES[name](planner, group), (name, group.degree, group.cp)
        metrics = simulate(plan, cost, cluster.world_size)   # its lower bound is the uncapped one
        assert metrics.step_time >= metrics.lower_bound * (1 - 1e-9)
    check()


@pytest.mark.parametrize("name", ["megatron-dynamic-cp", "wlb-llm", "zeppelin", "static"])
def test_context_parallel_planners_pass_the_head_cap(name):
    # A sequence three times what one rank holds: 3 heads allow no Ulysses degree above 1, so
    # only context parallelism can hold it, at degree 4 or more.
    cluster, cost = budget(make_cluster(2, 4, 1e12), CAPPED[0], 2_000)
    lengths = [3 * cost.max_tokens(1, 1.0), 500, 20]
    planner = get_planner(name, cluster, cost, PlannerOptions(cp=4 if name == "static" else None))
    plan = planner.plan(lengths)
    plan.validate(cluster, cost)
    longest = next(g for _, g, mb in plan.micro_batches() if 0 in mb.seq_ids)
    assert longest.degree >= 4 and longest.cp == longest.degree


@pytest.mark.parametrize("forced, cp, split", [(None, 4, (4, 4)), (8, 2, (8, 2)), (4, 1, (4, 1))])
def test_static_usp_runs_the_split_asked(forced, cp, split):
    # Short sequences fit one rank: without --degree the degree is still --cp's.
    cluster, cost = budget(make_cluster(1, 8, 1e12), ModelShape("eight-heads", 2, 128, 8, 8, 256, 256), 20_000)
    plan = get_planner("static", cluster, cost, PlannerOptions(degree=forced, cp=cp)).plan([3_000, 900, 40])
    plan.validate(cluster, cost)
    assert {(g.degree, g.cp) for g in plan.waves[0].groups} == {split}


@pytest.mark.parametrize("name, parts", [("megatron-dynamic-cp", {16: [16], 32: [32]}),
                                         ("zeppelin", {16: [2], 32: [4]}),      # Ulysses 8 in a node x CP across
                                         ("ballast", {16: [1, 2, 4, 8, 16], 32: [2, 4, 8, 16, 32]})])
def test_spatial_temporal_models_run_context_parallelism_past_their_heads(name, parts):
    # stdit3-1b's 16 heads stop Ulysses (and the 2D layouts' fallback) at degree 16 on 32 ranks;
    # with a CP part its fallback runs Ulysses x CP over whole-clip chunks (`video_sp.py`)
    from ballast.vocabulary.cluster import get_cluster
    from ballast.vocabulary.model_shape import get_model_shape
    cluster = get_cluster("h200-32")
    cost = analytic_cost(get_model_shape("stdit3-1b"), cluster)
    assert cost.degrees[-1] == 16  # Ulysses alone
    planner = get_planner(name, cluster, cost)
    assert {d: planner.cost.catalogue.context_parts(d) for d in (16, 32)} == parts


def test_a_length_only_view_keeps_the_heads_and_reaches_past_them_with_context_parallelism():
    # planning clips as causal text (--as-lengths) keeps the model's heads and kv heads: Ulysses
    # stops where they do, a CP part reaches the whole cluster for every pattern
    from ballast.vocabulary.cluster import get_cluster
    from ballast.vocabulary.layouts import ANY_SPLIT
    from ballast.vocabulary.model_shape import get_model_shape
    from ballast.simulate.side_by_side import lengths_only
    for model, heads_cap in (("stdit3-1b", 16), ("wan-14b", 8)):
        cost = analytic_cost(get_model_shape(model), get_cluster("h200-32"))
        seen = lengths_only(cost)
        assert seen.pattern.name == "causal" and seen.degrees[-1] == heads_cap
        assert seen.under(ANY_SPLIT).degrees[-1] == 32 and seen.under(ANY_SPLIT).catalogue.context_parts(32)[0] == 32 // heads_cap
