"""ballast's group estimates: the swap filter against the estimates it stands in for."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import ballast
from ballast.planners.ballast.estimate import GroupEstimates
from ballast.vocabulary.samples import SampleBatch

# A model and cluster whose groups recompute at the lengths drawn below (gpt-7b on 8 A100s at
# up to 64k tokens a sample), so the estimates' memory term, which the filter bounds from
# below by zero growth, is in play; degrees 1-8 at their default splits, some with CP.
CLUSTER = ballast.get_cluster("a100-8")
COST = ballast.get_cost_model("auto", ballast.get_model_shape("gpt-7b"), CLUSTER)

samples = st.one_of(st.integers(1, 65536),
                    st.tuples(st.integers(1, 16), st.integers(1, 32), st.integers(1, 64)))


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(samples, min_size=4, max_size=40), st.lists(st.sampled_from([1, 2, 4, 8]), min_size=2, max_size=5),
       st.data())
def test_the_swap_filter_keeps_every_swap_that_ends_below_the_limit(drawn, degrees, data):
    # `may_swap_below` may keep pairs that fail; it must never drop one that succeeds, or the
    # local search misses a swap it would have made. The exact check: both groups' estimates
    # after the swap (`GroupEstimates.changed`), for every pair and a limit drawn near them.
    batch = SampleBatch.of(drawn, COST)
    tokens = np.asarray(batch.lengths, dtype=np.float64)
    span = batch.units / tokens
    degrees = np.asarray(degrees)
    loads = GroupEstimates(COST, degrees, [COST.catalogue.split(int(d)) for d in degrees])
    owner = np.asarray(data.draw(st.lists(st.integers(0, len(degrees) - 1), min_size=len(drawn),
                                          max_size=len(drawn))))
    for i, j in enumerate(owner):
        loads.move(int(j), float(tokens[i]), float(span[i]))
    slow = int(data.draw(st.integers(0, len(degrees) - 1)))
    mine, others = np.flatnonzero(owner == slow), np.flatnonzero(owner != slow)
    if not len(mine) or not len(others):
        return
    left = loads.changed(np.full(len(mine), slow), removed=(tokens[mine], span[mine]))
    ours, theirs = (tokens[mine][:, None], span[mine][:, None]), (tokens[others][None, :], span[others][None, :])
    after = np.maximum(loads.changed(np.full((len(mine), len(others)), slow), ours, theirs),
                       loads.changed(owner[others][None, :], theirs, ours))
    limit = float(np.quantile(after, data.draw(st.floats(0.0, 1.0)))) * data.draw(st.sampled_from([1.0, 1.0 + 1e-12]))
    kept = loads.may_swap_below(slow, left, owner[others], (tokens[mine], span[mine]),
                                (tokens[others], span[others]), limit)
    missed = (after < limit) & ~kept
    assert not missed.any(), f"pairs {np.argwhere(missed)[:3].tolist()} end below {limit} but were dropped"


def test_the_swap_filter_drops_the_swaps_of_a_balanced_wave():
    # Its point: in a wave of many sequences evenly spread, almost no swap shortens the slowest
    # group by the search's least gain, and the filter drops those pairs unpriced.
    lengths = np.random.default_rng(0).integers(100, 8192, size=400)
    batch = SampleBatch.of(lengths.tolist(), COST)
    tokens = np.asarray(batch.lengths, dtype=np.float64)
    span = batch.units / tokens
    degrees = np.full(8, 1)
    loads = GroupEstimates(COST, degrees, [1] * 8)
    members = loads.fill(list(np.argsort(-tokens)), tokens[np.argsort(-tokens)].tolist(),
                         span[np.argsort(-tokens)].tolist(), [0] * len(tokens), [0] * 8)
    owner = np.empty(len(tokens), dtype=np.int64)
    for j, seqs in enumerate(members):
        owner[seqs] = j
    slow = int(np.argmax(loads.current()))
    mine, others = np.flatnonzero(owner == slow), np.flatnonzero(owner != slow)
    left = loads.changed(np.full(len(mine), slow), removed=(tokens[mine], span[mine]))
    kept = loads.may_swap_below(slow, left, owner[others], (tokens[mine], span[mine]),
                                (tokens[others], span[others]), loads.current()[slow] * (1.0 - 1e-3))
    assert kept.mean() < 0.1  # 6.2% as drawn
