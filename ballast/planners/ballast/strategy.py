"""ballast on heterogeneous strategies: for every candidate strategy, the step's sequences assigned
to its pipelines longest first (`strategies.StrategyPlanner.assign`), each pipeline's part planned
by ballast's planner over its pool, and Hydraulis' own plan (its two stages, no recomputation)
beside it where its pipelines hold the batch so; the simulator prices every one whole, parameter
movement included (`strategy_prices.StrategyPrices.step_seconds`), and the fastest trains the step.

Each candidate's pooled form takes part too (`pooled`: every run of identical adjacent pipelines
merged into one pipeline of the same (t, p) whose pool is the run's replicas, where its block may
sit on the ranks): the same ranks and layers, but ballast may then carve SP groups across the
replicas, so a long sequence's attention is split instead of one replica holding it. So the plan
ballast trains is never slower, under the cost model, than Hydraulis' own on the same strategies,
nor than any planner placed on them by the longest-first assignment. Hydraulis'
plans take part only where its pipelines are one replica each (its own rule refuses a pool).

ballast's parts on Hydraulis' stage 1 (over a rank's recomputed capacity) took part until the
records of H1-H4 (docs/results.md) showed the pooled form winning all 16 of their steps and that
placement none; without it the same plans come 41% sooner on 1,024 ranks (H4: 13.5 s to 8.0 s a
step) and 16% on 32 (H1: 1.70 s to 1.43 s).
"""
from __future__ import annotations

from typing import Sequence

from ...plans.strategy_plan import StrategyPlan
from ...vocabulary.samples import Sample
from ...vocabulary.strategy import PipelineLayout, Strategy
from ..base import PlannerOptions
from ..hydraulis_strategies import HydraulisStrategies
from ..strategy_choice import StrategyChoice, own_rule
from ..strategy_prices import StrategyPrices


@own_rule
class BallastStrategies(StrategyChoice):
    """The fastest of ballast's and Hydraulis' plans on every candidate strategy (module docstring)."""

    name = "ballast"

    def __init__(self, prices: StrategyPrices, options: PlannerOptions | None = None):
        super().__init__(self.name, prices, options)
        replicas = all(p.pool == 1 for s in prices.strategies for p in s.pipelines)
        self.hydraulis = HydraulisStrategies(prices, options) if replicas else None
        self._pools: dict[Strategy, Strategy | None] = {}

    def plans_on(self, strategy: Strategy, samples: Sequence[Sample]) -> list[StrategyPlan]:
        """ballast's parts on its assignment and on the pooled form, and Hydraulis' own plan where it
        has one."""
        placed = self._planner(strategy)
        plans = [placed.plan(samples)]
        if (merged := self._pooled(strategy)) is not None and self.prices.holds(merged, samples):
            plans.append(self._planner(merged).plan(samples))
        if self.hydraulis is not None and (theirs := self.hydraulis.plan_on(strategy, samples)) is not None:
            plans.append(theirs)
        return plans

    def _pooled(self, strategy: Strategy) -> Strategy | None:
        """`pooled(strategy)`, priced, where it differs and its blocks fit the cluster; else None."""
        if strategy not in self._pools:
            merged = pooled(strategy)
            try:
                if merged != strategy:
                    self.prices.price(merged)
            except ValueError:  # a block that straddles nodes, or states that do not fit
                merged = strategy
            self._pools[strategy] = None if merged == strategy else merged
        return self._pools[strategy]


def pooled(strategy: Strategy) -> Strategy:
    """`strategy` with every run of identical adjacent one-replica pipelines merged into one
    pipeline of their (t, p) over a pool of their count."""
    merged: list[PipelineLayout] = []
    for p in strategy.pipelines:
        last = merged[-1] if merged else None
        if last is not None and p.pool == 1 and (last.tp, last.pp) == (p.tp, p.pp):
            merged[-1] = PipelineLayout(p.tp, p.pp, last.pool + 1)
        else:
            merged.append(p)
    return Strategy(tuple(merged))
