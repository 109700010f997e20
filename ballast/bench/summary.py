"""From the benchmark's per-slot records to per-planner numbers, the noise and the targets.

Throughput counts the executor's whole step (waves, gradient all-reduce and optimizer; planning
is timed apart: a trainer plans one step ahead). This machine is shared, and another job's burst
slows whichever steps it lands on, so the headline `tokens_per_s` is robust to it: per batch,
the median over rounds of the step time, then total tokens over the sum of those medians.
`tokens_per_s_mean` is the plain total over every measured step.

The cost model predicts the waves only (docs/design.md's step time has no gradient sync or optimizer,
a constant no planner changes), so predictions are compared with the measured waves: per batch,
predicted / measured - 1, then the median over batches. Rounds are reduced by the statistic the
cost model was fitted on (a profile's `--statistic`: its median or its minimum over repeats; the
median for models no profile measured), as `ballast profile --check` does: a model fitted on the
fastest of five repeats predicts the fastest round, not a typical one, and holding it against the
median would count the host's bursts as its error. They are reduced micro-batch by micro-batch and
composed into the step (`profile.rounds.composed_step`: what a profile fitted on single
micro-batches predicts), `prediction_error`; `prediction_error_step` holds the prediction against
the slowest rank's whole waves reduced over rounds, the step as is. Where the cost model is a
profile of this machine, `prediction_error_drift_corrected` holds the prediction scaled by the
machine's drift since the profile (`profile/drift.py`: its points run again in the benchmark's
rounds) against the same composition: reported beside the error as is, never in its place.

Noise is measured, not assumed: every round reruns the same plans on the same batches, so what
changes between rounds is the machine. `run_to_run` is the median over planners of the spread
((max - min) / median) of their tokens/s over rounds; `relative` is the same for their speed
relative to `static` within each round, the noise of the comparisons the targets make. The
ranks' CPU seconds over wall seconds during steps (`cpu_share`; each rank runs one thread) say
how much of a core other jobs left them: near 1 on a quiet machine, less when the ranks waited
for each other or were descheduled.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Sequence

from ..profile.drift import drift_errors
from ..profile.measure import STATISTICS, checked_statistic
from ..profile.rounds import composed_step

PREDICTION_TARGET = 0.15
"""Largest median |predicted / measured - 1| the issue accepts."""
SPEEDUP_TARGET = 1.2
"""`ballast` over `static` in tokens/s."""
WALL_TARGET_S = 900.0
"""A full benchmark's wall time on this machine."""


def _spread(values: Sequence[float]) -> float:
    """(max - min) / median: 0 for a single value."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def timing_summary(mine: list[dict]) -> dict:
    """Throughput of one system's measured records (`round`, `step`, `tokens`, `step_s`,
    `cpu_share` each; see the module docstring): what any system measured on the same schedule
    reports, ballast's planners and a peer alike."""
    rounds: dict[int, list[dict]] = defaultdict(list)
    steps: dict[int, list[dict]] = defaultdict(list)
    for r in mine:
        rounds[r["round"]].append(r)
        steps[r["step"]].append(r)
    per_round = [_throughput(rs) for _, rs in sorted(rounds.items())]
    median_step = [statistics.median(r["step_s"] for r in rs) for rs in steps.values()]
    return dict(
        tokens_per_s=sum(rs[0]["tokens"] for rs in steps.values()) / sum(median_step),
        tokens_per_s_mean=_throughput(mine), tokens_per_s_rounds=per_round, round_spread=_spread(per_round),
        step_s=statistics.median(median_step), cpu_share=statistics.fmean(r["cpu_share"] for r in mine))


def planner_summary(mine: list[dict], statistic: str = "median", drift: float | None = None) -> dict:
    """One planner's measured records summarised, its rounds of a batch reduced by `statistic`
    for the prediction error, and that error with the machine's `drift` (now / at the profile)
    divided out where it was measured (see the module docstring)."""
    steps: dict[int, list[dict]] = defaultdict(list)
    for r in mine:
        steps[r["step"]].append(r)
    reduce = STATISTICS[statistic]
    composed = [dict(predicted_s=rs[0]["predicted_s"], measured_s=composed_step([r["rank_waves"] for r in rs], statistic))
                for rs in steps.values()]
    errors = drift_errors(composed, 1.0)
    corrected = None if drift is None else drift_errors(composed, drift)
    as_is = [rs[0]["predicted_s"] / reduce([r["waves_s"] for r in rs]) - 1.0 for rs in steps.values()]
    busy = sum(sum(r["rank_busy_s"]) for r in mine)
    wait = sum(sum(r["rank_wait_s"]) for r in mine)
    planned = [r["plan_ms"] for r in mine if r["plan_ms"] is not None]
    return dict(
        **timing_summary(mine), waves_s=statistics.median(r["waves_s"] for r in mine),
        predicted_s=statistics.median(r["predicted_s"] for r in mine),
        prediction_error=statistics.median(errors), prediction_abs_error=statistics.median(abs(e) for e in errors),
        prediction_error_step=statistics.median(as_is),
        prediction_abs_error_step=statistics.median(abs(e) for e in as_is),
        prediction_error_drift_corrected=None if corrected is None else statistics.median(corrected),
        prediction_abs_error_drift_corrected=None if corrected is None else statistics.median(map(abs, corrected)),
        idle_fraction=wait / max(1e-12, busy + wait),
        sync_optimizer_s=statistics.median(r["sync_s"] + r["optimizer_s"] for r in mine),
        plan_ms=statistics.fmean(planned), plan_ms_max=max(planned),
        waves=statistics.fmean(r["waves"] for r in mine),
        micro_batches=statistics.fmean(r["micro_batches"] for r in mine),
        degrees=sorted({d for r in mine for d in r["degrees"]}),
        degree_splits=sorted({tuple(split) for r in mine for split in r["degree_splits"]}),
        recomputed=statistics.fmean(r["recomputed"] for r in mine),
        loss_last=mine[-1]["loss"])


