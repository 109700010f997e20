"""ballast on heterogeneous strategies: for every candidate strategy, the step's sequences assigned
to its pipelines twice (its own longest-first assignment, `strategies.StrategyPlanner.assign`, and
Hydraulis' randomised stage 1, `hydraulis_strategies.dispatch`), each pipeline's part planned by
ballast's planner over its pool, and Hydraulis' own plan (its stage 2's micro-batches, no
recomputation) beside them where its pipelines hold the batch so; the simulator prices every one whole, parameter movement included
(`strategy_prices.StrategyPrices.step_seconds`), and the fastest trains the step.

So the plan ballast trains is never slower, under the cost model, than Hydraulis' own on the same
strategies, nor than any planner placed on them by the longest-first assignment. Hydraulis'
plans take part only where its pipelines are one replica each (its own rule refuses a pool).
"""
from __future__ import annotations

from typing import Sequence

from ...plans.strategy_plan import StrategyPlan
from ...vocabulary.samples import Sample
from ...vocabulary.strategy import Strategy
from ..base import PlannerOptions
from ..hydraulis_strategies import HydraulisStrategies, dispatch, stage_seconds
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

    def plans_on(self, strategy: Strategy, samples: Sequence[Sample]) -> list[StrategyPlan]:
        """ballast's parts on both assignments, and Hydraulis' own plan where it has one."""
        placed = self._planner(strategy)
        plans = [placed.place(samples, placed.assign(samples))]
        if self.hydraulis is not None:
            stages = [p.pp for p in strategy.pipelines]
            # Hydraulis' stage 1 over what a rank holds with every layer recomputed: ballast recomputes
            c = stage_seconds(self.prices.costs[strategy], samples, stages, recompute=1.0)
            ids, _ = dispatch(c, stages, self.options.seed)
            plans.append(placed.place(samples, ids))
            if (theirs := self.hydraulis.plan_on(strategy, samples)) is not None:
                plans.append(theirs)
        return plans
