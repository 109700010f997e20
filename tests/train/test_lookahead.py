"""Rank 0's data and planning (`Lookahead`) with a planner that holds samples for later steps:
every sample of an epoch trains once within it, and a data state saved after any step resumes
the same batches (rank 0's part of resuming bit-identical; `test_run` trains it for real)."""
from __future__ import annotations

import pytest
from corpora import jsonl_corpus

from ballast.dataset import BatchStream, build_corpus
from ballast.planners import PlannerOptions, get_planner
from ballast.planners.held import DeferredSamples
from ballast.pricing.cost_sources import analytic_cost
from ballast.train.ahead import Lookahead, load_data_state
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.model_shape import get_model_shape

MAX_LEN, BUDGET = 256, 1024


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    spec, cache = jsonl_corpus(tmp_path_factory.mktemp("corpus"), documents=40, longest=600, seed=0)
    return build_corpus(spec, cache_dir=cache, progress=False)


def parts(corpus):
    cluster = get_cluster("cpu", world_size=2, device_memory_gb=1.0)
    planner = get_planner("wlb-llm", cluster, analytic_cost(get_model_shape("tiny"), cluster),
                          PlannerOptions(max_len=MAX_LEN))
    return BatchStream(corpus, BUDGET, MAX_LEN, 0), planner, DeferredSamples()


def run(lookahead: Lookahead, steps: range) -> list:
    return [lookahead.get(k) for k in steps]


@pytest.mark.parametrize("ahead", [False, True])
def test_held_samples_train_once_within_their_epoch(corpus, ahead):
    stream, planner, held = parts(corpus)
    steps = 20  # about three epochs of 7 batches
    items = run(Lookahead(stream, planner, held, steps, ahead), range(steps))
    assert any(item.held for item in items), "wlb-llm held nothing: the test would prove nothing"
    epochs = sorted({item.batch.epoch for item in items})
    assert len(epochs) >= 3
    for epoch in epochs[:-1]:  # the last may be unfinished
        ids = [i for item in items if item.batch.epoch == epoch for i in item.batch.sample_ids]
        assert sorted(ids) == list(range(stream.num_samples))
    for item in items:
        assert item.plan.lengths == item.batch.lengths
        assert len(item.data_state["held"]["keys"]) == item.held


def test_a_data_state_saved_after_any_step_resumes_the_same_batches(corpus):
    steps = 12
    whole = run(Lookahead(*parts(corpus), steps, False), range(steps))
    for cut in range(1, steps):
        stream, planner, held = parts(corpus)
        load_data_state(stream, held, whole[cut - 1].data_state)
        resumed = run(Lookahead(stream, planner, held, steps, False), range(cut, steps))
        assert [r.batch.sample_ids for r in resumed] == [w.batch.sample_ids for w in whole[cut:]]
        assert [r.held for r in resumed] == [w.held for w in whole[cut:]]


def test_a_data_state_without_held_samples_and_a_bad_one(corpus):
    stream, planner, held = parts(corpus)
    state = stream.state_dict()  # saved before samples could be held: none held
    load_data_state(stream, held, state)
    assert len(held) == 0
    with pytest.raises(ValueError, match="held samples must be sample ids of this stream"):
        load_data_state(stream, held, {**state, "held": {"keys": [stream.num_samples], "waited": [1]}})
