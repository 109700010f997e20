"""The benchmark's table (rich) and bar chart (PNG)."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from ..plans.plan import split_label


def _ranked(planners: dict[str, dict]) -> list[tuple[str, dict]]:
    return sorted(planners.items(), key=lambda kv: -kv[1]["tokens_per_s"])


def bench_table(title: str, summary: dict) -> Table:
    """One row per planner, fastest first: measured speed, relative to static, prediction, idle."""
    table = Table(title=title)
    columns = ("planner", "tokens/s", "vs static", "paired", "spread", "step s", "waves s", "predicted s",
               "pred err", "step err", "idle", "plan ms", "degrees", "recomp", "mbs")
    for col in columns:
        table.add_column(col, justify="left" if col == "planner" else "right")
    for name, s in _ranked(summary["planners"]):
        table.add_row(
            name, f"{s['tokens_per_s']:,.0f}",
            "-" if s["vs_static"] is None else f"{s['vs_static']:.2f}x",
            "-" if s["vs_static_paired"] is None else f"{s['vs_static_paired']:.2f}x",
            f"{s['round_spread']:.1%}", f"{s['step_s']:.3f}", f"{s['waves_s']:.3f}", f"{s['predicted_s']:.3f}",
            f"{s['prediction_error']:+.1%}", f"{s['prediction_error_step']:+.1%}", f"{s['idle_fraction']:.1%}",
            f"{s['plan_ms']:.1f}",
            ",".join(split_label(degree, cp) for degree, cp in s["degree_splits"]), f"{s['recomputed']:.2f}", f"{s['micro_batches']:.1f}")
    table.caption = ("tokens/s: total tokens / sum over batches of the median step time over rounds; paired: "
                     "median per-batch step-time ratio to static; spread: (max-min)/median of tokens/s over rounds; "
                     "step s (median per batch), waves s, predicted s: medians; pred err: median over batches of "
                     f"predicted / measured waves - 1, each micro-batch's {summary['prediction_statistic']} over "
                     "rounds (the cost model's) composed into the step; step err: the same against the whole "
                     "waves' rounds" + _noise_text(summary["noise"]))
    return table


def _noise_text(noise: dict) -> str:
    if noise["run_to_run"] is None:
        return "; one round: no run-to-run noise measured"
    relative = "" if noise["relative"] is None else f", of speeds relative to static {noise['relative']:.1%}"
    return f"; run-to-run noise of tokens/s {noise['run_to_run']:.1%}{relative} (medians over planners)"


def bar_chart(summary: dict, title: str, path: str | Path) -> None:
    """Left: tokens/s per planner (whiskers: min..max over rounds), labelled with the speed-up over
    static. Right: measured waves vs the cost model's prediction (medians per step)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ranked = _ranked(summary["planners"])
    names = [name for name, _ in ranked]
    y = np.arange(len(names))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.9 + 0.5 * len(names)), sharey=True)
    speed = [s["tokens_per_s"] for _, s in ranked]
    # The bar (per-batch medians) may lie outside the rounds' totals: whiskers then start at it.
    low = [max(0.0, speed[i] - min(s["tokens_per_s_rounds"])) for i, (_, s) in enumerate(ranked)]
    high = [max(0.0, max(s["tokens_per_s_rounds"]) - speed[i]) for i, (_, s) in enumerate(ranked)]
    colours = ["tab:red" if n == "ballast" else "tab:grey" if n == "static" else "tab:blue" for n in names]
    left.barh(y, speed, xerr=[low, high], color=colours, capsize=3)
    ends = [max(speed[i], max(s["tokens_per_s_rounds"])) for i, (_, s) in enumerate(ranked)]
    for i, (_, s) in enumerate(ranked):
        if s["vs_static"] is not None:
            left.text(ends[i], i, f"  {s['vs_static']:.2f}x", va="center", fontsize=8)
    left.set_yticks(y, names)
    left.invert_yaxis()
    left.set_xlabel("tokens/s (per-batch medians; whiskers: rounds' min..max)")
    left.set_xlim(0, max(ends) * 1.2)
    height = 0.38
    right.barh(y - height / 2, [s["waves_s"] for _, s in ranked], height, label="measured waves", color="tab:blue")
    right.barh(y + height / 2, [s["predicted_s"] for _, s in ranked], height, label="cost model", color="tab:orange")
    right.set_xlabel("seconds per step (median)")
    right.legend(fontsize=8, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
