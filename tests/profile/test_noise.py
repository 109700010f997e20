"""The time fit's weights follow the profile's own noise (ballast/profile/noise.py): the exponent of
spread ~ seconds^alpha is recovered from repeats, clipped to the two kinds of noise, and on a host
whose bursts add up over a point's duration it keeps a misfit of the model's form off the long
micro-batches, where relative weights put it."""
from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import pytest

from ballast.profile import fit as fit_module
from ballast.profile.fit import fit
from ballast.profile.grid import Measurement, Point
from ballast.profile.noise import MIN_POINTS, PROPORTIONAL, RANDOM_WALK, fit_weights, noise_exponent
from ballast.profile.profiler import state_bytes
from ballast.profile.residuals import prediction_errors

from synthetic_measurements import synthetic
from test_profile import TINY, TRUE, grid, layer_bytes


def with_repeats(measured: list[Measurement], exponent: float, scale: float, seed: int,
                 repeats: int = 5) -> list[Measurement]:
    """Each measurement repeated with noise of spread scale x seconds^exponent, reduced by the median."""
    rng = np.random.default_rng(seed)
    out = []
    for m in measured:
        samples = list(m.seconds + scale * m.seconds ** exponent * rng.standard_normal(repeats))
        out.append(dataclasses.replace(m, seconds=statistics.median(samples), samples=samples))
    return out


@pytest.mark.parametrize("exponent", [0.5, 0.75, 1.0])
def test_the_exponent_is_recovered_from_the_repeats(exponent):
    measured = with_repeats(synthetic(grid(), TRUE), exponent, scale=0.02, seed=3)
    # Five repeats a point estimate each spread within about a third of itself; over ~200 points
    # spanning three decades of seconds the slope's error is a few hundredths.
    assert noise_exponent(measured) == pytest.approx(exponent, abs=0.08)


def test_a_slope_outside_the_two_kinds_of_noise_is_clipped():
    exact = synthetic(grid(), TRUE)
    assert noise_exponent(with_repeats(exact, 0.1, scale=0.002, seed=1)) == RANDOM_WALK
    assert noise_exponent(with_repeats(exact, 1.5, scale=0.02, seed=1)) == PROPORTIONAL


def test_without_enough_repeated_points_the_weights_stay_relative():
    exact = synthetic(grid(), TRUE)
    assert noise_exponent(exact) == PROPORTIONAL  # no repeats recorded
    few = with_repeats(exact[:MIN_POINTS - 1], 0.5, scale=0.02, seed=0) + exact[MIN_POINTS:]
    assert noise_exponent(few) == PROPORTIONAL
    two = with_repeats(exact, 0.5, scale=0.02, seed=0, repeats=2)
    assert noise_exponent(two) == PROPORTIONAL
    point = Point(1, (128,), 1, 0)
    flat = [Measurement(point, 1.0, 0.0, 0, 0.0, 1.0, 128, samples=[1.0, 1.0, 1.0])] * 20
    assert noise_exponent(flat) == PROPORTIONAL  # no spread to measure


def test_weights_are_one_over_the_expected_spread():
    measured = synthetic([Point(1, (n,), 1, 0) for n in (128, 4096)], TRUE)
    w = fit_weights(measured, 0.5)
    assert w == pytest.approx([m.seconds ** -0.5 for m in measured])
    assert fit_weights(measured, 1.0) == pytest.approx([1 / m.seconds for m in measured])


def test_measured_weights_keep_a_misfit_off_the_long_micro_batches(monkeypatch):
    """The tiny GPT's case: the model's form cannot meet every point (here the 4,096-token points
    run 6% below what the rest of the grid implies), and the host's bursts add up over a point's
    duration (its repeats spread as seconds^0.5: a 4 ms point 16%, a 1 s point 1%). Relative
    weights let the many short points, whose noise that is, hold the compromise and leave the
    long points high; weights from the measured exponent trust the long points as their spread
    says, and price them closer. The same measurements fitted both ways; their times carry no
    noise, so the comparison is exact (the repeats only set the exponent)."""
    exact = synthetic(grid(), TRUE)
    misfit = [dataclasses.replace(m, seconds=m.seconds * (0.94 if m.point.tokens == 4096 else 1.0)) for m in exact]
    repeated = with_repeats(misfit, 0.5, scale=0.01, seed=5)
    measured = [dataclasses.replace(r, seconds=m.seconds) for r, m in zip(repeated, misfit)]
    assert noise_exponent(measured) == pytest.approx(0.5, abs=0.08)
    long_points = [m for m in measured if m.point.tokens == 4096]

    def median_long_error() -> float:
        got = fit(measured, layer_bytes(4))
        at = {depth: got.cost_model(dataclasses.replace(TINY, layers=depth), 4, 1e10, state_bytes(TINY))
              for depth in (1, 2)}
        return statistics.median(abs(row["time_error"]) for row in prediction_errors(long_points, at))

    measured_weights = median_long_error()
    monkeypatch.setattr(fit_module, "noise_exponent", lambda _: PROPORTIONAL)
    relative_weights = median_long_error()
    assert measured_weights < 0.8 * relative_weights, (measured_weights, relative_weights)
