"""Simulate a step under a strategy: every pipeline's plan on its own ranks, side by side, with the
parameter movement of the canonical layout around them (`pricing/parameter_movement.py`).

The pipelines start together once the gather is done (no pass hides it) and run their parts as
`timeline.simulate` runs any plan; their cost models price no data-parallel sync of their own
(`Sharding.CANONICAL`), so a part's step is its schedule. The reduction into the canonical layout
starts when the last pipeline ends, then the optimizer steps each rank's shard:

    step = G + max_i (part i's schedule) + R + O
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..pricing.cost import CostModel
from ..pricing.parameter_movement import MovementPrices
from .step_metrics import StepMetrics
from .strategy_plan import StrategyPlan
from .timeline import simulate


@dataclass
class StrategyMetrics:
    """What simulating a strategy's plan gives."""

    parts: list[StepMetrics]
    """Each pipeline's part, simulated on its pool (its times from 0, after the gather)."""
    movement: MovementPrices

    @property
    def pipelines_time(self) -> float:
        """The longest pipeline's schedule: the step between the gather and the reduction."""
        return max(part.step_time for part in self.parts)

    @property
    def step_time(self) -> float:
        """The whole step (module docstring)."""
        return self.pipelines_time + self.movement.total

    @property
    def assigned_bound(self) -> float:
        """No step of this assignment of sequences to pipelines is shorter: the movement and the
        longest of the parts' own bounds (not a bound over other assignments)."""
        return max(part.lower_bound for part in self.parts) + self.movement.total


def simulate_strategy(plan: StrategyPlan, costs: Sequence[CostModel], movement: MovementPrices,
                      timeline: bool = False) -> StrategyMetrics:
    """Run every part of `plan` under its pipeline's cost model (`strategy_cost_models`) and add
    `movement` (`movement_prices` of the plan's strategy)."""
    assert len(costs) == len(plan.parts), (len(costs), len(plan.parts))
    for cost in costs:
        assert not cost.data_parallel.buckets, f"cost model {cost.source!r} prices a sync of its own"
    return StrategyMetrics([simulate(part, cost, cost.world_size, timeline) for part, cost in zip(plan.parts, costs)],
                           movement)
