"""How planners weigh a group's micro-batches for a pipeline of p equal stages (docs/design.md,
section 6, *Pipelines*): what their 1F1B step costs, estimated, and the order they run in.

Under 1F1B a group's micro-batches fill the pipeline one after another: its step is a stage's
share of their seconds plus a warm-up and a cool-down through the other p - 1 stages. With m
equal micro-batches of t seconds (the cost model's, the whole model's) the step is
(m + p - 1) t / p exactly; with unequal ones the steady state also stalls where a long one
follows short ones. `pipelined_seconds` prices the bubble at the longest micro-batch, which
is exact for equal ones and charges a packing for the outlier that sets the stalls, so that
planners trade more micro-batches (a shorter bubble, g each) against fewer. The timeline then
times the plan exactly (`pipeline.one_f_one_b_parts`).

The order: the bubble's warm-up is the first micro-batch's forwards through the stages and the
cool-down the last one's backwards, and a long micro-batch between short ones stalls the
stages after it less than one at either end. `pipeline_order` runs the shortest first, the
second shortest last, and the rest rising to the longest in the middle and falling again: on
random lognormal micro-batches (p = 2 and 4, m = 3 to 6) its step was 1.4% above the best of
every permutation on average (6.2% at worst), against 3.4% (10.5%) for shortest first then
longest to shortest, and 4.2% (12.9%) for shortest to longest.
"""
from __future__ import annotations

from typing import Sequence


def pipelined_seconds(seconds: Sequence[float], stages: int) -> float:
    """A group's micro-batches of these seconds through `stages` equal stages, estimated, in the
    cost model's seconds (p times a stage's): their sum, and p - 1 of the longest for the
    warm-up and cool-down. Their sum alone without a pipeline (p = 1)."""
    return sum(seconds) + (stages - 1) * max(seconds, default=0.0)


def pipeline_order(seconds: Sequence[float]) -> list[int]:
    """Indices of micro-batches of these seconds in the order a pipeline runs them best
    (module docstring): the shortest first, the second shortest last, the longest in the middle."""
    rising = sorted(range(len(seconds)), key=lambda i: (seconds[i], i))
    return rising[0::2] + rising[1::2][::-1]
