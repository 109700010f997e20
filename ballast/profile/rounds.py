"""A plan's measured rounds reduced to one step time micro-batch by micro-batch, as a profile
reduces its points.

`ballast profile` times one micro-batch per point and reduces the point's rounds by its statistic
(the median or the fastest of its repeats); a model fitted on those predicts each micro-batch's
reduced time, and a step's prediction composes them (`timeline.py`: a rank's micro-batches of a
wave run one after another, the wave ends with its busiest rank, the waves follow each other).
The whole step's rounds reduced the same way estimate something else once a step has many
micro-batches: its fastest round is a round in which no burst of the host landed on any of them,
rarer the more there are, so the fastest of five still carries bursts that a one-micro-batch
point's fastest does not. On the 2-vCPU host, bucket's 12-micro-batch video steps took 3-9%
longer in their fastest round than the sum of their micro-batches' fastest rounds, static's
4-micro-batch steps 1-2%, in the same runs -- an error the bench blamed on the model.

`composed_step` reduces every micro-batch's seconds, and each rank's time in a wave outside its
micro-batches, over rounds by the statistic, then composes the step as the simulator does. It is
the measurement the prediction is about; `ballast bench` and `ballast profile --check` hold their
predictions against it and report the whole step reduced (the step as is) beside it. It leaves
out only the barrier that ends a wave, which the model does not price either.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .measure import STATISTICS

if TYPE_CHECKING:
    from ..runtime import StepResult

RankWave = tuple[list[float], float]
"""One rank's wave in one step: its micro-batches' seconds in the order it ran them, and the rest
of its busy time (making shards of empty micro-batches, the loop around them)."""


def rank_waves(result: StepResult) -> list[RankWave]:
    """This rank's waves of a step, as `composed_step` takes them (through a pipeline the step's
    one timing, the schedule, holds every micro-batch: its waves are not barriers there)."""
    seconds: list[list[float]] = [[] for _ in result.waves]
    for mb in result.micro_batches:
        seconds[mb.wave if len(result.waves) > 1 else 0].append(mb.seconds)
    return [(s, max(0.0, wave.busy - sum(s))) for s, wave in zip(seconds, result.waves)]


def micro_batch_seconds(result: StepResult) -> float:
    """This rank's seconds in its micro-batches of a step (what a one-wave profile point measures)."""
    return sum(mb.seconds for mb in result.micro_batches)


def composed_step(rounds: Sequence[Sequence[Sequence[RankWave]]], statistic: str) -> float:
    """The step time of one plan from its rounds, `rounds[r][k]` = rank k's waves in round r
    (`rank_waves`): per rank and wave, each micro-batch's seconds and the rest reduced over
    rounds by `statistic` and summed; per wave, its busiest rank; the waves summed."""
    reduce = STATISTICS[statistic]
    ranks, waves = len(rounds[0]), len(rounds[0][0])
    total = 0.0
    for w in range(waves):
        busiest = 0.0
        for k in range(ranks):
            runs = [round_[k][w] for round_ in rounds]
            counts = {len(seconds) for seconds, _ in runs}
            assert len(counts) == 1, f"rank {k} ran {sorted(counts)} micro-batches in wave {w} across rounds"
            micro_batches = sum(reduce([seconds[m] for seconds, _ in runs]) for m in range(counts.pop()))
            busiest = max(busiest, micro_batches + reduce([rest for _, rest in runs]))
        total += busiest
    return total
