"""The report folder of a run: PNG plots of its final history and of one plan that shows the
planner's choices."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..pricing.cost import CostModel
from ..plans.plan import Plan
from ..plans.gantt import gantt


def _figure(width: float = 8.0, height: float = 4.0):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    return plt, fig, ax


def _save(plt, fig, ax, path: Path, title: str, legend: bool = True) -> None:
    """Title, legend, write the PNG, free the figure."""
    ax.set_title(title, fontsize=10, loc="left")
    if legend:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over `window` steps (shorter at the start)."""
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (cumulative[idx] - cumulative[lo]) / (idx - lo)


def loss_curve(history: list[dict], path: Path, title: str, unit: str = "nats per token") -> None:
    steps = np.array([r["step"] for r in history])
    loss = np.array([r["loss"] for r in history])
    plt, fig, ax = _figure()
    ax.plot(steps, loss, color="tab:blue", alpha=0.35, linewidth=0.8, label="loss per step")
    ax.plot(steps, _smooth(loss, max(1, len(loss) // 20)), color="tab:blue", label="trailing mean")
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss ({unit})")
    _save(plt, fig, ax, path, title)


def throughput(history: list[dict], path: Path, title: str) -> None:
    """Measured tokens/s per step and what the cost model predicted for the same plans."""
    steps = np.array([r["step"] for r in history])
    measured = np.array([r["tokens_per_s"] for r in history])
    predicted = np.array([r["tokens"] / r["predicted_step_time"] if r["predicted_step_time"] > 0 else np.nan
                          for r in history])
    plt, fig, ax = _figure()
    ax.plot(steps, measured, color="tab:green", linewidth=0.9, label="measured")
    ax.plot(steps, predicted, color="tab:gray", linewidth=0.9, linestyle="--", label="cost model")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    _save(plt, fig, ax, path, title)


def length_histogram(history: list[dict], path: Path, title: str) -> None:
    """Sequences seen by length, log-spaced bins, and the share of tokens each bin holds."""
    lengths = np.array([s for r in history for s in r["lengths"]], dtype=np.float64)
    bins = np.unique(np.geomspace(1, max(2.0, lengths.max()) * 1.0001, 40).astype(int))
    plt, fig, ax = _figure()
    ax.hist(lengths, bins=bins, color="tab:purple", alpha=0.8, label="sequences")
    ax.set_xscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("sequences")
    share = ax.twinx()
    counts, _ = np.histogram(lengths, bins=bins, weights=lengths / lengths.sum())
    share.stairs(counts, bins, color="tab:orange", linewidth=2.0, label="share of tokens")
    share.set_ylabel("share of tokens", color="tab:orange")
    share.tick_params(axis="y", colors="tab:orange")
    share.set_ylim(bottom=0)
    # Two axes: one legend for both, above the plot at the right of the title, off the data.
    handles = [h for a in (ax, share) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    _save(plt, fig, ax, path, f"{title}: {lengths.size:,} sequences, {int(lengths.sum()):,} tokens", legend=False)


def showcase_step(history: list[dict], plans: dict[int, Plan]) -> int | None:
    """The step (among those whose plan is at hand) whose plan shows most of what the planner
    chose: distinct SP degrees, waves, micro-batches with and without recomputation; among
    those, the one whose measured time is nearest the median (a typical step, not an outlier)."""
    if not any(r["step"] in plans for r in history):
        return None
    times = sorted(r["step_time"] for r in history if r["step"] in plans)
    median = times[len(times) // 2]

    def choices(plan: Plan) -> int:
        levels = {mb.recompute > 0 for _, _, mb in plan.micro_batches() if mb.seq_ids}
        return len(plan.degrees_used()) + len(plan.waves) + len(levels)

    return max((r for r in history if r["step"] in plans),
               key=lambda r: (choices(plans[r["step"]]), -abs(r["step_time"] - median)))["step"]


def write_report(folder: Path, history: list[dict], plans: dict[int, Plan], cost: CostModel,
                 world: int, title: str) -> dict[str, Path]:
    """Every plot of the run into `folder`; the paths by name."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.png" for name in ("loss", "tokens_per_s", "lengths")}
    # Text models' cross-entropy is in nats; video DiTs' rectified-flow loss is a squared error.
    unit = cost.pattern.loss_unit
    loss_curve(history, paths["loss"], f"{title}: loss", unit)
    throughput(history, paths["tokens_per_s"], f"{title}: throughput")
    length_histogram(history, paths["lengths"], "data seen")
    step = showcase_step(history, plans)
    if step is not None:
        paths["gantt"] = folder / "gantt.png"
        gantt({f"step {step} ({plans[step].planner}, {cost.source} cost model)": plans[step]}, cost,
              world, paths["gantt"])
    return paths
