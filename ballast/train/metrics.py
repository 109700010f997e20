"""What a run records: one JSON line per step, a progress display, and the closing summary.

`metrics.jsonl` is appended to, never rewritten, while a run lasts: after a restart the
steps since the last checkpoint run again and are logged again, so the run's history is the
*last* record of every step (`final_history`). Each record lists the sample ids the step
trained on; in the final history every sample of an epoch then appears exactly once (a sample
a planner holds for a later step trains within its epoch, `planners/held.py`), which is how a
restart is shown to have neither lost nor repeated data.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..plans.plan import Plan, Wave, splits_used
from ..plans.strategy_plan import StrategyPlan
from ..runtime.pipeline import pipeline_slots

UNRECORDED = "not recorded"
"""The layout of a step logged before records named it (a run resumed across that change)."""


def layout_of(plan: Plan, stages: int = 1) -> str:
    """The plan's layout in a phrase, e.g. `1x1+1x1 recompute 75% then 1x2 recompute 50%`: its
    waves in order, each as its busy groups in rank order, u x c (Ulysses ranks x context-parallel
    ranks), and the largest share of the model's layers any of the wave's micro-batches recomputes;
    under a pipeline of p stages `ppP[...]`, the layout every stage runs, and how many micro-batches
    its 1F1B schedule runs through the stages."""
    waves = " then ".join(_wave_layout(wave) for wave in plan.waves)
    if stages == 1:
        return waves
    slots = len(pipeline_slots(plan, 0))
    return f"pp{stages}[{waves}; {slots} micro-batch{'es' if slots != 1 else ''} in 1F1B]"


def plan_facts(plan: Plan | StrategyPlan, stages: int = 1) -> dict:
    """What a step's record says of its plan (`StepRecord`'s waves ... layout, strategy): under a
    strategy, its parts' together, the layout pipeline by pipeline."""
    if isinstance(plan, Plan):
        parts, layout, strategy = [plan], layout_of(plan, stages), None
    else:
        parts, strategy = plan.parts, str(plan.strategy)
        layout = " | ".join(f"{pipeline.label} " + (layout_of(part, pipeline.pp) if part.lengths else "idle")
                            for pipeline, part in zip(plan.strategy.pipelines, plan.parts))
    tokens = [sum(part.lengths) for part in parts]
    return {"waves": max(len(part.waves) for part in parts),
            "micro_batches": sum(part.busy_micro_batches() for part in parts),
            "degrees": sorted({d for part in parts for d in part.degrees_used()}),
            "context_parts": sorted({c for part in parts for c in part.context_parts_used()}),
            "splits": splits_used(parts),
            "recomputed": sum(t * part.recomputed_fraction() for t, part in zip(tokens, parts)) / max(1, sum(tokens)),
            "layout": layout, "strategy": strategy}


def _wave_layout(wave: Wave) -> str:
    busy = [g for g in sorted(wave.groups, key=lambda g: g.start) if any(mb.seq_ids for mb in g.micro_batches)]
    recompute = max((mb.recompute for g in busy for mb in g.micro_batches if mb.seq_ids), default=0.0)
    return ("+".join(f"{g.ulysses}x{g.cp}" for g in busy) + f" recompute {recompute:.0%}"
            + (" remapped" if wave.remap else "") + (" routed" if wave.routed else ""))


@dataclass
class StepRecord:
    """One line of metrics.jsonl."""

    step: int
    attempt: int
    """torchrun's restart count (0 on the first attempt and outside torchrun)."""
    planner: str
    """The planner that laid the step out (a resumed run may use another than its checkpoint's)."""
    loss: float
    """Mean per-token loss of the global batch."""
    grad_norm: float
    """L2 norm of the batch's gradient, before AdamW."""
    skipped: bool
    """The loss or gradient norm was not finite and --skip-nonfinite skipped the optimizer step."""
    lr: float
    tokens: int
    """Loss tokens of the step (the batch's training tokens)."""
    sample_ids: list[int]
    lengths: list[int]
    """Tokens of every sequence, in sample_ids order."""
    epoch: int
    held: int
    """Samples drawn by this step or before it that its planner left to later steps (`Planner.defer`)."""
    step_time: float
    """Wall-clock seconds of the whole step on rank 0: waiting for its plan, the broadcast,
    the executor's waves, gradient sync and optimizer."""
    tokens_per_s: float
    predicted_step_time: float
    """The plan's step time under the run's cost model."""
    idle_fraction: float
    """Share of all ranks' wave time spent waiting for other groups (from every rank's timings)."""
    rank_idle: list[float]
    waves: int
    micro_batches: int
    degrees: list[int]
    """SP degrees the plan used."""
    context_parts: list[int]
    """CP parts of its groups (`Group.cp`; 1: Ulysses alone), so a run shows when it used context parallelism."""
    splits: list[str]
    """Its groups' degrees as u x c ("1x2"; a degree alone for Ulysses alone), as the log prints them."""
    recomputed: float
    """Token-weighted mean fraction of layers recomputed in backward."""
    layout: str
    """The plan's waves, groups and recomputation in a phrase (`layout_of`)."""
    plan_ms: float
    """Planner time for this step's batch (in the background when planning ahead)."""
    plan_wait_ms: float
    """How long the step waited for its batch and plan: ~0 when planning is hidden."""
    strategy: str | None = None
    """The step's heterogeneous strategy (--strategy), its pipelines as (t,p); None: the run's one mesh."""


