"""A plan drawn as a Gantt chart of its ranks over time, as the timeline prices it: its passes,
and after the waves what the step still runs (the gradient sync, the optimizer) as one band."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from ..pricing.cost import CostModel
from .plan import Plan
from .timeline import simulate


def gantt(plans: Mapping[str, Plan], cost: CostModel, world_size: int, path: str | Path) -> None:
    """One panel per plan: ranks on the y axis, micro-batches as boxes coloured by SP degree.

    The hatched tail of a box is its all-to-all time; empty lockstep fillers are grey; a box
    with recomputation is labelled with its sequences and recompute level where it is wide
    enough. The title gives the step's busiest NIC's bytes (and the routed waves) where its
    exchanges cross nodes. A pipeline's plan (PP p > 1) draws every stage's pool ranks, stage 0
    on top, each stage a band of its own: forwards paler than backwards, the white between them
    the bubble, whose share of the step the title gives.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # A qualitative palette: degrees are categories, and neighbours must not look alike.
    cmap = plt.get_cmap("tab10")
    colour = {1 << i: cmap(i % 10) for i in range(world_size.bit_length())}
    panel = 4.8 if any(plan.pp > 1 for plan in plans.values()) else 2.4  # a pipeline's stages need the room
    fig, axes = plt.subplots(len(plans), 1, figsize=(12, 1.0 + panel * len(plans)),
                             squeeze=False, sharex=True)
    for ax, (name, plan) in zip(axes[:, 0], plans.items()):
        metrics = simulate(plan, cost, world_size, timeline=True)
        stages = max((seg.stage for seg in metrics.segments), default=0) + 1
        for seg in metrics.segments:
            wave = plan.waves[seg.wave]
            group = next(g for g in wave.groups if g.start == seg.start_rank)
            mb = group.micro_batches[seg.micro_batch]
            face = "lightgrey" if not mb.seq_ids else colour[seg.degree]
            row = seg.stage * world_size + seg.start_rank
            alpha = 0.5 if seg.forward else 1.0
            ax.broken_barh([(seg.begin, seg.compute)], (row, seg.degree), facecolors=face, alpha=alpha,
                           edgecolors="white", linewidth=0.4)
            if mb.recompute > 0 and seg.compute > 0.04 * metrics.step_time:  # where the label fits
                ax.text(seg.begin + seg.compute / 2, row + seg.degree / 2,
                        f"{len(mb.seq_ids)} seq\nrecomp {mb.recompute:.0%}", ha="center", va="center", fontsize=7)
            if seg.comm > 0:
                ax.broken_barh([(seg.begin + seg.compute, seg.comm)], (row, seg.degree), alpha=alpha,
                               facecolors=face, edgecolors="black", hatch="///", linewidth=0.2)
        tail = metrics.step_time - metrics.waves_time
        if tail > 0:  # after the waves: the gradient sync their backwards did not hide, the optimizer
            ax.broken_barh([(metrics.waves_time, tail)], (0, stages * world_size), facecolors="whitesmoke",
                           edgecolors="grey", hatch="..", linewidth=0.3)
        clock = 0.0
        for wave_time in metrics.wave_times[:-1]:
            clock += wave_time
            ax.axvline(clock, color="red", linewidth=0.6, linestyle="--")
        for k in range(1, stages):
            ax.axhline(k * world_size, color="black", linewidth=0.8)
        rows = stages * world_size
        ax.set_ylim(rows, 0)
        every = max(1, rows // 16)  # at most 16 labels, each in the middle of its rank's row
        ax.set_yticks([r + 0.5 for r in range(0, rows, every)],
                      [f"{f's{r // world_size} ' if stages > 1 else ''}{r % world_size}" for r in range(0, rows, every)])
        ax.set_ylabel("stage, pool rank" if stages > 1 else "rank")
        nics = ""
        if metrics.nic_bytes.any():  # the step's NIC load, where its exchanges cross nodes
            routed = sum(w.routed for w in plan.waves)
            busiest = metrics.nic_bytes.max()
            size = f"{busiest / 1e9:.2f} GB" if busiest >= 1e9 else f"{busiest / 1e6:.1f} MB"
            nics = (f", busiest NIC {size}"
                    f"{f', {routed} of {len(plan.waves)} waves routed' if routed else ''}")
        bubble = f", bubble {metrics.bubble_fraction:.0%} over {stages} stages" if stages > 1 else ""
        after = f" ({tail:.2f} s sync + optimizer, dotted)" if tail > 0 else ""
        ax.set_title(f"{name}: step {metrics.step_time:.2f} s{after}, idle {metrics.idle_fraction:.0%}{bubble}, "
                     f"{metrics.vs_lower_bound:.2f}x lower bound{nics}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds")
    used = sorted({d for p in plans.values() for d in p.degrees_used()})
    fig.legend(handles=[Patch(color=colour[d], label=f"SP degree {d}") for d in used],
               loc="upper right", fontsize=8, ncol=len(used))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)
