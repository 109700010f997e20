"""The `wlb-llm` planner: a fixed CP degree over every group, WLB-LLM's workload-balanced
var-length packing and its outlier delay to later steps."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.coefficients import InfeasibleError
from ballast.pricing.cost_sources import analytic_cost
from ballast.vocabulary.model_shape import ModelShape, get_model_shape
from ballast.planners import PlannerOptions, get_planner
from ballast.planners.held import DeferredSamples
from ballast.planners.outliers import OUTLIER_LEVELS, micro_batch_count, release_outliers
from ballast.planners.wlb_llm import greedy_pack

THREE_HEADS = ModelShape("three-heads", 2, 96, 3, 3, 192, 256)


def cpu8(shape: ModelShape = get_model_shape("tiny"), memory_gb: float = 0.4):
    # 0.4 GB: tiny holds ~97K tokens a rank at full recomputation (test_baseline.tiny8)
    cluster = dataclasses.replace(get_cluster("cpu", world_size=8, device_memory_gb=memory_gb), value_bytes=2)
    return cluster, analytic_cost(shape, cluster)


def workloads(plan, cost, degree):
    """W_a + W_l of every busy micro-batch: the sum of its documents' `marginal_times`."""
    share = cost.marginal_times(np.asarray(plan.lengths, dtype=np.float64), cost.units(plan.lengths), degree,
                                plan.info["recompute"])
    return [float(share[mb.seq_ids].sum()) for _, _, mb in plan.micro_batches() if mb.seq_ids]


@pytest.mark.parametrize("max_len, forced", [(None, None), (150_000, None), (300_000, None), (None, 8)])
def test_one_cp_degree_for_the_run_every_sample_once(max_len, forced):
    cluster, cost = cpu8()
    lengths = [90_000, 40_000, 12_000, 5_000, 5_000, 3_000, 800, 700, 300, 120, 64, 1] * 2
    planner = get_planner("wlb-llm", cluster, cost, PlannerOptions(max_len=max_len, degree=forced))
    plan = planner.plan(lengths)
    plan.validate(cluster, cost)
    degree = forced or planner.cost.min_degree(max_len or max(lengths))
    groups = plan.waves[0].groups
    assert len(plan.waves) == 1 and plan.info["degree"] == degree
    # world / CP data-parallel replicas, each running context parallelism over all its ranks
    assert [(g.start, g.degree, g.cp) for g in groups] == [(r, degree, degree) for r in range(0, 8, degree)]
    ids = sorted(i for _, _, mb in plan.micro_batches() for i in mb.seq_ids)
    assert ids == list(range(len(lengths)))
    assert {mb.recompute for _, _, mb in plan.micro_batches() if mb.seq_ids} == {plan.info["recompute"]}


@settings(max_examples=40)
@given(st.lists(st.integers(1, 20_000), min_size=1, max_size=60), st.sampled_from([1, 2, 4, 8]))
def test_micro_batches_balance_workload_as_greedy_can(lengths, forced):
    # No outlier (max_len is 4 x the longest + 1) and memory for every token at once: the packing
    # is list scheduling of the documents longest (= heaviest) first onto the least-loaded
    # micro-batch, LPT, whose largest load is within 4/3 of the optimum (Graham 1969), itself at
    # least the mean load, the heaviest document, and (m bins, m + 1 documents: two share one)
    # the m-th and (m+1)-th heaviest together.
    cluster, cost = cpu8(memory_gb=2.0)
    max_len = 4 * max(lengths) + 1
    planner = get_planner("wlb-llm", cluster, cost, PlannerOptions(max_len=max_len, degree=forced))
    plan = planner.plan(lengths)
    plan.validate(cluster, cost)
    assert planner.defer(lengths) == []   # no outlier: nothing waits
    loads = workloads(plan, planner.cost, forced)
    replicas = 8 // forced
    assert len(loads) <= plan.info["micro_batches"] == micro_batch_count(sum(lengths), max_len, replicas)
    share = planner.cost.marginal_times(np.asarray(lengths, float), planner.cost.units(lengths), forced,
                                        plan.info["recompute"])
    m, heaviest = plan.info["micro_batches"], np.sort(share)[::-1]
    pigeonhole = heaviest[m - 1] + heaviest[m] if len(heaviest) > m else 0.0
    optimum_at_least = max(sum(loads) / m, share.max(), pigeonhole)
    assert max(loads) <= 4 / 3 * optimum_at_least * (1 + 1e-9)


