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
from ..plans.strategy_timeline import simulate_strategy
from ..pricing.coefficients import InfeasibleError
from ..pricing.cost import CostModel
from ..pricing.cost_sources import strategy_cost_models
from ..pricing.parameter_movement import Movement, MovementPrices, movement_prices
from ..pricing.sequence_times import sequence_times
from ..vocabulary.cluster import Cluster
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.samples import Sample, tokens
from ..vocabulary.strategy import Strategy
from .base import PlannerOptions
from .strategies import StrategyPlanner


class StrategyPrices:
    """What prices a step under each of `strategies`: every pipeline's cost model and the
    strategy's parameter movement."""

    def __init__(self, strategies: Sequence[Strategy], spec: str, shape: ModelShape, cluster: Cluster,
                 device_memory_gb: float | None = None, movement: Movement = Movement.FULL):
        if not strategies:
            raise ValueError("no strategy to plan on")
        self.strategies, self.cluster = tuple(strategies), cluster
        self.costs: dict[Strategy, list[CostModel]] = {
            s: strategy_cost_models(spec, shape, cluster, s, device_memory_gb) for s in self.strategies}
        self.moves: dict[Strategy, MovementPrices] = {s: movement_prices(s, shape, cluster, movement)
                                                     for s in self.strategies}

    def step_seconds(self, plan: StrategyPlan) -> float:
        """The plan's whole step: its slowest pipeline between the gather and the reduction, then
        the optimizer on the canonical shards."""
        return simulate_strategy(plan, self.costs[plan.strategy], self.moves[plan.strategy]).step_time

    def holds(self, strategy: Strategy, samples: Sequence[Sample]) -> bool:
        """Whether every sample fits some pipeline of `strategy` (at its largest SP degree with
        every layer recomputed, if need be)."""
        fits = [sequence_times(cost, samples) < float("inf") for cost in self.costs[strategy]]
        return bool(sum(f.any(axis=0) for f in fits).all())

    def check_max_len(self, max_len: int | None) -> None:
        """ValueError when a sequence of `max_len` tokens fits no pipeline of any strategy: known
        before any batch, so a run fails at its start."""
        if max_len is not None and not any(self.holds(s, [max_len]) for s in self.strategies):
            raise ValueError(f"--max-len {max_len}: a sequence of that length fits no pipeline of "
                             f"{_named(self.strategies)}, not even at the largest SP degree of each pool with every "
                             f"layer recomputed; give a strategy with larger pipelines, more device memory, or a "
                             f"shorter --max-len")


class StrategyChoice:
    """Planner `name` on every candidate strategy, the fastest plan kept (module docstring)."""

    def __init__(self, name: str, prices: StrategyPrices, options: PlannerOptions | None = None):
        self.name, self.prices = name, prices
        self.planners = {s: StrategyPlanner(name, s, prices.cluster, prices.costs[s], options)
                         for s in prices.strategies}

    def plan(self, samples: Sequence[Sample]) -> StrategyPlan:
        """The step's plan under its fastest candidate strategy (the earlier on a tie)."""
        candidates = [s for s in self.prices.strategies if self.prices.holds(s, samples)]
        if not candidates:
            raise InfeasibleError(f"the batch's longest sequence ({max(map(tokens, samples))} tokens) fits no "
                                  f"pipeline of {_named(self.prices.strategies)}")
        plans = [self.planners[s].plan(samples) for s in candidates]
        seconds = [self.prices.step_seconds(plan) for plan in plans]
        best = min(range(len(plans)), key=seconds.__getitem__)
        plans[best].info["strategy_seconds"] = {str(s): t for s, t in zip(candidates, seconds)}
        return plans[best]

    def predicted_seconds(self, plan: StrategyPlan) -> float:
        return self.prices.step_seconds(plan)

    def defer(self, samples: Sequence[Sample]) -> list[int]:
        """Nothing waits: under strategies every sample trains in the step that drew it."""
        del samples
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state


def _named(strategies: Sequence[Strategy]) -> str:
    return f"strategy {strategies[0]}" if len(strategies) == 1 else "any of strategies " + "; ".join(map(str, strategies))
