"""What prices a step under each of a run's strategies (docs/design.md, section 6, *Strategies*):
every pipeline's cost model, the strategy's parameter movement, and which batches a strategy
holds; the planners that choose a step's strategy (`strategy_choice.py`, `hydraulis_strategies.py`)
share it."""
from __future__ import annotations

from typing import Sequence

from ..plans.strategy_plan import StrategyPlan
from ..plans.strategy_timeline import simulate_strategy
from ..pricing.cost import CostModel
from ..pricing.cost_sources import strategy_cost_models
from ..pricing.parameter_movement import Movement, MovementPrices, movement_prices
from ..pricing.sequence_times import sequence_times
from ..vocabulary.cluster import Cluster
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.samples import Sample
from ..vocabulary.strategy import Strategy


class StrategyPrices:
    """What prices a step under each of `strategies`: every pipeline's cost model and the
    strategy's parameter movement."""

    def __init__(self, strategies: Sequence[Strategy], spec: str, shape: ModelShape, cluster: Cluster,
                 device_memory_gb: float | None = None, movement: Movement = Movement.SLICED):
        if not strategies:
            raise ValueError("no strategy to plan on")
        self.strategies, self.cluster = tuple(strategies), cluster
        self._made = (spec, shape, device_memory_gb, movement)
        self.costs: dict[Strategy, list[CostModel]] = {}
        self.moves: dict[Strategy, MovementPrices] = {}
        for strategy in self.strategies:
            self.price(strategy)

    def price(self, strategy: Strategy) -> None:
        """Price `strategy` too (a planner may plan on a strategy of its own making over the same
        ranks: `ballast/strategy.py`'s pooled replicas); ValueError if it does not fit the cluster."""
        if strategy in self.costs:
            return
        spec, shape, device_memory_gb, movement = self._made
        self.costs[strategy] = strategy_cost_models(spec, shape, self.cluster, strategy, device_memory_gb)
        self.moves[strategy] = movement_prices(strategy, shape, self.cluster, movement)

    def step_seconds(self, plan: StrategyPlan) -> float:
        """The plan's whole step: its slowest pipeline between the gather and the reduction, then
        the optimizer on the canonical shards."""
        return simulate_strategy(plan, self.costs[plan.strategy], self.moves[plan.strategy]).step_time

    def holds(self, strategy: Strategy, samples: Sequence[Sample]) -> bool:
        """Whether every sample fits some pipeline of `strategy` (at its largest SP degree with
        every layer recomputed, if need be)."""
        # A layout's pipelines share one cost model's capacity: each distinct layout once (a
        # thousand ranks run a hundred pipelines of four layouts).
        distinct = dict(zip(strategy.pipelines, self.costs[strategy]))
        fits = [sequence_times(cost, samples) < float("inf") for cost in distinct.values()]
        return bool(sum(f.any(axis=0) for f in fits).all())

    def check_max_len(self, max_len: int | None) -> None:
        """ValueError when a sequence of `max_len` tokens fits no pipeline of any strategy: known
        before any batch, so a run fails at its start."""
        if max_len is not None and not any(self.holds(s, [max_len]) for s in self.strategies):
            raise ValueError(f"--max-len {max_len}: a sequence of that length fits no pipeline of "
                             f"{named(self.strategies)}, not even at the largest SP degree of each pool with every "
                             f"layer recomputed; give a strategy with larger pipelines, more device memory, or a "
                             f"shorter --max-len")


def named(strategies: Sequence[Strategy]) -> str:
    """The strategies as an error message names them."""
    return f"strategy {strategies[0]}" if len(strategies) == 1 else "any of strategies " + "; ".join(map(str, strategies))
