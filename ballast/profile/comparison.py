"""`ballast profile --check`'s comparison: each plan's prediction beside what its rounds
measured, the summary of their errors, the table and the scatter plot (`check.py` runs them)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

import numpy as np
from rich.table import Table

from ..plans.plan import Plan
from ..plans.timeline import simulate
from ..pricing.cost import CostModel
from ..pricing.pipeline import stage_activation_bytes
from .context import runs_context, splits_used
from .measure import STATISTICS, core_share
from .residuals import error_summary
from .rounds import composed_step


def as_executed(plan: Plan) -> Plan:
    """The plan as this runtime runs it: parameters are replicated, so nothing holds groups in
    lockstep and the empty micro-batches that pad lockstep plans run nothing (see executor)."""
    executed = Plan.from_dict(plan.to_dict())
    executed.lockstep = False
    for wave in executed.waves:
        for group in wave.groups:
            group.micro_batches = [mb for mb in group.micro_batches if mb.seq_ids]
    return executed


def predicted_activation(plan: Plan, cost: CostModel) -> float:
    """Peak bytes one micro-batch saves for backward per device over the plan's micro-batches,
    as the runtime's meter sees them: without the loss's [tokens, vocab] tensors
    (`DeviceMemory.loss_per_token`), which it counts apart; under PP on any stage (its share of
    the layers, the head's on the last)."""
    loss = cost.device.loss_per_token if cost.device is not None else 0.0
    p = cost.stages.count if cost.stages is not None else 1
    return max(stage_activation_bytes(cost, plan.mb_samples(mb), group.degree, mb.recompute, group.cp, k, p)
               - (k == p - 1) * loss * sum(plan.mb_lengths(mb)) / group.degree
               for _, group, mb in plan.micro_batches() if mb.seq_ids for k in range(p))


def beyond_noise(predicted: float, samples: Sequence[float], measured: float) -> float:
    """The part of a plan's error predicted / measured - 1 that its own rounds do not explain:
    0 where the prediction lies between its fastest and slowest round, else the distance to the
    nearer of them, relative to the measurement (signed as the error). `compare_plans` passes the
    whole step's rounds and the step composed of every micro-batch's fastest round, the fastest
    the plan was seen to run."""
    low, high = min(samples), max(samples)
    if predicted > high:
        return (predicted - high) / measured
    return (predicted - low) / measured if predicted < low else 0.0


def compare_plans(plans: list[Plan], cost: CostModel, per_rank: list[list[list[dict]]],
                  statistic: str, pool_size: int | None = None) -> list[dict]:
    """Each plan's prediction next to its measurement: its micro-batches reduced over rounds by
    `statistic` and composed into the step (`rounds.composed_step`; through a pipeline the step
    as is), and the whole step as is (the worst rank's waves of each round, `samples_s`, reduced
    by `statistic`). The plans are over `pool_size` ranks (None: the profile's)."""
    pool_size = pool_size or cost.world_size
    rows = []
    for i, plan in enumerate(plans):
        rounds = list(zip(*(rank[i] for rank in per_rank)))
        samples = [max(r["waves"] for r in ranks) for ranks in rounds]
        step = STATISTICS[statistic](samples)
        # Through a pipeline the step is its schedule, bubble and waits included, which a sum of
        # micro-batches composed per rank leaves out: there the measurement is the step as is.
        composed = {name: STATISTICS[name](samples) if cost.stages is not None else
                    composed_step([[r["rank_waves"] for r in ranks] for ranks in rounds], name)
                    for name in STATISTICS}
        measured, act = composed[statistic], max(r["activation"] for ranks in rounds for r in ranks)
        # The waves: what the rounds measure (the sync and optimizer after them are `overhead`).
        predicted = simulate(as_executed(plan), cost, pool_size).waves_time
        predicted_act = predicted_activation(plan, cost)
        rows.append(dict(planner=plan.planner, sequences=len(plan.lengths), tokens=plan.tokens,
                         longest=max(plan.lengths), waves=len(plan.waves), degrees=plan.degrees_used(),
                         splits=splits_used(plan),
                         micro_batches=sum(1 for _, _, mb in plan.micro_batches() if mb.seq_ids),
                         predicted_s=predicted, measured_s=measured, composed_s=composed, samples_s=samples,
                         time_error=predicted / measured - 1.0, measured_step_s=step,
                         time_error_step=predicted / step - 1.0,
                         noise=(max(samples) - min(samples)) / measured,
                         time_error_beyond_noise=beyond_noise(predicted, [*samples, composed["min"]], measured),
                         step_overhead_s=statistics.median(max(r["overhead"] for r in ranks) for ranks in rounds),
                         core_share=core_share([r for ranks in rounds for r in ranks]),
                         predicted_act_bytes=predicted_act, measured_act_bytes=act,
                         act_error=predicted_act / act - 1.0))
    return rows


def scatter(rows: list[dict], path: str | Path, title: str) -> None:
    """Predicted vs measured step time and activation memory, one colour per planner."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    planners = list(dict.fromkeys(r["planner"] for r in rows))
    for ax, key, scale, unit in ((axes[0], "s", 1.0, "s"), (axes[1], "act_bytes", 1e-6, "MB")):
        for name in planners:
            mine = [r for r in rows if r["planner"] == name]
            ax.scatter([r[f"measured_{key}"] * scale for r in mine], [r[f"predicted_{key}"] * scale for r in mine],
                       label=name, s=22)
        values = [r[f"{side}_{key}"] * scale for r in rows for side in ("measured", "predicted")]
        line = np.array([min(values) * 0.9, max(values) * 1.1])
        ax.plot(line, line, "k-", lw=0.8)
        for f in (0.9, 1.1):
            ax.plot(line, line * f, "k:", lw=0.6)
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"predicted ({unit})")
        ax.set_title("step time (waves)" if key == "s" else "peak activation memory per device")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarise(rows: list[dict]) -> dict:
    """|error| statistics of step time under every way of reducing rounds (`time_step`: the whole
    step as is), and of memory; step time's error beyond each plan's repeat spread
    (`beyond_noise`) and that spread (`noise`: slowest minus fastest round over the measurement);
    step time again for the plans that ran a CP part and for those that did not."""
    out = {f"time_{name}": error_summary([r["predicted_s"] / r["composed_s"][name] - 1.0 for r in rows])
           for name in STATISTICS}
    out["time_step"] = error_summary([r["time_error_step"] for r in rows])
    context = [r for r in rows if runs_context(r)]
    return dict(time=error_summary([r["time_error"] for r in rows]), act=error_summary([r["act_error"] for r in rows]),
                time_beyond_noise=error_summary([r["time_error_beyond_noise"] for r in rows]),
                noise=error_summary([r["noise"] for r in rows]), **out,
                time_context=error_summary([r["time_error"] for r in context]),
                act_context=error_summary([r["act_error"] for r in context]),
                time_without_context=error_summary([r["time_error"] for r in rows if not runs_context(r)]))


def plan_table(rows: list[dict]) -> Table:
    table = Table(title="predicted (profile) vs measured, per plan")
    for column in ("planner", "seqs", "waves", "degrees", "u x c", "mbs", "predicted s", "measured s", "error",
                   "pred act MB", "meas act MB", "act error"):
        table.add_column(column, justify="left" if column == "planner" else "right")
    for r in rows:
        table.add_row(r["planner"], str(r["sequences"]), str(r["waves"]), ",".join(map(str, r["degrees"])),
                      ",".join(r["splits"]),
                      str(r["micro_batches"]), f"{r['predicted_s']:.3f}", f"{r['measured_s']:.3f}",
                      f"{r['time_error']:+.1%}", f"{r['predicted_act_bytes'] / 1e6:.1f}",
                      f"{r['measured_act_bytes'] / 1e6:.1f}", f"{r['act_error']:+.1%}")
    return table
