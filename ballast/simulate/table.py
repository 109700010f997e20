"""The side-by-side table `ballast simulate` prints: one row per planner."""
from __future__ import annotations

from typing import Mapping

from rich.table import Table


def planner_table(title: str, summaries: Mapping[str, dict], lower_bound_s: float,
                  baseline: str = "static") -> Table:
    """One row per planner, fastest first: the whole step, of it the gradient sync left after the
    waves and the optimizer step; speed-up relative to `baseline` when it ran; the pipeline's
    bubble (a share of the step) under PP."""
    table = Table(title=title)
    piped = any("bubble_fraction" in s for s in summaries.values())
    for col in ("planner", "step s", "sync s", "optim s", "tokens/s", f"vs {baseline}", "idle",
                *(("bubble",) if piped else ()), "x LB", "plan ms", "waves"):
        table.add_column(col, justify="left" if col == "planner" else "right")
    base = summaries.get(baseline, {}).get("tokens_per_s")
    for name, s in sorted(summaries.items(), key=lambda kv: -kv[1]["tokens_per_s"]):
        table.add_row(name, f"{s['step_time_s']:.3f}", f"{s['sync_time_s']:.3f}", f"{s['optimizer_time_s']:.3f}",
                      f"{s['tokens_per_s']:,.0f}",
                      f"{s['tokens_per_s'] / base:.2f}x" if base else "-",
                      f"{s['idle_fraction']:.1%}", *((f"{s.get('bubble_fraction', 0.0):.1%}",) if piped else ()),
                      f"{s['vs_lower_bound']:.3f}",
                      f"{s['plan_ms']:.1f}", f"{s['waves']:.1f}")
    table.caption = f"lower bound {lower_bound_s:.3f} s per step (mean)"
    return table
