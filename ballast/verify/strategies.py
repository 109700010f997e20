"""`ballast verify --strategy`: every planner's plans placed on heterogeneous strategies
(`planners/strategy_choice.py`; hydraulis by its own rule), one strategy a step in turn, trained
on the job's ranks from the canonical layout (`runtime/strategy.py`), against the same
single-process reference as any plan."""
from __future__ import annotations

import argparse

import torch.distributed as dist

from ..command_line.options import refuse_with_strategy
from ..planners import PlannerOptions
from ..planners.strategy_choice import strategy_planner
from ..planners.strategy_prices import StrategyPrices
from ..plans.strategy_plan import StrategyPlan
from ..vocabulary.cluster import get_cluster
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.precision import Precision
from ..vocabulary.strategy import Strategy
from .distributed import train_strategies
from .reference import Trajectory, VerifyBatch


def check_strategy_flags(args: argparse.Namespace) -> None:
    """ValueError naming a flag a strategy does not combine with (`refuse_with_strategy`)."""
    refuse_with_strategy((("--tp", args.tp > 1), ("--pp", args.pp > 1), ("--zero1", args.zero1),
                          ("--fsdp", args.fsdp), ("--nodes", args.nodes > 1),
                          ("--route-every-wave", args.route_every_wave), ("--degree", args.degree is not None),
                          ("--cp", args.cp is not None)))


def plan_strategies(names: list[str], strategies: tuple[Strategy, ...], shape: ModelShape, world: int,
                    device_memory: float, options: PlannerOptions,
                    batches: list[VerifyBatch]) -> dict[str, list[StrategyPlan]]:
    """Each planner's validated plan of every batch, step k under strategies[k mod their count]
    (by the planner's own rule on that one strategy where it has one: `strategy_planner`), at
    `device_memory` bytes per rank."""
    cluster = get_cluster("cpu", world_size=world, device_memory_gb=device_memory / 1e9)
    prices = {s: StrategyPrices([s], "analytic", shape, cluster) for s in strategies}
    plans = {}
    for name in names:
        planners = {s: strategy_planner(name, prices[s], options) for s in strategies}
        plans[name] = []
        for k, batch in enumerate(batches):
            strategy = strategies[k % len(strategies)]
            plan = planners[strategy].plan(batch.planned)
            plan.validate(cluster, prices[strategy].costs[strategy])
            plans[name].append(plan)
    return plans


def pipelines_used(plans: list[StrategyPlan]) -> str:
    """Busy pipelines of each step's strategy, as "4/4,1/2"."""
    return ",".join(f"{sum(1 for p in plan.parts if p.lengths)}/{len(plan.parts)}" for plan in plans)


def train_all_strategy_planners(shape: ModelShape, plans: dict[str, list[dict]], batches: list[VerifyBatch],
                                seed: int, lr: float, precision: Precision) -> dict[str, Trajectory] | None:
    out = {name: train_strategies(shape, p, batches, seed, lr, precision) for name, p in plans.items()}
    return out if dist.get_rank() == 0 else None
