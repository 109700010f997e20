"""A step under a strategy drawn as a Gantt chart of the job's ranks (`simulate --strategy --gantt`):
the gather from the canonical layout, every pipeline's part on its own ranks as the timeline prices
it, then the reduction back and the optimizer (`strategy_timeline.py`)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ..pricing.cost import CostModel
from ..pricing.parameter_movement import MovementPrices
from ..vocabulary.cluster import Cluster
from .strategy_plan import StrategyPlan
from .strategy_timeline import simulate_strategy


def strategy_gantt(plans: Mapping[str, tuple[StrategyPlan, Sequence[CostModel], MovementPrices]], cluster: Cluster,
                   path: str | Path) -> None:
    """One panel per (plan, its pipelines' cost models, its movement): global ranks on the y axis,
    each pipeline a band of its ranks (a micro-batch box spans its group's TP ranks at its stage,
    paler forwards than backwards, the hatched tail its all-to-all), coloured by pipeline; the
    movement as grey bands across every rank: the gather before the passes, the reduction and the
    optimizer after the slowest pipeline."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    world = cluster.world_size
    fig, axes = plt.subplots(len(plans), 1, figsize=(12, 1.0 + 3.2 * len(plans)), squeeze=False, sharex=True)
    for ax, (name, (plan, costs, movement)) in zip(axes[:, 0], plans.items()):
        metrics = simulate_strategy(plan, costs, movement, timeline=True)
        start = movement.gather
        for i, part in enumerate(metrics.parts):
            mesh = plan.strategy.mesh(i, cluster)
            for seg in part.segments:
                row = mesh.rank(seg.stage, seg.start_rank, 0)
                box = (row, seg.degree * mesh.tp)
                alpha = 0.5 if seg.forward else 1.0
                ax.broken_barh([(start + seg.begin, seg.compute)], box, facecolors=cmap(i % 10), alpha=alpha,
                               edgecolors="white", linewidth=0.4)
                if seg.comm > 0:
                    ax.broken_barh([(start + seg.begin + seg.compute, seg.comm)], box, facecolors=cmap(i % 10),
                                   alpha=alpha, edgecolors="black", hatch="///", linewidth=0.2)
            ranks = plan.strategy.ranks(i)
            ax.axhline(ranks.stop, color="black", linewidth=0.8)
            ax.text(0, ranks.start + 0.5, f" {plan.strategy.pipelines[i].label}", va="center", fontsize=7)
        end = start + metrics.pipelines_time
        for begin, width, label in ((0.0, movement.gather, "gather"), (end, movement.reduction, "reduce"),
                                    (end + movement.reduction, movement.optimizer, "")):
            if width > 0:
                ax.broken_barh([(begin, width)], (0, world), facecolors="whitesmoke", edgecolors="grey",
                               hatch="..", linewidth=0.3)
                if label:
                    ax.text(begin + width / 2, world / 2, label, ha="center", va="center", fontsize=7, rotation=90)
        ax.set_ylim(world, 0)
        every = max(1, world // 16)
        ax.set_yticks([r + 0.5 for r in range(0, world, every)], [str(r) for r in range(0, world, every)])
        ax.set_ylabel("rank")
        ax.set_title(f"{name} under {plan.strategy}: step {metrics.step_time:.2f} s, of it movement "
                     f"{movement.total:.2f} s (gather {movement.gather:.2f}, reduction {movement.reduction:.2f}, "
                     f"optimizer {movement.optimizer:.2f}; dotted)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
