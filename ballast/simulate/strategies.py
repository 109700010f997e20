"""`ballast simulate --strategy`: every planner's plans placed on heterogeneous strategies, each
step under the one its plan is fastest under (`planners/strategy_choice.py`), priced as the slowest
pipeline between the canonical layout's gather and reduction (`plans/strategy_timeline.py`).
Simulated, not run."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from statistics import mean
from typing import Callable, Sequence

from rich.table import Table

from ..planners import PlannerOptions
from ..planners.strategy_choice import strategy_planner
from ..planners.strategy_prices import StrategyPrices
from ..plans.strategy_plan import StrategyPlan
from ..plans.strategy_timeline import StrategyMetrics, simulate_strategy
from ..vocabulary.samples import Sample, tokens


@dataclass
class StrategyResult:
    """One planner's steps under the strategies."""

    name: str
    steps: list[StrategyMetrics] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)
    """Pipelines that held sequences, per step."""
    chosen: list[str] = field(default_factory=list)
    """The strategy of each step."""
    first_plan: StrategyPlan | None = None
    """The first step's plan (for its Gantt chart)."""
    tokens: list[int] = field(default_factory=list)
    plan_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        """Means over the steps (the worst step's planning time too)."""
        step = [m.step_time for m in self.steps]
        return {"step_time_s": mean(step), "pipelines_time_s": mean(m.pipelines_time for m in self.steps),
                "gather_s": mean(m.movement.gather for m in self.steps),
                "reduction_s": mean(m.movement.reduction for m in self.steps),
                "optimizer_s": mean(m.movement.optimizer for m in self.steps),
                "tokens_per_s": mean(t / s for t, s in zip(self.tokens, step)),
                "vs_assigned_bound": mean(m.step_time / m.assigned_bound for m in self.steps),
                "busy_pipelines": self.busy, "strategies": dict(Counter(self.chosen)), "strategy_per_step": self.chosen, "plan_ms": mean(self.plan_ms), "plan_ms_max": max(self.plan_ms),
                "pipeline_times_s": [[part.step_time for part in m.parts] for m in self.steps]}


def simulate_strategy_planners(batches: Sequence[Sequence[Sample]], names: list[str], prices: StrategyPrices,
                               options: PlannerOptions,
                               on_step: Callable[[str, int], None] = lambda name, k: None) -> dict[str, StrategyResult]:
    """Every planner on the strategies `prices` prices, each step under its fastest."""
    results = {}
    for name in names:
        planner = strategy_planner(name, prices, options)
        result = results[name] = StrategyResult(name)
        for k, batch in enumerate(batches):
            start = time.perf_counter()
            plan = planner.plan(batch)
            result.plan_ms.append((time.perf_counter() - start) * 1e3)
            costs = prices.costs[plan.strategy]
            plan.validate(prices.cluster, costs)
            result.steps.append(simulate_strategy(plan, costs, prices.moves[plan.strategy]))
            result.busy.append(sum(1 for part in plan.parts if part.lengths))
            result.chosen.append(str(plan.strategy))
            result.first_plan = result.first_plan or plan
            result.tokens.append(sum(tokens(x) for x in batch))
            on_step(name, k)
    return results


def strategy_table(title: str, summaries: dict[str, dict]) -> Table:
    table = Table(title=title, caption="simulated; step = gather + slowest pipeline + reduction + optimizer "
                                       "(pricing/parameter_movement.py)")
    for column in ("planner", "step s", "pipelines s", "gather s", "reduce s", "optim s", "tokens/s",
                   "vs bound", "busy", "plan ms"):
        table.add_column(column, justify="left" if column == "planner" else "right")
    for name, s in summaries.items():
        table.add_row(name, f"{s['step_time_s']:.3f}", f"{s['pipelines_time_s']:.3f}", f"{s['gather_s']:.3f}",
                      f"{s['reduction_s']:.3f}", f"{s['optimizer_s']:.3f}", f"{s['tokens_per_s']:,.0f}",
                      f"{s['vs_assigned_bound']:.3f}", f"{mean(s['busy_pipelines']):.1f}", f"{s['plan_ms']:.0f}")
    return table
