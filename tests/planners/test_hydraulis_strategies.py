"""`hydraulis` on heterogeneous strategies (`planners/hydraulis_strategies.py`): stage 1 against its
own objective and its forced sequences, stage 2's MILP against brute force, its count of
micro-batches against every count it may try, and the choice among strategies against each
strategy planned alone."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ballast.command_line.options import parse_strategies
from ballast.planners.hydraulis_strategies import (COUNTS, HydraulisStrategies, dispatch, greedy_balance, pack,
                                                   solve_balance, stage_seconds)
from ballast.planners.strategy_choice import strategy_planner
from ballast.planners.strategy_prices import StrategyPrices
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape

SHAPE = get_model_shape("gpt-7b")
CLUSTER = get_cluster("h100-16", 16)


@pytest.fixture(scope="module")
def prices() -> StrategyPrices:
    return StrategyPrices(parse_strategies("4x2,1x4,1x4;4x2,4x2;8x1,8x1"), "analytic", SHAPE, CLUSTER)


def objective(c: np.ndarray, stages: list[int], ids: list[list[int]]) -> float:
    """Hydraulis' stage-1 objective of an assignment: the worst sum c + (p - 1) max c."""
    return max((c[j, held].sum() + (stages[j] - 1) * c[j, held].max()) if held else 0.0
               for j, held in enumerate(ids))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(64, 24000), min_size=1, max_size=40), st.integers(0, 3))  # (4,2) holds 24,149 unrecomputed
def test_stage1_places_every_sequence_on_a_pipeline_that_holds_it(lengths, seed):
    strategy = parse_strategies("4x2,1x4,1x4")[0]
    costs = StrategyPrices([strategy], "analytic", SHAPE, CLUSTER).costs[strategy]
    stages = [p.pp for p in strategy.pipelines]
    c = stage_seconds(costs, lengths, stages)
    ids, worst = dispatch(c, stages, seed)
    assert sorted(i for held in ids for i in held) == list(range(len(lengths)))
    for j, held in enumerate(ids):
        assert np.isfinite(c[j, held]).all()
    only = [i for i in range(len(lengths)) if np.isfinite(c[:, i]).sum() == 1]
    assert all(i in ids[int(np.flatnonzero(np.isfinite(c[:, i]))[0])] for i in only)
    assert worst == pytest.approx(objective(c, stages, ids))
    assert dispatch(c, stages, seed) == (ids, worst), "a seed fixes the assignment"


def test_stage1_balances_identical_pipelines():
    c = np.tile(np.array([4.0, 3.0, 3.0, 2.0, 2.0, 2.0]), (2, 1))
    ids, worst = dispatch(c, [1, 1], 0)
    assert worst == 8.0 and sorted(sum(c[0, held]) for held in ids) == [8.0, 8.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=2, max_size=6), st.integers(1, 3), st.data())
def test_stage2_milp_is_optimal_on_small_cases(work, v, data):
    c = np.array(work)
    s = np.array(data.draw(st.lists(st.integers(1, 10), min_size=len(c), max_size=len(c))), dtype=float)
    cap = int(data.draw(st.integers(int(s.max()), int(s.sum()))))
    best = math.inf
    for owner in itertools.product(range(v), repeat=len(c)):
        bins = [[i for i, k in enumerate(owner) if k == b] for b in range(v)]
        if all(s[b].sum() <= cap for b in bins):
            best = min(best, max(c[b].sum() for b in bins))
    solved = solve_balance(c, s, v, cap)
    if best == math.inf:
        assert solved is None
        return
    assert solved is not None and sorted(i for b in solved for i in b) == list(range(len(c)))
    assert all(s[b].sum() <= cap for b in solved)
    assert max(c[b].sum() for b in solved) == pytest.approx(best, rel=1e-6)
    greedy = greedy_balance(c, s, v, cap)
    if greedy is not None:  # a valid packing into at most v, so no better than the optimum
        assert sorted(i for b in greedy for i in b) == list(range(len(c))) and len(greedy) <= v
        assert all(s[b].sum() <= cap for b in greedy) and max(c[b].sum() for b in greedy) >= best - 1e-9


def test_stage2_keeps_the_count_of_least_makespan(prices):
    strategy = prices.strategies[0]
    cost = prices.costs[strategy][1]  # a (1,4) pipeline
    lengths = [512, 900, 2000, 4096, 4096, 8000, 8800, 300, 700, 1200, 3000, 6000]  # (1,4) holds 8,832 unrecomputed
    plan, makespan = pack(cost, 4, lengths)
    plan.validate(strategy.mesh(1, CLUSTER).pool_cluster(strategy.block_cluster(1, CLUSTER)), cost)
    mbs = plan.waves[0].groups[0].micro_batches
    assert all(mb.recompute == 0.0 for mb in mbs), "Hydraulis recomputes nothing"
    c = stage_seconds([cost], lengths, [4])[0]
    assert makespan == pytest.approx((max(c[mb.seq_ids].sum() for mb in mbs) + cost.g) * (3 + len(mbs)))
    tokens = [sum(lengths[i] for i in mb.seq_ids) for mb in mbs]
    assert tokens == sorted(tokens, reverse=True), "micro-batches run largest first"
    least = math.ceil(sum(lengths) / cost.max_tokens(1, 0.0))
    for v in range(least, min(len(lengths), least + COUNTS - 1) + 1):  # no count's greedy packing does better
        bins = greedy_balance(c, np.array(lengths, dtype=float), v, cost.max_tokens(1, 0.0))
        if bins is not None:
            assert makespan <= (max(c[b].sum() for b in bins) + cost.g) * (3 + len(bins)) * (1 + 1e-12)


def test_the_chosen_strategy_has_the_least_makespan(prices):
    rng = np.random.default_rng(0)
    lengths = rng.integers(128, 16000, size=30).tolist()
    chosen = strategy_planner("hydraulis", prices).plan(lengths)
    chosen.validate(CLUSTER, prices.costs[chosen.strategy])
    assert chosen.planner == "hydraulis" and isinstance(strategy_planner("hydraulis", prices), HydraulisStrategies)
    alone = {s: strategy_planner("hydraulis", StrategyPrices([s], "analytic", SHAPE, CLUSTER)).plan(lengths)
             for s in prices.strategies}
    assert chosen.info["makespan_s"] == min(p.info["makespan_s"] for p in alone.values())
    assert chosen.strategy == min(alone, key=lambda s: alone[s].info["makespan_s"])


def test_a_pipeline_of_several_replicas_is_refused():
    prices = StrategyPrices(parse_strategies("1x1x4,2x2"), "analytic", get_model_shape("tiny"), get_cluster("cpu", 8))
    with pytest.raises(ValueError, match=r"Hydraulis' pipelines are one replica each"):
        strategy_planner("hydraulis", prices)
