"""`profile.rounds`: a plan's rounds reduced micro-batch by micro-batch and composed as the
simulator composes a step; checked by hand on small rounds and against a real step's timings."""
import pytest

from ballast.profile.rounds import composed_step, rank_waves
from ballast.runtime import MicroBatchRecord, StepResult, WaveTiming


def test_composed_step_reduces_each_micro_batch_then_takes_the_busiest_rank_of_each_wave():
    # rounds[r][k] = rank k's waves; wave 0: rank 0 two micro-batches, rank 1 one; wave 1: one each.
    rounds = [
        [[([1.0, 3.0], 0.1), ([2.0], 0.0)], [([4.5], 0.2), ([1.0], 0.0)]],
        [[([2.0, 1.0], 0.3), ([2.5], 0.0)], [([4.0], 0.0), ([1.5], 0.1)]],
    ]
    # min: wave 0 rank 0 = 1 + 1 + 0.1, rank 1 = 4.0 + 0 -> 4.0; wave 1 rank 0 = 2.0, rank 1 = 1.0 -> 2.0.
    assert composed_step(rounds, "min") == pytest.approx(4.0 + 2.0)
    # median of two rounds is their mean: wave 0 rank 0 = 1.5 + 2.0 + 0.2 = 3.7, rank 1 = 4.25 + 0.1;
    # wave 1 rank 0 = 2.25, rank 1 = 1.25 + 0.05.
    assert composed_step(rounds, "median") == pytest.approx(4.35 + 2.25)
    # Never more than the whole step's fastest round (each part's minimum is at most its share of it).
    whole = [sum(max(sum(s) + rest for s, rest in (rank[w] for rank in round_)) for w in range(2)) for round_ in rounds]
    assert composed_step(rounds, "min") <= min(whole)


def test_composed_step_refuses_rounds_of_different_plans():
    rounds = [[[([1.0, 2.0], 0.0)]], [[([1.0], 0.0)]]]
    with pytest.raises(AssertionError, match="rank 0 ran \\[1, 2\\] micro-batches in wave 0"):
        composed_step(rounds, "min")


def test_rank_waves_splits_a_steps_busy_time_into_its_micro_batches_and_the_rest():
    mbs = [MicroBatchRecord(wave, 2, [i], 10, 0, seconds, None) for i, (wave, seconds) in
           enumerate([(0, 0.25), (0, 0.5), (1, 1.0)])]
    result = StepResult(loss=1.0, tokens=30, waves=[WaveTiming(0.8, 0.1), WaveTiming(1.0, 0.0), WaveTiming(0.01, 0.2)],
                        micro_batches=mbs)
    assert rank_waves(result) == [([0.25, 0.5], pytest.approx(0.05)), ([1.0], 0.0), ([], 0.01)]
