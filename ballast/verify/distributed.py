"""The same steps under plans, on every rank of a job: what `ballast verify` checks."""
from __future__ import annotations

import functools

import torch.distributed as dist

from ..vocabulary.cluster import get_cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.precision import Precision
from ..models import build_model, part_load
from ..plans.plan import Plan
from ..plans.strategy_plan import StrategyPlan
from ..runtime import ModelBuild, ProcessGroups, broadcast_plan, parallelize
from ..pricing.parameter_movement import Movement
from ..runtime.strategy import StrategyExecutor
from ..runtime.routing import RoutingGroups, routing_groups
from .reference import VerifyBatch, Trajectory, flatten


def train_distributed(shape: ModelShape, plans: list[dict], batches: list[VerifyBatch], seed: int, lr: float,
                      groups: ProcessGroups, zero1: bool = False, fsdp: bool = False,
                      precision: Precision = Precision.AUTO, nodes: int = 1,
                      routing: RoutingGroups | None = None) -> Trajectory:
    """The steps under `plans` (Plan.to_dict of rank 0's plans), on every rank of the job, each
    on its device (`rank_device`: under NCCL the GPU LOCAL_RANK names), the trajectory's tensors
    on the CPU; with `fsdp` the model is sharded with FSDP2 (the plans must be lockstep);
    `precision` is the executor's. The job's ranks form `nodes` emulated nodes (the cpu
    cluster's), whose routing groups (`routing_groups`, made when None) routed waves use;
    `groups` were made for the job's mesh (`ProcessGroups.mesh`: the TP degree the model is split
    over, the PP degree it is cut into stages by). Parameters and gradients are gathered whole,
    every stage's (`Executor.parameters`, `Executor.gradients`)."""
    cluster = get_cluster("cpu", world_size=dist.get_world_size(), nodes=nodes)
    build = ModelBuild(shape, functools.partial(build_model, shape, seed), part_load(shape))
    executor = parallelize(build, cluster, groups=groups, routing=routing, fsdp=fsdp, zero1=zero1, precision=precision,
                           lr=lr)
    losses, grads, starts = [], [], []
    for plan_data, batch in zip(plans, batches, strict=True):
        plan, _ = broadcast_plan(Plan.from_dict(plan_data) if dist.get_rank() == 0 else None)
        starts.append(flatten(executor.parameters()))
        losses.append(executor.step(plan, batch.samples).loss)
        # The step leaves the summed gradients in place (optimizers do not clear them).
        grads.append(flatten(executor.gradients()))
    return Trajectory(losses, grads, starts, flatten(executor.parameters()))


def train_all_planners(shape: ModelShape, plans: dict[str, list[dict]], batches: list[VerifyBatch], seed: int,
                        lr: float, zero1: bool, fsdp: bool, nodes: int = 1, precision: Precision = Precision.AUTO,
                        tp: int = 1, pp: int = 1) -> dict[str, Trajectory] | None:
    cluster = get_cluster("cpu", world_size=dist.get_world_size(), nodes=nodes)
    mesh = JobMesh.of(cluster, tp=tp, pp=pp)
    groups = ProcessGroups(mesh)
    routing = routing_groups(cluster) if (tp, pp) == (1, 1) else None
    out = {name: train_distributed(shape, p, batches, seed, lr, groups, zero1, fsdp, precision, nodes, routing)
           for name, p in plans.items()}
    return out if dist.get_rank() == 0 else None


def train_strategies(shape: ModelShape, plans: list[dict], batches: list[VerifyBatch], seed: int, lr: float,
                     precision: Precision = Precision.AUTO, movement: Movement = Movement.SLICED) -> Trajectory | None:
    """The steps under strategy plans (`StrategyPlan.to_dict` of each step's, whose strategies may
    differ from step to step), on every rank of the job: the state in the canonical layout, each
    rank's pipeline running its part (`runtime/strategy.py`), the parameters moved by `movement`.
    Rank 0's trajectory, the others None."""
    cluster = get_cluster("cpu", world_size=dist.get_world_size())
    executor = StrategyExecutor(functools.partial(build_model, shape, seed), cluster, precision=precision,
                                movement=movement, part=part_load(shape), lr=lr)
    losses, grads, starts = [], [], []
    for plan_data, batch in zip(plans, batches, strict=True):
        plan = StrategyPlan.from_dict(plan_data)
        starts.append(flatten(executor.parameters()))
        losses.append(executor.step(plan, batch.samples).loss)
        grads.append(flatten(executor.gradients()))
    trajectory = Trajectory(losses, grads, starts, flatten(executor.parameters()))
    return trajectory if dist.get_rank() == 0 else None
