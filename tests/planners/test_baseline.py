"""The baseline planners (static, batch-adaptive, bucket, megatron-dynamic-cp) and the registry."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ballast
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import analytic_cost, published_cost
from ballast.vocabulary.layouts import CONTEXT_ONLY
from ballast.planners import PLANNERS, PlannerOptions, get_planner, make_plan, parse_planner_names
from ballast.vocabulary.model_shape import get_model_shape
from ballast.plans.timeline import step_time

BASELINES = ["static", "batch-adaptive", "bucket", "megatron-dynamic-cp"]


def tiny8():
    """8 ranks with 0.4 GB each, activations in bf16 (so FSDP, 2.48 MB of states): the tiny model
    holds ~19.4K tokens per device without recomputation (20,480 B a token: 17 h values of 2 B
    per layer, 17 x 128 x 2 x 4 = 17,408, and the loss's 12 B x 256 entries, 3,072) and ~97K
    with full recomputation (4,096 B: the blocks' inputs, 1,024, and the loss, kept); degrees
    1, 2, 4, 8 (8 heads)."""
    cluster = dataclasses.replace(get_cluster("cpu", world_size=8, device_memory_gb=0.4), value_bytes=2)
    return cluster, analytic_cost(get_model_shape("tiny"), cluster)


def gpt7b():
    """FlexSP's setting: GPT-7B on 64 A100s with its published coefficients; degrees 1..64."""
    cluster = get_cluster("a100-64")
    return cluster, published_cost(get_model_shape("gpt-7b"), cluster)


def fits(cost, tokens, degree, recompute):
    return cost.memory([tokens], degree, recompute) <= cost.device_memory


def busy_groups(plan):
    return [g for wave in plan.waves for g in wave.groups if any(mb.seq_ids for mb in g.micro_batches)]


BATCH = [90_000, 40_000, 12_000, 5_000, 5_000, 3_000, 800, 700, 300, 120, 64, 1]


# --- static ------------------------------------------------------------------------------------
# (0.4e9 - 2,477,568) / 4,096 = 97,051.4 tokens at degree 1 with full recomputation
@pytest.mark.parametrize("max_len, degree", [(None, 1), (90_000, 1), (97_051, 1), (97_052, 2),
                                             (150_000, 2), (300_000, 4)])
def test_static_uses_smallest_degree_that_holds_max_len(max_len, degree):
    cluster, cost = tiny8()
    plan = get_planner("static", cluster, cost, PlannerOptions(max_len=max_len)).plan(BATCH)
    plan.validate(cluster, cost)
    longest = max_len or max(BATCH)
    # the smallest degree: max_len fits it with full recomputation, and not half of it
    assert fits(cost, longest, degree, 1.0) and (degree == 1 or not fits(cost, longest, degree // 2, 1.0))
    assert len(plan.waves) == 1 and plan.lockstep
    groups = plan.waves[0].groups
    assert [(g.start, g.degree) for g in groups] == [(r, degree) for r in range(0, 8, degree)]
    # one recompute setting for the run: the least at which max_len fits that degree
    level = cost.min_recompute(longest, degree)
    assert {mb.recompute for _, _, mb in plan.micro_batches() if mb.seq_ids} == {level}
    assert plan.info["degree"] == degree
    assert len({len(g.micro_batches) for g in groups}) == 1


def test_static_degree_option_overrides():
    cluster, cost = tiny8()
    plan = get_planner("static", cluster, cost, PlannerOptions(degree=4)).plan(BATCH)
    plan.validate(cluster, cost)
    assert [g.degree for g in plan.waves[0].groups] == [4, 4]
    with pytest.raises(ValueError, match="does not fit SP degree 1"):
        get_planner("static", cluster, cost, PlannerOptions(degree=1, max_len=100_000)).plan(BATCH)
    with pytest.raises(ValueError, match=r"SP degree 16 is not usable by planner .static.: degrees are \[1, 2, 4, 8\]"):
        get_planner("static", cluster, cost, PlannerOptions(degree=16)).plan(BATCH)


def test_static_rejects_sequence_over_max_len():
    cluster, cost = tiny8()
    with pytest.raises(ValueError, match="sequence 0 has 90000 tokens, more than max_len 50000"):
        get_planner("static", cluster, cost, PlannerOptions(max_len=50_000)).plan(BATCH)


def test_static_on_flexsp_cluster():
    cluster, cost = gpt7b()
    # 393216 tokens (the demo's max_len) need degree 16 with full recomputation on 28 GB A100s:
    # a token keeps 4.48 MB x 2/34 = 0.264 MB of activations and the loss's 12 B x 50,304 =
    # 0.604 MB, so 393216 / 16 x 0.867 MB = 21.3 GB beside FSDP's 3.34 GB of states (42.6 GB
    # at degree 8)
    plan = get_planner("static", cluster, cost, PlannerOptions(max_len=393_216)).plan([1000] * 64)
    assert {g.degree for g in plan.waves[0].groups} == {16}
    assert not fits(cost, 393_216, 8, 1.0) and fits(cost, 393_216, 16, 1.0)


# --- batch-adaptive ----------------------------------------------------------------------------
@settings(max_examples=40)
@given(st.sampled_from(["tiny8", "gpt7b"]), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=64))
def test_batch_adaptive_never_slower_than_static(setting, fractions):
    cluster, cost = {"tiny8": tiny8, "gpt7b": gpt7b}[setting]()
    limit = cost.max_tokens(cost.degrees[-1], 1.0)
    lengths = [max(1, round(f ** 3 * limit)) for f in fractions]
    options = PlannerOptions(max_len=max(lengths))
    adaptive = get_planner("batch-adaptive", cluster, cost, options).plan(lengths)
    static = get_planner("static", cluster, cost, options).plan(lengths)
    adaptive.validate(cluster, cost)
    # one degree for the step, whichever is fastest; static's is among the candidates
    assert len({g.degree for g in busy_groups(adaptive)}) == 1
    assert step_time(adaptive, cost) <= step_time(static, cost) * (1 + 1e-12)


def test_batch_adaptive_picks_small_degree_for_short_batch():
    cluster, cost = gpt7b()
    # short sequences only: degree 1 needs no all-to-all; FlexSP's bandwidth makes any degree slower
    plan = get_planner("batch-adaptive", cluster, cost).plan([2000] * 128)
    assert {g.degree for g in busy_groups(plan)} == {1}


# --- bucket ------------------------------------------------------------------------------------
def test_bucket_micro_batches_hold_one_length_bucket():
    cluster, cost = tiny8()
    lengths = [3000, 2100, 2050, 1500, 1100, 1025, 1024, 700, 513, 200, 190, 129, 128, 3, 2, 1] * 3
    plan = get_planner("bucket", cluster, cost).plan(lengths)
    plan.validate(cluster, cost)
    assert plan.lockstep and len(plan.waves) == 1
    assert len({g.degree for g in plan.waves[0].groups}) == 1
    for _, _, mb in plan.micro_batches():
        assert len({(lengths[i] - 1).bit_length() for i in mb.seq_ids}) <= 1, mb.seq_ids


# --- megatron-dynamic-cp -----------------------------------------------------------------------
def next_power_of_two_at_least(x: float) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


@pytest.mark.parametrize("setting, lengths, max_len", [
    ("gpt7b", [393_216, 200_000, 99_748, 99_747, 50_000, 20_000, 6000, 5867, 5000, 900, 20] * 2, 393_216),
    ("gpt7b", [1_000_000, 300_000, 70_000, 12_000, 800], None),
    ("tiny8", BATCH, None),
    ("tiny8", BATCH, 300_000),
])
def test_megatron_degree_per_sequence(setting, lengths, max_len):
    cluster, cost = {"tiny8": tiny8, "gpt7b": gpt7b}[setting]()
    planner = get_planner("megatron-dynamic-cp", cluster, cost, PlannerOptions(max_len=max_len))
    plan = planner.plan(lengths)
    plan.validate(cluster, cost)
    cost = planner.cost   # priced at its rule's split: context parallelism over the whole group
    assert cost.splits == CONTEXT_ONLY
    longest = max_len or max(lengths)
    # tokens per rank: the capacity per rank of the least degree that can hold max_len, at the
    # run's recompute level (the least that holds max_len there)
    smallest = cost.min_degree(longest)
    level = cost.min_recompute(longest, smallest)
    per_rank = cost.max_tokens(smallest, level) / smallest
    assert (plan.info["recompute"], plan.info["tokens_per_rank"]) == (level, per_rank)
    seen = set()
    for _, group, mb in plan.micro_batches():
        assert mb.recompute == level
        for i in mb.seq_ids:
            want = next_power_of_two_at_least(lengths[i] / per_rank)
            want = min(d for d in cost.degrees if d >= want)   # a degree the cluster has
            assert group.degree == want, (i, lengths[i], per_rank)
            seen.add(i)
    assert seen == set(range(len(lengths)))
    # every wave is one round of single-micro-batch groups
    assert all(len(g.micro_batches) <= 1 for wave in plan.waves for g in wave.groups)


# --- errors shared by every planner --------------------------------------------------------------
@pytest.mark.parametrize("name", list(PLANNERS))
def test_sequence_longer_than_any_plan_can_hold(name):
    cluster, cost = tiny8()
    limit = cost.max_tokens(cost.degrees[-1], 1.0)
    with pytest.raises(ValueError, match=rf"sequence 2 has {limit + 1} tokens.*at most {limit} tokens"):
        get_planner(name, cluster, cost, PlannerOptions(time_limit=0.5)).plan([10, 20, limit + 1, 5])


@pytest.mark.parametrize("name", list(PLANNERS))
def test_empty_and_zero_length_batches(name):
    cluster, cost = tiny8()
    planner = get_planner(name, cluster, cost, PlannerOptions(time_limit=0.5))
    with pytest.raises(ValueError, match="empty batch"):
        planner.plan([])
    with pytest.raises(ValueError, match="sequence 1 has length 0"):
        planner.plan([5, 0, 7])


@pytest.mark.parametrize("name", list(PLANNERS))
def test_sequence_longer_than_max_len(name):
    # PlannerOptions.max_len is the longest sequence the run allows. A planner given a longer
    # one must either say so (ValueError naming the sequence) or still return a valid plan;
    # an invalid plan or any other exception is a bug.
    cluster, cost = tiny8()
    lengths = [3000, 90_000, 500, 20_000]
    try:
        plan = get_planner(name, cluster, cost, PlannerOptions(max_len=1000, time_limit=0.5)).plan(lengths)
    except ValueError as e:
        assert "sequence 1" in str(e) and "1000" in str(e), str(e)
        return
    plan.validate(cluster, cost)


def test_unknown_planner_lists_planners():
    cluster, cost = tiny8()
    for call in (lambda: get_planner("flexpp", cluster, cost),
                 lambda: make_plan([1, 2], cluster, cost, planner="flexpp"),
                 lambda: ballast.plan([1, 2], cluster, cost, planner="flexpp"),
                 lambda: parse_planner_names("static,flexpp")):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "flexpp" in message and all(name in message for name in PLANNERS), message
    assert parse_planner_names("all") == list(PLANNERS)
    assert parse_planner_names(" static , bucket") == ["static", "bucket"]
    with pytest.raises(ValueError):
        parse_planner_names(" , ")


def test_registry_has_the_baselines_first():
    assert list(PLANNERS)[:4] == BASELINES


def test_planner_rejects_cost_for_another_cluster():
    cluster, cost = tiny8()
    with pytest.raises(ValueError, match="cost model made for 8 devices"):
        get_planner("static", get_cluster("cpu", world_size=4), cost)


@pytest.mark.parametrize("name", list(PLANNERS))
def test_sequence_at_exactly_the_limit(name):
    # check_fits admits up to max_tokens(largest degree, full recomputation) tokens, so every
    # planner must plan such a sequence. With 1300 bytes over 5000 tokens of free memory the
    # capacity is not a multiple of the degree: a token fully recomputed keeps 5,120 of its
    # 37,888 B (fp32: the block inputs, 4 x 128 x 4, and the loss's 3 x 4 x 256), so one rank
    # holds 5000 x 37,888 / 5,120 + 1300 / 5,120 = 37,000.25 tokens, 4 ranks 148,001.
    cluster = get_cluster("cpu", world_size=4, device_memory_gb=0.1)
    cost = analytic_cost(get_model_shape("tiny"), cluster)
    memory = cost.states + 5000 * cost.act_per_token + 1300
    cluster, cost = (dataclasses.replace(x, device_memory=memory) for x in (cluster, cost))
    limit = cost.max_tokens(cost.degrees[-1], 1.0)
    assert (limit, cost.max_tokens(1, 1.0)) == (148_001, 37_000)
    plan = get_planner(name, cluster, cost, PlannerOptions(time_limit=0.5)).plan([limit, 10])
    plan.validate(cluster, cost)