def _throughput(records: list[dict]) -> float:
    return sum(r["tokens"] for r in records) / sum(r["step_s"] for r in records)


def paired_speedups(records: list[dict], baseline: str) -> dict[str, float]:
    """Per planner, the median over (round, step) of baseline step time / its step time: the
    same batch, moments apart, so drift cancels better than in a ratio of totals."""
    by_slot = {(r["round"], r["step"], r["planner"]): r["step_s"] for r in records if r["round"] >= 0}
    out = {}
    for name in {r["planner"] for r in records}:
        ratios = [by_slot[(rd, k, baseline)] / s for (rd, k, p), s in by_slot.items()
                  if p == name and (rd, k, baseline) in by_slot]
        if ratios:
            out[name] = statistics.median(ratios)
    return out


def same_batches(records: list[dict]) -> bool:
    """Every rank trained on the same tokens in a slot, and every planner on the same tokens at
    a batch index (by the tokens' checksum each rank computed)."""
    by_batch: dict[int, set[float]] = defaultdict(set)
    for r in records:
        by_batch[r["batch"]].update(r["digests"])
    return all(len(digests) == 1 for digests in by_batch.values())


def loss_spread(records: list[dict]) -> float:
    """Largest relative difference of the planners' losses on one (round, step): the copies of
    the model train alike when every plan computes the same gradient."""
    by_slot: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in records:
        by_slot[(r["round"], r["step"])].append(r["loss"])
    return max((max(v) - min(v)) / abs(statistics.median(v)) for v in by_slot.values())


def summarise(records: list[dict], planners: Sequence[str], baseline: str = "static",
              statistic: str = "median", drift: float | None = None) -> dict:
    """Per-planner summaries (with speed relative to `baseline`; predictions held against the
    rounds reduced by `statistic`, and with the machine's `drift` since the profile divided out
    where it was measured), the noise and the data checks."""
    checked_statistic(statistic)
    measured = [r for r in records if r["round"] >= 0]
    out = {name: planner_summary([r for r in measured if r["planner"] == name], statistic, drift)
           for name in planners}
    paired = paired_speedups(measured, baseline) if baseline in out else {}
    for name, s in out.items():
        s["vs_static"] = s["tokens_per_s"] / out[baseline]["tokens_per_s"] if baseline in out else None
        s["vs_static_paired"] = paired.get(name)
    rounds = len({r["round"] for r in measured})
    noise = dict(rounds=rounds, run_to_run=None, relative=None,
                 cpu_share=statistics.fmean(r["cpu_share"] for r in measured))
    if rounds > 1:
        noise["run_to_run"] = statistics.median(s["round_spread"] for s in out.values())
    if rounds > 1 and baseline in out and len(out) > 1:
        base = out[baseline]["tokens_per_s_rounds"]
        for s in out.values():
            s["vs_static_rounds"] = [x / b for x, b in zip(s["tokens_per_s_rounds"], base)]
        noise["relative"] = statistics.median(_spread(s["vs_static_rounds"]) for n, s in out.items() if n != baseline)
    return dict(planners=out, noise=noise, same_batches=same_batches(records), loss_spread=loss_spread(measured),
                prediction_statistic=statistic)


def targets(summary: dict, seconds: float) -> dict:
    """The issue's targets, each with what was measured and whether it holds."""
    planners, noise = summary["planners"], summary["noise"]["relative"] or 0.0
    out: dict = {"wall_seconds": dict(value=seconds, target=WALL_TARGET_S, met=seconds < WALL_TARGET_S)}
    errors = {name: s["prediction_abs_error"] for name, s in planners.items()}
    out["prediction"] = dict(abs_errors=errors, target=PREDICTION_TARGET,
                             met=all(e <= PREDICTION_TARGET for e in errors.values()))
    if "ballast" in planners and "static" in planners:
        speedup = planners["ballast"]["vs_static"]
        out["ballast_vs_static"] = dict(value=speedup, target=SPEEDUP_TARGET, met=speedup >= SPEEDUP_TARGET)
    others = {name: planners["ballast"]["tokens_per_s"] / s["tokens_per_s"]
              for name, s in planners.items() if name != "ballast"} if "ballast" in planners else {}
    if others:
        worst = min(others, key=others.get)
        out["ballast_vs_others"] = dict(worst=worst, ratio=others[worst], ratios=others, noise=noise,
                                        met=others[worst] >= 1.0 - noise)
    return out
