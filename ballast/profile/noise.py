"""How a profile's timing noise grows with a point's duration: the weights of the time fit.

The fit is a weighted least squares, and the weight that gives each point its due is one over the
spread of its measurement. Two kinds of noise set that spread. A change in the host's speed
that holds for a whole measurement (another tenant's job, a frequency step) stretches it
proportionally: spread ~ seconds, the weights are 1/seconds and the fit minimises relative
errors. Short bursts that land independently during a measurement (interrupts, a neighbour's
time slice) add up like a random walk over its duration: spread ~ sqrt(seconds). Which one
dominates is the host's, not the model's: the profiles recorded on the 2-vCPU host spread as
seconds^0.5 (tiny GPT) to seconds^0.9 (stdit-tiny) over their own repeats. Relative weights on
a random-walk host give a 20 ms point's noise the pull of a 2 s point's signal: the tiny GPT's
fit then bent its attention term to its small points and priced 4,096-token micro-batches 5-8%
high, which is where real batches of code files spend their time (`--check`: +3.9% on every
plan). So the exponent is measured, from the profile's own repeats: the slope of log spread
against log seconds, over the fitted points.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .grid import Measurement

RANDOM_WALK, PROPORTIONAL = 0.5, 1.0
"""The exponent's range: the two kinds of noise above. A slope outside it is an estimate's
error (five repeats a point spread loosely), not a third kind of noise."""
MIN_POINTS = 8
"""Points with a measurable spread below which the slope is not trusted (relative weights, as
every profile was fitted before the exponent was measured)."""
MIN_REPEATS = 3


def noise_exponent(measurements: Sequence[Measurement]) -> float:
    """The exponent alpha of spread ~ seconds^alpha, fitted on the points with MIN_REPEATS repeats or
    more and some spread, clipped to [RANDOM_WALK, PROPORTIONAL]; PROPORTIONAL with too few points."""
    rows = [(float(np.median(m.samples)), float(np.std(m.samples, ddof=1)))
            for m in measurements if len(m.samples) >= MIN_REPEATS]
    rows = [(seconds, spread) for seconds, spread in rows if seconds > 0 and spread > 0]
    if len(rows) < MIN_POINTS or len({seconds for seconds, _ in rows}) < 2:
        return PROPORTIONAL
    seconds, spread = np.log(np.array(rows)).T
    slope = float(np.polyfit(seconds, spread, 1)[0])
    return float(np.clip(slope, RANDOM_WALK, PROPORTIONAL))


def fit_weights(measurements: Sequence[Measurement], exponent: float) -> np.ndarray:
    """One over each point's expected spread, up to a constant: seconds^-exponent."""
    return np.array([m.seconds for m in measurements]) ** -exponent
