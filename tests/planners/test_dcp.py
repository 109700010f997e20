"""The `dcp` planner: valid plans everywhere, DCP's profile, DCP-inter and DCP-intra."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast import CostModel, PlannerOptions, get_cluster, get_cost_model, get_model_shape
from ballast.planners import get_planner
from ballast.planners import dcp
from ballast.planners.dcp import MAX_ACCUMULATION, MAX_COUNT_RATIO, bucket_units, bucket_uppers
from ballast.planners.packing import mb_time
from ballast.vocabulary.samples import SampleBatch
from strategies import SMALL, make_cluster, planner_setups
from ballast.pricing.bounds import lower_bound
from ballast.pricing.cost_sources import analytic_cost, get_cost_model

def group_times(plan, cost, wave: int = 0) -> list[float]:
    batch = SampleBatch.of(plan.samples, cost)
    return [sum(mb_time(mb, batch, g.degree, cost) for mb in g.micro_batches)
            for g in plan.waves[wave].groups if g.micro_batches]


def busy_counts(wave) -> list[int]:
    """Each busy group's micro-batch count, lockstep's empty fillers left out."""
    counts = [sum(1 for mb in g.micro_batches if mb.seq_ids) for g in wave.groups]
    return [n for n in counts if n]


@settings(max_examples=60, suppress_health_check=[HealthCheck.filter_too_much])
@given(planner_setups("gpt-7b", 48), st.sampled_from(["inter", "intra", "both"]), st.booleans(), st.booleans())
def test_plans_validate(setup, mode, lockstep, with_max_len):
    cluster, cost, lengths = setup
    max_len = max(lengths) if with_max_len else None
    plan = get_planner("dcp", cluster, cost, PlannerOptions(max_len=max_len, dcp_mode=mode,
                                                            lockstep=lockstep)).plan(lengths)
    plan.validate(cluster, cost)
    assert plan.planner == "dcp" and plan.lockstep == lockstep
    counts = [len(g.micro_batches) for w in plan.waves for g in w.groups if g.micro_batches]
    assert max(counts) <= MAX_ACCUMULATION or lockstep
    # DCP bounds how far apart a wave's accumulation counts are; a group's count does not
    # change its memory, so no budget forces an exception.
    for wave in plan.waves:
        counts = busy_counts(wave)
        assert max(counts) <= MAX_COUNT_RATIO * min(counts), counts


def test_buckets_hold_their_lengths():
    s = np.arange(1, 5000)
    upper = bucket_uppers(s, 4096)
    assert np.all((upper >= s) | (upper == 4096)) and np.all(upper <= 4096)
    assert len(np.unique(upper[(s > 1024) & (s <= 2048)])) == 2  # two buckets per octave


@pytest.mark.parametrize("pattern", ["causal", "full", "spatial-temporal"])
def test_bucket_units_bound_every_member(pattern):
    cost = analytic_cost(dataclasses.replace(SMALL, attention=pattern), make_cluster(1, 8, 8e10))
    batch = SampleBatch.of([300, 4096, (15, 45, 80), (5, 23, 40), (10, 15, 27), (1, 90, 160), 17, (60, 4, 4)], cost)
    uppers, inverse = np.unique(bucket_uppers(np.array(batch.lengths), 10**6), return_inverse=True)
    units = bucket_units(uppers, inverse, batch)
    assert np.all(units[inverse] >= batch.units)
    # A bucket's units are its upper length squared times its densest member's units / tokens^2.
    density = batch.units / np.array(batch.lengths, dtype=float) ** 2
    expected = [uppers[b] ** 2.0 * density[inverse == b].max() for b in range(len(uppers))]
    assert units == pytest.approx(expected)


def test_text_buckets_are_priced_at_their_upper_length_squared():
    cost = analytic_cost(SMALL, make_cluster(1, 8, 8e10))
    batch = SampleBatch.of([1, 2, 3, 100, 1000, 1023, 1025, 40000], cost)
    uppers, inverse = np.unique(bucket_uppers(np.array(batch.lengths), 10**6), return_inverse=True)
    assert bucket_units(uppers, inverse, batch).tolist() == (uppers.astype(float) ** 2).tolist()


def test_profile_maximises_samples_per_device_second():
    cluster = get_cluster("a100-64")
    cost = get_cost_model("auto", get_model_shape("gpt-7b"), cluster)
    planner = get_planner("dcp", cluster, cost)
    uppers = np.array([100, 1024, 6000, 40000, 300000])
    level = 0.0625
    for upper, choice in zip(uppers, planner.profile(uppers, uppers ** 2.0, np.inf, np.array([level]))):
        def rate(d: int) -> float:
            batch = cost.max_tokens(d, level) // upper
            return batch / (d * cost.time([int(upper)] * batch, d, level)) if batch else 0.0
        assert rate(choice.degree) == pytest.approx(max(rate(d) for d in cost.degrees))
        assert choice.batch == cost.max_tokens(choice.degree, level) // upper


def test_profile_caps_micro_batch_time_at_the_target():
    cluster = get_cluster("a100-64")
    cost = get_cost_model("auto", get_model_shape("gpt-7b"), cluster)
    planner = get_planner("dcp", cluster, cost)
    uppers = np.array([256, 4096, 65536])
    for target in (1.0, 3.0):
        for upper, choice in zip(uppers, planner.profile(uppers, uppers ** 2.0, target, np.array([0.0625]))):
            took = cost.time([int(upper)] * choice.batch, choice.degree, 0.0625)
            fastest = min(cost.time([int(upper)], d, 0.0625) for d in cost.degrees
                          if cost.max_tokens(d, 0.0625) >= upper)
            assert took <= target * (1 + 1e-9) or (choice.batch == 1 and took == pytest.approx(fastest))


def _low_memory():
    """A cluster on which the longest allowed sequence needs full recomputation."""
    cluster = make_cluster(2, 4, 2e9)
    cost = analytic_cost(SMALL, cluster)
    max_len = cost.max_tokens(cost.degrees[-1], 1.0)
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(50, 400, 60)] + [max_len // 3, max_len // 2, max_len]
    return cluster, cost, lengths, max_len


def test_intra_turns_recomputation_off_for_short_sequences():
    cluster, cost, lengths, max_len = _low_memory()
    planner = get_planner("dcp", cluster, cost, PlannerOptions(max_len=max_len))
    target = 2 * lower_bound(cost, lengths)
    batch = SampleBatch.of(lengths, cost)
    inter = planner.plan_for_target(batch, max_len, 1.0, target, "inter")
    both = planner.plan_for_target(batch, max_len, 1.0, target, "both")
    assert {mb.recompute for _, _, mb in inter.micro_batches() if mb.seq_ids} == {1.0}
    levels = []
    for _, g, mb in both.micro_batches():
        tokens = sum(both.mb_lengths(mb))
        assert mb.recompute == cost.min_recompute(tokens, g.degree)
        levels.append((max(both.mb_lengths(mb)), mb.recompute))
    assert all(level == 0.0 for longest, level in levels if longest < 400)
    assert max(level for _, level in levels) > 0.0  # the longest still recompute
    busy = lambda p: sum(mb_time(mb, batch, g.degree, cost) for _, g, mb in p.micro_batches())
    assert busy(both) < busy(inter)
    for plan in (inter, both):
        plan.validate(cluster, cost)


@pytest.mark.parametrize("seed", range(4))
def test_inter_balances_group_times(seed):
    cluster = get_cluster("a100-64")
    cost = get_cost_model("auto", get_model_shape("gpt-7b"), cluster)
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6, 1.5, 512), 1, 200000).astype(int).tolist()
    planner = get_planner("dcp", cluster, cost)
    batch = SampleBatch.of(lengths, cost)
    # The first target from 1.5x the bound up that both modes meet in one wave (which one depends
    # on the batch): the balance between groups is compared inside a wave.
    for factor in (1.5, 1.6, 1.7, 1.8):
        target = factor * lower_bound(cost, lengths)
        balanced = planner.plan_for_target(batch, max(lengths), 0.0625, target, "both")
        naive = planner.plan_for_target(batch, max(lengths), 0.0625, target, "intra")
        if len(balanced.waves) == len(naive.waves) == 1:
            break
    assert len(balanced.waves) == len(naive.waves) == 1
    fast, slow = group_times(balanced, cost), group_times(naive, cost)
    assert max(fast) <= max(slow) * (1 + 1e-9)
    assert max(fast) / min(fast) < max(slow) / min(slow)
    # Naive: equal accumulation counts within a degree; balanced: counts follow the times.
    for plan, equal in ((naive, True), (balanced, False)):
        by_degree: dict[int, list[int]] = {}
        for g in plan.waves[0].groups:
            if g.micro_batches:
                by_degree.setdefault(g.degree, []).append(len(g.micro_batches))
        spreads = [max(c) - min(c) for c in by_degree.values()]
        assert (max(spreads) <= 1) if equal else (max(spreads) >= 1)


def test_accumulation_bound_opens_another_wave():
    cluster = make_cluster(1, 2, 4e9)
    cost = analytic_cost(SMALL, cluster)
    lengths = [3000] * 200
    plan = get_planner("dcp", cluster, cost).plan(lengths)
    plan.validate(cluster, cost)
    assert len(plan.waves) > 1
    assert all(len(g.micro_batches) <= MAX_ACCUMULATION for w in plan.waves for g in w.groups)


def test_unknown_mode_and_overlong_sequence_are_errors():
    cluster = make_cluster(1, 4, 8e9)
    cost = analytic_cost(SMALL, cluster)
    with pytest.raises(ValueError, match="dcp_mode"):
        get_planner("dcp", cluster, cost, PlannerOptions(dcp_mode="sideways")).plan([10, 20])
    with pytest.raises(ValueError, match="max_len"):
        get_planner("dcp", cluster, cost, PlannerOptions(max_len=100)).plan([10, 200])


@pytest.mark.parametrize("mode", ["inter", "intra", "both"])
def test_count_ratio_bound_binds(mode, monkeypatch):
    # A sequence that runs alone at SP degree 2 (it needs recomputation at 1) beside short ones
    # that fill a micro-batch each at degree 1: unbounded, the two degree-1 groups take six
    # micro-batches each next to the long one's single one. 7.8 GB: FSDP's 0.846 GB of states and
    # 662,528 B a token without recomputation (278,528 of activations, the loss's 12 B x 32,000)
    # hold 10,496 tokens at degree 1 (one 6000 each), 20,993 at degree 2.
    cluster = make_cluster(1, 4, 7.8e9)
    cost = analytic_cost(SMALL, cluster)
    assert cost.max_tokens(1, 0.0) < 20_000 <= cost.max_tokens(2, 0.0)
    lengths = [20_000] + [6000] * 12
    options = PlannerOptions(max_len=max(lengths), dcp_mode=mode)
    plan = get_planner("dcp", cluster, cost, options).plan(lengths)
    plan.validate(cluster, cost)
    assert all(max(busy_counts(w)) <= MAX_COUNT_RATIO * min(busy_counts(w)) for w in plan.waves)
    monkeypatch.setattr(dcp, "MAX_COUNT_RATIO", 10**6)
    unbounded = get_planner("dcp", cluster, cost, options).plan(lengths)
    assert max(max(busy_counts(w)) / min(busy_counts(w)) for w in unbounded.waves) > MAX_COUNT_RATIO
    assert len(plan.waves) > len(unbounded.waves)  # the cut micro-batches ran in another wave
