"""The one place parallelism is applied to a model: `parallelize(model, cluster) -> Executor`.

torchtitan's order, for a model built the same way on every rank:

    1. checks that need no communication (world size against the cluster, precision, the
       sharding options), so a user error stops every rank before any collective;
    2. the process groups of the plans' blocks (`groups.py`) and, on two or more nodes, the
       routing groups that routed waves run their inter-node exchanges over (`routing.py`),
       unless given (a job shares them between its executors);
    3. sequence-parallel attention (`attention.py`) installed through the model's own hook
       (`ParallelModel.install_attention`: the runtime knows no model family);
    4. the weights: every rank starts from rank 0's (one broadcast), replicated or then sharded
       with FSDP2 (`fsdp.py`); under a pipeline (`pipeline/`) each rank then keeps its stage's
       part of the model (`split_model`);
    5. AdamW over the parameters, its state sharded over the world (a pipeline stage's pool)
       with ZeRO-1 or not (FSDP2 shards it with the parameters), and for replicated weights the
       bucketed gradient sync (`grad_sync.py`, over the pool; FSDP2 reduces its own);
    6. the `Executor` that runs plans with all of it (`PipelineExecutor` under a pipeline).

Train, verify, profile, check and bench all build their executor here.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..vocabulary.cluster import Cluster
from ..vocabulary.precision import Precision
from ..models.protocol import ParallelModel
from .attention import sequence_parallel_attention
from .executor import Executor
from .fsdp import is_sharded, shard_model
from .grad_sync import BUCKET_BYTES, GradSync, zero1_owners
from .groups import ProcessGroups
from .pipeline import PipelineConfig, PipelineExecutor, split_model
from .routing import NodeNics, RoutingGroups, routing_groups


def parallelize(model: ParallelModel, cluster: Cluster, *, groups: ProcessGroups | None = None,
                routing: RoutingGroups | None = None, fsdp: bool = False, zero1: bool = False,
                precision: Precision = Precision.AUTO, bucket_bytes: int = BUCKET_BYTES,
                measure_activations: bool = False, pipeline: PipelineConfig | None = None,
                **adamw: float) -> Executor:
    """The executor that runs plans of `cluster` with `model` on this rank (a collective: every
    rank of the job calls it with a model built alike).

    groups: the job's cached process groups (made here when None; share one between executors).
    routing: the routing groups of the cluster's nodes, which routed waves use (made here when
    None and the cluster has two or more nodes, `routing.routing_groups`; share them likewise).
    fsdp / zero1: shard parameters, gradients and optimizer state (FSDP2), or the optimizer
    state only (ZeRO-1); at most one. precision: `Precision.AUTO` (bf16 autocast on CUDA, fp32
    elsewhere), `BF16` or `FP32`; under bf16 FSDP2 gathers the parameters in bf16.
    bucket_bytes: the gradient sync's bucket size (`grad_sync.BUCKET_BYTES`; not under FSDP2).
    measure_activations: record the bytes each micro-batch saves for backward. pipeline: the
    job's pipeline stages, each a pool of `cluster`'s ranks (None: one stage, the cluster the
    whole job). adamw: AdamW's keyword arguments (lr, betas, weight_decay, ...).
    """
    world = dist.get_world_size()
    pipeline = pipeline or PipelineConfig(1, world)
    pipeline.check(world, model.shape)
    cluster.check_world_size(pipeline.pool)
    if not isinstance(precision, Precision):
        raise ValueError(f"precision must be a Precision ({', '.join(p.value for p in Precision)}), got {precision!r}")
    if zero1 and fsdp:
        raise ValueError("ZeRO-1 and FSDP both shard the optimizer state: use one of them")
    if pipeline.stages > 1 and (fsdp or is_sharded(model)):
        raise ValueError("FSDP2 does not run under pipeline parallelism here (each stage's pool would shard its "
                         "stage): use ZeRO-1 or replicated weights with --pp")
    if pipeline.stages > 1 and cluster.nodes > 1:
        raise ValueError(f"pipeline parallelism runs each stage's pool as one node here; cluster "
                         f"{cluster.name!r} has {cluster.nodes}")
    if routing is not None and routing.nics != NodeNics.of(cluster):
        raise ValueError(f"routing groups for {routing.nics} do not match cluster {cluster.name!r}'s nodes, "
                         f"{NodeNics.of(cluster)}")
    if bucket_bytes < 1:
        raise ValueError(f"the gradient bucket size must be >= 1 byte, got {bucket_bytes}")
    groups = groups or ProcessGroups(pipeline.pools())
    assert groups.pool == pipeline.pools()[pipeline.stage_of(dist.get_rank())], "groups of another pipeline"
    routing = routing or routing_groups(cluster)
    model.install_attention(sequence_parallel_attention)
    if not is_sharded(model):
        broadcast_weights(model)
        if pipeline.stages > 1:  # every stage keeps its part of rank 0's weights
            split_model(model, pipeline, pipeline.stage_of(dist.get_rank()))
        if fsdp:
            shard_model(model, bf16=precision.autocast(next(model.parameters()).device.type))
    optimizer = make_optimizer(model, zero1, groups.pool_group, **adamw)
    sync = None
    if not is_sharded(model):
        params = [p for p in model.parameters() if p.requires_grad]
        sync = GradSync(params, groups.gradients, bucket_bytes,
                        zero1_owners(optimizer, params, groups.pool_group) if zero1 else None)
    if pipeline.stages > 1:
        return PipelineExecutor(model, optimizer, cluster, groups, pipeline, sync=sync,
                                measure_activations=measure_activations, precision=precision)
    return Executor(model, optimizer, cluster, groups, routing, sync=sync,
                    measure_activations=measure_activations, precision=precision)


def make_optimizer(model: nn.Module, zero1: bool = False, group: dist.ProcessGroup | None = None,
                   **adamw: float) -> torch.optim.Optimizer:
    """AdamW over the model's parameters; with `zero1`, its state sharded over `group` (the world
    when None; a pipeline stage's pool) (ZeRO-1): each rank keeps and updates the state of its
    share of the parameters, then broadcasts them. A model sharded with FSDP (`shard_model`) has
    sharded state already."""
    params = [p for p in model.parameters() if p.requires_grad]
    if zero1 and is_sharded(model):
        raise ValueError("ZeRO-1 and FSDP both shard the optimizer state: use one of them")
    if zero1:
        # Imported here: torch.distributed.optim costs every rank about 0.5 s at start.
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=group, **adamw)
    return torch.optim.AdamW(params, **adamw)


def broadcast_weights(model: nn.Module) -> None:
    """Every rank takes rank 0's weights: the summed gradient means something only if all ranks
    start from the same ones. One broadcast of all parameters flattened."""
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    dist.broadcast(flat, src=0)
    with torch.no_grad():
        for p, piece in zip(params, torch.split(flat, [p.numel() for p in params])):
            p.copy_(piece.view_as(p))
