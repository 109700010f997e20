"""A step's strategy chosen among several (docs/design.md, section 6, *Strategies*): every planner
placed on each candidate strategy (`strategies.StrategyPlanner`), and the strategy whose plan the
cost model prices fastest, its parameter movement included (`plans/strategy_timeline.py`), trains
the step. Hydraulis keeps its layouts the same way: those that cannot hold the longest sequence
drop out, the rest are planned, the cheapest wins; the `hydraulis` planner's own rule replaces
the planning and the pricing (`hydraulis_strategies.py`).

A strategy is a candidate of a step when every sequence of the batch fits one of its pipelines;
a batch no strategy holds is refused, naming the strategies.
"""
from __future__ import annotations

from typing import Sequence

from ..plans.strategy_plan import StrategyPlan
from ..pricing.coefficients import InfeasibleError
from ..vocabulary.samples import Sample, tokens
from ..vocabulary.strategy import Strategy
from .base import PlannerOptions, StepPlanner
from .strategies import StrategyPlanner
from .strategy_prices import StrategyPrices, named


OWN_RULES: dict[str, type[StrategyChoice]] = {}
"""Planners that choose and lay out a step's strategy by a rule of their own, by name."""


def own_rule(cls: type[StrategyChoice]) -> type[StrategyChoice]:
    assert cls.name not in OWN_RULES, f"planner {cls.name} has two strategy rules"
    OWN_RULES[cls.name] = cls
    return cls


def strategy_planner(name: str, prices: StrategyPrices, options: PlannerOptions | None = None) -> StrategyChoice:
    """Planner `name` on the strategies of `prices`: by its own rule where it has one (`hydraulis`),
    else placed on each candidate strategy, the fastest plan kept."""
    return OWN_RULES[name](prices, options) if name in OWN_RULES else StrategyChoice(name, prices, options)


class StrategyChoice(StepPlanner):
    """Planner `name` on every candidate strategy, the fastest plan kept (module docstring); it
    defers nothing and keeps no state: under strategies every sample trains in the step that drew it."""

    name: str = ""

    def __init__(self, name: str, prices: StrategyPrices, options: PlannerOptions | None = None):
        self.name, self.prices = name, prices
        self.options = options or PlannerOptions()
        self._planners: dict[Strategy, StrategyPlanner] = {}

    def plan(self, samples: Sequence[Sample]) -> StrategyPlan:
        """The step's plan under its chosen strategy among those that hold the batch."""
        candidates = [s for s in self.prices.strategies if self.prices.holds(s, samples)]
        if not candidates:
            raise InfeasibleError(f"the batch's longest sequence ({max(map(tokens, samples))} tokens) fits no "
                                  f"pipeline of {named(self.prices.strategies)}")
        return self.choose(candidates, samples)

    def choose(self, candidates: list[Strategy], samples: Sequence[Sample]) -> StrategyPlan:
        """The fastest of the plans on the candidate strategies under the cost model (the earlier
        on a tie), its step and how many plans were priced in its info."""
        plans = [plan for strategy in candidates for plan in self.plans_on(strategy, samples)]
        seconds = [self.prices.step_seconds(plan) for plan in plans]
        best = min(range(len(plans)), key=seconds.__getitem__)
        chosen = plans[best]
        chosen.planner = self.name
        chosen.info.update(step_s=seconds[best], plans_priced=len(plans))
        return chosen

    def plans_on(self, strategy: Strategy, samples: Sequence[Sample]) -> list[StrategyPlan]:
        """The plans to price on `strategy`: the planner placed on its pipelines."""
        return [self._planner(strategy).plan(samples)]

    def _planner(self, strategy: Strategy) -> StrategyPlanner:
        """The planner placed on `strategy`, made the first time a batch needs it."""
        if strategy not in self._planners:
            self._planners[strategy] = StrategyPlanner(self.name, strategy, self.prices.cluster,
                                                       self.prices.costs[strategy], self.options)
        return self._planners[strategy]

    def predicted_seconds(self, plan: StrategyPlan) -> float:
        return self.prices.step_seconds(plan)
