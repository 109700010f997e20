"""`DeferredSamples`: what a planner defers trains later, exactly once, within its bound, and a state
saved after any step resumes the same sequence of batches."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.planners.held import MAX_WAIT, DeferredSamples


class RandomDeferral:
    """A planner's `defer` that holds each candidate with probability `share`, from a seeded
    generator whose state is part of the run (a resumed run is given it back)."""

    name = "random"

    def __init__(self, share: float, seed: int):
        self.share, self.rng = share, random.Random(seed)

    def defer(self, samples):
        return [i for i in range(len(samples)) if self.rng.random() < self.share]


def draw(batches: list[list[int]], planner: RandomDeferral, held: DeferredSamples, start: int = 0) -> list[list[int]]:
    """The batches trained from step `start` on; a sample's key is its id, its planned sample its length."""
    return [held.admit([(i, 10 + i) for i in fresh], planner, k == len(batches) - 1)
            for k, fresh in enumerate(batches) if k >= start]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=30), st.floats(0, 1), st.integers(0, 2**16))
def test_every_sample_trains_once_in_draw_order_within_its_wait(sizes, share, seed):
    ids = iter(range(sum(sizes)))
    batches = [[next(ids) for _ in range(n)] for n in sizes]
    planner = RandomDeferral(share, seed)
    trained = draw(batches, planner, DeferredSamples())
    flat = [i for batch in trained for i in batch]
    assert sorted(flat) == list(range(sum(sizes)))      # each once; the last step holds nothing
    assert all(trained), "a step trained nothing"
    drawn_at = {i: k for k, batch in enumerate(batches) for i in batch}
    trained_at = {i: k for k, batch in enumerate(trained) for i in batch}
    assert all(0 <= trained_at[i] - drawn_at[i] <= MAX_WAIT for i in flat)
    for batch in trained:  # held ones first, in the order they were drawn
        assert batch == sorted(batch)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=2, max_size=20), st.floats(0.1, 0.9), st.integers(0, 2**16),
       st.data())
def test_a_state_saved_after_any_step_resumes_the_same_batches(sizes, share, seed, data):
    ids = iter(range(sum(sizes)))
    batches = [[next(ids) for _ in range(n)] for n in sizes]
    whole = draw(batches, RandomDeferral(share, seed), DeferredSamples())
    cut = data.draw(st.integers(1, len(batches) - 1))
    planner, held = RandomDeferral(share, seed), DeferredSamples()
    first = [held.admit([(i, 10 + i) for i in fresh], planner, False) for fresh in batches[:cut]]
    state = held.state_dict()
    resumed = DeferredSamples()
    resumed.load_state_dict(state, [10 + i for i in state["keys"]])
    assert first + draw(batches, planner, resumed, start=cut) == whole


def test_a_planner_that_holds_everything_trains_everything():
    class HoldAll:
        name = "hold-all"

        def defer(self, samples):
            return list(range(len(samples)))

    held = DeferredSamples()
    assert held.admit([(1, 5), (2, 6)], HoldAll(), final=False) == [1, 2] and len(held) == 0


@pytest.mark.parametrize("state", [{"keys": [1], "waited": []}, {"keys": [1], "waited": [0]},
                                   {"keys": [1], "waited": [MAX_WAIT + 1]}, {"keys": "1"}, {}])
def test_a_malformed_state_is_refused(state):
    with pytest.raises(ValueError, match="held samples' state"):
        DeferredSamples().load_state_dict(state, [5] * len(state.get("keys", [])))


def ballast_on(pp: int, **options):
    from ballast.planners import PlannerOptions, get_planner
    from ballast.pricing.cost_sources import get_cost_model
    from ballast.vocabulary.cluster import get_cluster
    from ballast.vocabulary.job_mesh import JobMesh
    from ballast.vocabulary.model_shape import get_model_shape

    cluster = get_cluster("cpu", world_size=4 * pp, device_memory_gb=4.0)
    mesh = JobMesh.of(cluster, pp=pp)
    cost = get_cost_model("analytic", get_model_shape("tiny"), cluster, mesh=mesh)
    return get_planner("ballast", mesh.pool_cluster(cluster), cost, PlannerOptions(**options))


def test_ballast_holds_outliers_under_a_pipeline_only():
    # max_len 4096: level 2 from 2048 tokens; 17,500 tokens over a pool of 4 ranks make 8
    # micro-batches (4 without the outliers): two outliers are too few to release, so they wait,
    # and only where there are stages.
    step = [3000, 2500] + [300] * 40
    assert ballast_on(2, max_len=4096).defer(step) == [0, 1]
    assert ballast_on(1, max_len=4096).defer(step) == []
    assert ballast_on(2, max_len=4096, defer_outliers=False).defer(step) == []
    assert ballast_on(2).defer(step) == []   # no max_len: no levels
