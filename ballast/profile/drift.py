"""How much faster or slower the machine ran during `--check` than during the profile it checks.

A check measures its plans minutes or hours after the profile, and a shared host's speed moves
in between: on the 2-CPU machines ballast is developed on, the same profile's check gave a
video DiT's plans a median error of -10% in one run and +10% in the next, whole-run shifts that
no cost model can be blamed for, and that a plan's own rounds (`check.beyond_noise`) do not
show, since every round of the check shares them.

So the check runs the profile's full-depth points again (`reference_points`: the extrapolation
checks, or grid points where the profile ran the full depth, the longest few) as one-wave plans,
in the same shuffled rounds as its plans, reduces them as the profile did (the slowest rank's
micro-batch seconds, then the profile's statistic over rounds) and reports the drift: the
median over those points of now / then. The plans' error with the drift divided out
(`drift_errors`) is reported beside the error as is; it never replaces it (the targets of issue
#31 are on the error as is).
"""
from __future__ import annotations

import statistics
from typing import Sequence

from ..pricing.cost import CostModel
from ..vocabulary.model_shape import ModelShape
from .grid import Measurement
from .measure import STATISTICS, slowest_rank


REFERENCE_POINTS = 6
"""At most this many reference points: the longest (closest to a check's steps) suffice."""


def reference_points(cost: CostModel, shape: ModelShape) -> list[Measurement]:
    """The profile's longest measurements at the model's full depth, at most REFERENCE_POINTS
    (none if it profiled no such point: then the check reports no drift)."""
    full = [m for m in map(Measurement.from_dict, cost.fit.get("measurements", [])) if m.point.layers == shape.layers]
    return sorted(full, key=lambda m: -m.seconds)[:REFERENCE_POINTS]


def machine_drift(references: Sequence[Measurement], seconds: Sequence[Sequence[Sequence[float]]],
                  statistic: str) -> dict | None:
    """Each reference point's seconds now over its profiled seconds, and their median.

    seconds[i][r][k]: reference point i's micro-batch seconds on rank k in round r (the
    executor's seconds of the rank's micro-batch, which the profile's `seconds` are too: not the
    wave's busy time, which adds the barrier and the loop around the micro-batch)."""
    if not references:
        return None
    rows = []
    for reference, rounds in zip(references, seconds, strict=True):
        slowest = [slowest_rank(ranks) for ranks in rounds]
        now = STATISTICS[statistic](slowest)
        rows.append(dict(point=reference.point.label(), profiled_s=reference.seconds, check_s=now,
                         ratio=now / reference.seconds, rounds_s=slowest))
    return dict(ratio=statistics.median(r["ratio"] for r in rows), points=rows)


def how_much(ratio: float) -> str:
    """A drift ratio (now / at the profile) in words: "3.1% slower", "0.4% faster"."""
    return f"{abs(ratio - 1):.1%} {'slower' if ratio > 1 else 'faster'}"


def drift_errors(rows: Sequence[dict], ratio: float) -> list[float]:
    """Each plan's step-time error with the machine's drift divided out: the prediction scaled
    by how much slower (ratio > 1) or faster the machine ran than during the profile."""
    return [r["predicted_s"] * ratio / r["measured_s"] - 1.0 for r in rows]
