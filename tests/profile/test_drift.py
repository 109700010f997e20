"""The check's machine drift (`profile/drift.py`): the profile's full-depth points measured again,
reduced as the profile reduced them, and the plans' error with the drift divided out."""
from __future__ import annotations

import pytest

from ballast.pricing.cost import CostModel
from ballast.vocabulary.model_shape import get_model_shape
from ballast.profile.drift import REFERENCE_POINTS, drift_errors, machine_drift, reference_points
from ballast.profile.grid import Measurement, Point

TINY = get_model_shape("tiny")


def measurement(layers: int, length: int, seconds: float) -> Measurement:
    return Measurement(point=Point(layers, (length,), 1, 0), seconds=seconds, comm_seconds=0.0, comm_calls=0,
                       comm_bytes=0, activation_bytes=1, shard_tokens=length)


def test_reference_points_are_the_longest_full_depth_measurements():
    full = [measurement(TINY.layers, 64 * (i + 1), 0.1 * (i + 1)) for i in range(REFERENCE_POINTS + 2)]
    shallow = [measurement(1, 4096, 9.0)]  # a reduced depth: not the model the check runs
    cost = CostModel(source="profiled", model="tiny", a=1e-9, b=1e-6, g=0.0, bandwidth={}, bytes_per_token=0.0,
                     act_per_token=1.0, states=0.0, device_memory=1e9, layers=TINY.layers, heads=TINY.heads,
                     kv_heads=TINY.kv_heads, world_size=2,
                     fit={"measurements": [m.to_dict() for m in shallow + full]})
    got = reference_points(cost, TINY)
    assert [m.seconds for m in got] == pytest.approx([0.1 * i for i in range(REFERENCE_POINTS + 2, 2, -1)])
    assert reference_points(CostModel.from_dict({**cost.to_dict(), "fit": {}}), TINY) == []


def test_drift_is_the_median_ratio_of_the_profiles_reduction_and_divides_out():
    references = [measurement(TINY.layers, 256, 1.0), measurement(TINY.layers, 512, 2.0),
                  measurement(TINY.layers, 1024, 4.0)]
    # Two ranks, three rounds: the slowest rank, then the median over rounds (as `combine`).
    seconds = {0: [(1.1, 1.3), (1.2, 1.2), (5.0, 5.0)], 1: [(2.0, 2.0), (2.2, 2.2), (2.4, 2.4)],
               2: [(3.0, 3.0), (3.2, 3.2), (3.4, 3.4)]}
    drift = machine_drift(references, [seconds[i] for i in range(3)], "median")
    assert [p["ratio"] for p in drift["points"]] == pytest.approx([1.3, 1.1, 0.8])  # the mean would give 1.2
    assert drift["points"][0]["rounds_s"] == pytest.approx([1.3, 1.2, 5.0])
    assert drift["ratio"] == pytest.approx(1.1)
    assert machine_drift(references, [seconds[i] for i in range(3)], "min")["ratio"] == pytest.approx(1.0)  # 1.3, 1.0, 0.75
    assert machine_drift([], [], "median") is None
    with pytest.raises(ValueError):  # a reference point without its rounds is a bug, not a drift of 1
        machine_drift(references, [seconds[0]], "median")
    # A plan predicted 1.0 s, measured 1.1 s on a machine 10% slower than at the profile: exact.
    assert drift_errors([{"predicted_s": 1.0, "measured_s": 1.1}], drift["ratio"]) == pytest.approx([0.0])