class MetricsLog:
    """Appends records to `path` (rank 0). `fresh` starts a new history (a run from step 0)."""

    def __init__(self, path: Path, fresh: bool):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        if fresh:
            path.write_text("")

    def write(self, record: StepRecord) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(asdict(record)) + "\n")


def final_history(path: Path) -> list[dict]:
    """The last record of every step, in step order (earlier attempts' re-run steps dropped)."""
    last: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            last[record["step"]] = record
    return [last[k] for k in sorted(last)]


def summarise(history: list[dict]) -> dict:
    """Run totals. Throughput leaves out the first step (start-up: allocation, thread pools)."""
    if not history:
        raise ValueError("no steps recorded")
    timed = history[1:] or history
    busy = sum(r["step_time"] for r in timed)
    applied = [r for r in history if not r.get("skipped")] or history
    tail = applied[-max(1, len(applied) // 10):]
    return {
        "steps": len(history),
        "tokens": sum(r["tokens"] for r in history),
        "tokens_per_s": sum(r["tokens"] for r in timed) / busy if busy > 0 else 0.0,
        "step_time_s": busy / len(timed),
        "predicted_step_time_s": sum(r["predicted_step_time"] for r in timed) / len(timed),
        "idle_fraction": sum(r["idle_fraction"] * r["step_time"] for r in timed) / busy if busy > 0 else 0.0,
        "loss_first": applied[0]["loss"],
        "loss_last": sum(r["loss"] for r in tail) / len(tail),
        "plan_ms": sum(r["plan_ms"] for r in history) / len(history),
        "plan_wait_ms": sum(r["plan_wait_ms"] for r in timed) / len(timed),
        "attempts": max(r["attempt"] for r in history) + 1,
        "skipped_steps": sum(bool(r.get("skipped")) for r in history),
        "steps_holding": sum(r.get("held", 0) > 0 for r in history),
        "most_held": max(r.get("held", 0) for r in history),
        "layouts": dict(Counter(r.get("layout", UNRECORDED) for r in history).most_common()),
        "steps_by_planner": dict(Counter(r.get("planner", "unrecorded") for r in history)),
        "steps_by_strategy": dict(Counter(r["strategy"] for r in history if r.get("strategy"))),
    }


class ProgressDisplay:
    """A rich progress bar with loss, tokens/s and ETA on a terminal; a log line every
    `interval` steps otherwise (CI logs, files)."""

    def __init__(self, console: Console, start: int, total: int, interval: int):
        self.console, self.total, self.interval = console, total, interval
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                                TextColumn("loss {task.fields[loss]:.4f}"),
                                TextColumn("{task.fields[tps]:>9,.0f} tok/s"),
                                TextColumn("idle {task.fields[idle]:.0%}"),
                                TimeRemainingColumn(), TextColumn("{task.fields[layout]}"), console=console)
            self.task = self.bar.add_task("train", total=total, completed=start,
                                          loss=float("nan"), tps=0.0, idle=0.0, layout="")
            self.bar.start()

    def update(self, record: StepRecord) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=record.step + 1, loss=record.loss,
                            tps=record.tokens_per_s, idle=record.idle_fraction, layout=record.layout)
        elif (record.step + 1) % self.interval == 0 or record.step + 1 == self.total:
            self.console.print(f"step {record.step + 1}/{self.total}  loss {record.loss:.4f}  "
                               f"{record.tokens_per_s:,.0f} tok/s  idle {record.idle_fraction:.0%}  "
                               f"{f'strategy {record.strategy}  ' if record.strategy else ''}"
                               f"layout {record.layout}  plan {record.plan_ms:.1f} ms"
                               f"{f'  {record.held} held' if record.held else ''}", highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
