"""Plan and simulate the same batches under several planners, side by side."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..vocabulary.cluster import Cluster
from ..pricing.cost import CostModel
from ..vocabulary.patterns import CAUSAL_LM
from ..plans.plan import Plan
from ..planners import PlannerOptions, get_planner
from ..planners.fits import check_fits
from ..planners.held import DeferredSamples
from ..vocabulary.layouts import ANY_SPLIT
from ..vocabulary.samples import Sample, check_samples, is_shaped, tokens
from ..plans.timeline import StepMetrics, simulate
from ..pricing.pipeline_bound import report_lower_bound


@dataclass
class PlannerResult:
    """Means over the steps of one planner's simulated metrics."""

    name: str
    step_time_s: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    idle_fraction: list[float] = field(default_factory=list)
    vs_lower_bound: list[float] = field(default_factory=list)
    plan_ms: list[float] = field(default_factory=list)
    waves: list[int] = field(default_factory=list)
    busiest_nic_gb: list[float] = field(default_factory=list)
    """GB the step's busiest NIC sends (none recorded on one node)."""
    nic_imbalance: list[float] = field(default_factory=list)
    """The busiest NIC's bytes over the mean of the NICs that send any."""
    routed_waves: list[float] = field(default_factory=list)
    """Fraction of the step's waves routed over every NIC (`Wave.routed`)."""
    nic_gb: list[np.ndarray] = field(default_factory=list)
    """GB each NIC sends in the step (`StepMetrics.nic_bytes`, global NIC order)."""
    bubble_fraction: list[float] = field(default_factory=list)
    """Under PP, the share of the step the pipeline's busiest rank idles (`StepMetrics.bubble`)."""
    sync_time_s: list[float] = field(default_factory=list)
    """Seconds of the gradient reduction left after the waves (`StepMetrics.sync_time`)."""
    optimizer_time_s: list[float] = field(default_factory=list)
    """Seconds of the optimizer step and what follows it (`StepMetrics.optimizer_time`)."""
    held: list[int] = field(default_factory=list)
    """Samples left to later steps after each step (`Planner.defer`, `planners/held.py`)."""
    first_plan: Plan | None = None
    info: list[dict] = field(default_factory=list)

    def add(self, plan: Plan, metrics: StepMetrics, plan_seconds: float, held: int = 0) -> None:
        self.held.append(held)
        if self.first_plan is None:
            self.first_plan = plan
        self.step_time_s.append(metrics.step_time)
        self.tokens_per_s.append(metrics.tokens_per_s)
        self.idle_fraction.append(metrics.idle_fraction)
        self.vs_lower_bound.append(metrics.vs_lower_bound)
        self.plan_ms.append(plan_seconds * 1e3)
        self.waves.append(len(plan.waves))
        self.sync_time_s.append(metrics.sync_time)
        self.optimizer_time_s.append(metrics.optimizer_time)
        self.info.append(plan.info)
        if plan.pp > 1:
            self.bubble_fraction.append(metrics.bubble_fraction)
        if len(metrics.nic_bytes):
            busy = metrics.nic_bytes[metrics.nic_bytes > 0]
            self.busiest_nic_gb.append(float(metrics.nic_bytes.max()) / 1e9)
            self.nic_imbalance.append(float(busy.max() / busy.mean()) if len(busy) else 1.0)
            self.routed_waves.append(sum(w.routed for w in plan.waves) / len(plan.waves))
            self.nic_gb.append(metrics.nic_bytes / 1e9)

    def summary(self) -> dict:
        """Every figure a mean over the steps (tokens_per_s too: each step's tokens / its time,
        averaged), plus the worst step's plan_ms and vs_lower_bound."""
        keys = ("step_time_s", "tokens_per_s", "idle_fraction", "vs_lower_bound", "plan_ms", "waves", "sync_time_s",
                "optimizer_time_s")
        out = {k: float(np.mean(getattr(self, k))) for k in keys}
        out["plan_ms_max"] = float(np.max(self.plan_ms))
        out["vs_lower_bound_max"] = float(np.max(self.vs_lower_bound))
        for key in ("busiest_nic_gb", "nic_imbalance", "routed_waves", "bubble_fraction"):
            if getattr(self, key):
                out[key] = float(np.mean(getattr(self, key)))
        if any(self.held):
            out["held"] = float(np.mean(self.held))
        if self.nic_gb:
            out["nic_gb"] = [round(float(x), 4) for x in np.mean(self.nic_gb, axis=0)]
        gaps = [i["mip_gap"] for i in self.info if "mip_gap" in i]
        if gaps:
            out["mip_gap"] = float(np.mean(gaps))
        return out


def lengths_only(cost: CostModel) -> CostModel:
    """`cost` as a length-only planner sees it: every sample a causal text sequence."""
    return dataclasses.replace(cost, attention=CAUSAL_LM.name)


def simulate_planners(batches: Sequence[list[Sample]], planners: Sequence[str], cluster: Cluster, cost: CostModel,
                      options: PlannerOptions, on_step: Callable[[str, int], None] | None = None,
                      as_lengths: bool = False) -> tuple[list[float], dict[str, PlannerResult]]:
    """Lower bound per batch, and each planner's results on the same batches (validated plans).
    A planner that defers samples (`Planner.defer`) trains some of a batch in later steps, and
    the held ones in the last step at the latest, so every planner trains the same samples.

    as_lengths: the planners see every sample as a text sequence of its tokens under causal
    attention (what a length-only planner believes), and their plans run under `cost`'s own
    pattern with the real shapes: what shape-blind planning costs."""
    for batch in batches:  # before the bound: a batch no plan holds is told with the options that would help
        check_fits(cost.under(ANY_SPLIT), batch)
    lower = [report_lower_bound(cost, b) for b in batches]
    planning_cost = lengths_only(cost) if as_lengths else cost
    results = {}
    for name in planners:
        planner = get_planner(name, cluster, planning_cost, options)
        result, held = PlannerResult(name), DeferredSamples()
        for k, drawn in enumerate(batches):
            begin = time.perf_counter()
            batch = held.admit([(x, tokens(x) if as_lengths else x) for x in drawn], planner, k == len(batches) - 1)
            plan = planner.plan([tokens(x) for x in batch] if as_lengths else batch)
            elapsed = time.perf_counter() - begin
            if as_lengths and is_shaped(batch):
                plan.shapes = check_samples(batch)
            plan.validate(cluster, cost)
            result.add(plan, simulate(plan, cost, cluster.world_size), elapsed, len(held))
            if on_step:
                on_step(name, k)
        results[name] = result
    return lower, results