def test_var_length_packing_balances_work_not_tokens():
    # One long document against many short ones in two micro-batches: the short ones fill the
    # other micro-batch past the long one's tokens until their attention + linear work matches.
    cluster, cost = cpu8(memory_gb=2.0)
    lengths = [8_000] + [500] * 120    # the long one does the work of ~72 short ones, in the tokens of 16
    planner = get_planner("wlb-llm", cluster, cost, PlannerOptions(max_len=40_000, degree=4))
    plan = planner.plan(lengths)
    assert plan.info["micro_batches"] == 2
    busy = [mb for _, _, mb in plan.micro_batches() if mb.seq_ids]
    tokens = sorted(sum(plan.lengths[i] for i in mb.seq_ids) for mb in busy)
    loads = workloads(plan, planner.cost, 4)
    assert tokens[1] > 2 * tokens[0]                       # var-length: unequal tokens
    heaviest_short = planner.cost.marginal_times(np.array([500.0]), np.array([500.0 ** 2]), 4, 0.0)[0]
    assert max(loads) - min(loads) <= heaviest_short       # balanced to within one short document


def test_outliers_released_one_per_micro_batch_when_a_level_has_enough():
    max_len, count = 1000, 4
    short, mid, long = 100, 300, 600        # mid in [L_1, L_2), long at least L_2
    assert OUTLIER_LEVELS[0] * max_len <= mid < OUTLIER_LEVELS[1] * max_len <= long
    lengths = [long, short, mid, long, long, short, long, long, mid, short]
    first, delayed = release_outliers(lengths, max_len, count)
    # level 2 holds 5 >= 4: its 4 earliest are released; level 1 holds 2 < 4: both wait
    assert first == [0, 1, 3, 4, 5, 6, 9] and delayed == [2, 7, 8]
    workload = np.asarray(lengths, float) ** 2
    bins, left = greedy_pack(first, lengths, workload, count, capacity=max_len)
    assert not left and sorted(i for b in bins for i in b) == first
    assert sorted(sum(lengths[i] == long for i in b) for b in bins) == [1, 1, 1, 1]


def test_outliers_wait_for_later_steps_until_a_level_fills():
    cluster, cost = cpu8(memory_gb=2.0)
    max_len = 40_000
    step = [30_000, 25_000] + [1_000] * 200   # 2 outliers of level 2; 8 micro-batches need 8
    planner = get_planner("wlb-llm", cluster, cost, PlannerOptions(max_len=max_len, degree=1))
    assert planner.defer(step) == [0, 1]
    held = DeferredSamples()
    trained = [held.admit([((k, i), x) for i, x in enumerate(step)], planner, final=False) for k in range(4)]
    # three steps hold their two, the fourth gathers 8 and releases them, one per micro-batch
    assert [len(t) for t in trained] == [200, 200, 200, 208] and len(held) == 0
    plan = planner.plan([step[i] for _, i in trained[3]])
    plan.validate(cluster, cost)
    outliers = {j for j, (_, i) in enumerate(trained[3]) if i < 2}
    per_micro_batch = [len(outliers & set(mb.seq_ids)) for _, _, mb in plan.micro_batches() if mb.seq_ids]
    assert sorted(per_micro_batch)[-8:] == [1] * 8 and sum(per_micro_batch) == 8


def test_a_batch_planned_alone_trains_its_outliers_in_its_step():
    cluster, cost = cpu8(memory_gb=2.0)
    lengths = [30_000, 25_000] + [1_000] * 200
    plan = get_planner("wlb-llm", cluster, cost, PlannerOptions(max_len=40_000, degree=1)).plan(lengths)
    plan.validate(cluster, cost)
    assert sorted(i for _, _, mb in plan.micro_batches() for i in mb.seq_ids) == list(range(len(lengths)))


def test_the_release_count_is_the_micro_batches_of_what_trains():
    # Held outliers raise the candidates' tokens past one more micro-batch of the replicas; the
    # release is counted on the documents that train, which hold one micro-batch fewer.
    cluster, cost = cpu8(memory_gb=2.0)
    max_len, replicas = 40_000, 8
    lengths = [30_000] * 9 + [1_000] * 60    # 330k tokens: 16 micro-batches, none of the 9 released;
    # then 8 for 8 released (300k tokens): the ninth waits
    planner = get_planner("wlb-llm", cluster, cost, PlannerOptions(max_len=max_len, degree=1))
    assert micro_batch_count(sum(lengths), max_len, replicas) == 16
    delayed = planner.defer(lengths)
    first = [x for i, x in enumerate(lengths) if i not in delayed]
    count = micro_batch_count(sum(first), max_len, replicas)
    assert delayed == [8] and count == 8 and sum(x == 30_000 for x in first) == count


def test_heads_do_not_cap_its_cp_degree():
    # 3 heads: Ulysses stops at degree 1, context parallelism does not.
    cluster, cost = cpu8(THREE_HEADS, memory_gb=0.02)
    longest = cost.max_tokens(1, 1.0) * 3
    lengths = [longest, 2_000, 900, 40]
    plan = get_planner("wlb-llm", cluster, cost, PlannerOptions()).plan(lengths)
    plan.validate(cluster, cost)
    assert {(g.degree, g.cp) for g in plan.waves[0].groups} == {(4, 4)}
    with pytest.raises(InfeasibleError, match="needs context parallelism"):
        get_planner("dcp", cluster, cost, PlannerOptions()).plan(lengths)
