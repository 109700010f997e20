"""The one place parallelism is applied to a model: `parallelize(model, cluster) -> Executor`.

torchtitan's order, for a model built the same way on every rank:

    1. checks that need no communication (world size against the cluster, the job's mesh against
       the cluster and the model, precision, the sharding options), so a user error stops every
       rank before any collective;
    2. the process groups of the plans' blocks over the pool and the TP groups (`groups.py`)
       and, on two or more nodes without TP or PP, the routing groups that routed waves run
       their inter-node exchanges over (`routing.py`), unless given (a job shares them between
       its executors);
    3. sequence-parallel attention (`attention.py`) installed through the model's own hook
       (`ParallelModel.install_attention`: the runtime knows no model family);
    4. the weights (`placement.py`): under PP every rank keeps its stage's part of the model
       (`pipeline/split.py`), under TP its shard of the split layers of that part
       (`tensor_parallel/`, the model's own plan); only that part goes to the rank's device (a
       model built on the host never holds more than its shard there; under FSDP2 never more
       than its shards and one block), and every rank of a pool takes its first rank's (a
       broadcast, a bucket at a time: the weights the model was built with, alike on every
       rank, from one of them), replicated over the pool or then sharded over it with FSDP2
       (`fsdp.py`). Given a `ModelBuild` (as train and verify give theirs), the ranks of a host
       build it in turns (`build_turns.py`), each keeping its part before the next turn
       builds, so a host holds as many whole models at once as its memory does; or, where its
       weights can be read a part at a time (a Hugging Face folder), each rank reads its block
       of every tensor into a model built without weights;
    5. AdamW over the parameters, its state sharded over the pool with ZeRO-1 or not (FSDP2
       shards it with the parameters), and for replicated weights the bucketed gradient sync
       over the pool (`grad_sync.py`; FSDP2 reduces its own);
    6. the `Executor` that runs plans with all of it (`PipelineExecutor` under PP).

Train, verify, profile, check and bench all build their executor here.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from ..vocabulary.cluster import Cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.precision import Precision
from ..models.protocol import ParallelModel
from .attention import sequence_parallel_attention
from .executor import Executor
from .fsdp import is_sharded
from ..vocabulary.sharding import BUCKET_BYTES
from .grad_sync import GradSync, zero1_owners
from .groups import ProcessGroups
from .pipeline import PipelineExecutor
from .placement import place
from .routing import NodeNics, RoutingGroups, routing_groups
from .world import rank_device
from .build_turns import ModelBuild


def parallelize(model: ParallelModel | ModelBuild, cluster: Cluster, *, mesh: JobMesh | None = None,
                groups: ProcessGroups | None = None,
                routing: RoutingGroups | None = None, fsdp: bool = False, zero1: bool = False,
                precision: Precision = Precision.AUTO, bucket_bytes: int = BUCKET_BYTES,
                measure_activations: bool = False, broadcast: bool = True, **adamw: float) -> Executor:
    """The executor that runs plans of `cluster` with `model` on this rank (a collective: every
    rank of the job calls it with a model built alike, or the `ModelBuild` that builds it alike).

    mesh: the job's TP degree, PP degree and pool (`JobMesh`; None: the cluster's ranks all one
    pool); plans then run over the pool's ranks, the model is cut into the mesh's pipeline
    stages and each stage's part split over its TP groups.
    groups: the job's cached process groups, made for `mesh` (made here when None; share one
    between executors). routing: the routing groups of the cluster's nodes, which routed waves
    use (made here when None and the cluster has two or more nodes, `routing.routing_groups`;
    share them likewise; none under TP or PP, whose plans cannot route).
    fsdp / zero1: shard parameters, gradients and optimizer state (FSDP2), or the optimizer
    state only (ZeRO-1), over the pool; at most one, and not FSDP2 under PP. precision:
    `Precision.AUTO` (bf16 autocast on CUDA, fp32 elsewhere), `BF16` or `FP32`; under bf16 FSDP2
    gathers the parameters in bf16.
    bucket_bytes: the gradient sync's bucket size (`sharding.BUCKET_BYTES`; not under FSDP2).
    measure_activations: record the bytes each micro-batch saves for backward.
    broadcast: start every pool from its first rank's weights; False where the caller fills every trained weight
    and buffer after (a strategy's compute model, from the canonical layout), which a model
    built without weights (`build_model(weights=False)`, on the meta device) requires: it then
    gets empty storage on the device. adamw: AdamW's keyword arguments (lr, betas, ...).
    """
    world = dist.get_world_size()
    given = mesh or (groups.mesh if groups is not None else None)
    cluster.check_world_size(world if given is None or given.ranks == range(world) else given.world_size)
    if not isinstance(precision, Precision):
        raise ValueError(f"precision must be a Precision ({', '.join(p.value for p in Precision)}), got {precision!r}")
    if zero1 and fsdp:
        raise ValueError("ZeRO-1 and FSDP both shard the optimizer state: use one of them")
    if routing is not None and routing.nics != NodeNics.of(cluster):
        raise ValueError(f"routing groups for {routing.nics} do not match cluster {cluster.name!r}'s nodes, "
                         f"{NodeNics.of(cluster)}")
    built = isinstance(model, nn.Module)  # else a ModelBuild, built (or read) by `place`: never sharded before
    if broadcast and built and any(p.is_meta for p in model.parameters()):
        raise ValueError("a model built without weights (on the meta device) has none to broadcast: "
                         "pass broadcast=False and fill its weights after")
    if bucket_bytes < 1:
        raise ValueError(f"the gradient bucket size must be >= 1 byte, got {bucket_bytes}")
    if mesh is None:  # the groups' TP and PP degrees (their mesh knows no nodes), else one pool
        mesh = JobMesh.of(cluster, groups.mesh.tp, groups.mesh.pp) if groups is not None else JobMesh.of(cluster)
        mesh = dataclasses.replace(mesh, first=groups.mesh.first) if groups is not None else mesh
    mesh.check_cluster(cluster)
    mesh.check_model(model.shape)
    if groups is not None and (groups.mesh.tp, groups.mesh.pp, groups.mesh.first) != (mesh.tp, mesh.pp, mesh.first):
        raise ValueError(f"process groups made for {groups.mesh.describe()}, but the job runs {mesh.describe()}")
    sharded = built and is_sharded(model)
    if mesh.pp > 1 and (fsdp or sharded):
        raise ValueError(f"FSDP2 does not run under pipeline parallelism (PP degree {mesh.pp}): a stage's empty "
                         f"slots would have to join its all-gathers; use ZeRO-1 or replicated weights with --pp")
    if mesh.tp > 1 and sharded:
        raise ValueError("a model sharded with FSDP before parallelize cannot be split for TP: pass fsdp=True, "
                         "which shards it after the split")
    # A job's one pool over the whole world, whose collectives run on the default group; a
    # strategy's pipeline (a block of the world) runs its own over its groups.
    plain = (mesh.tp, mesh.pp) == (1, 1) and mesh.ranks == range(world)
    groups = groups if groups is not None else ProcessGroups(mesh)
    routing = routing or (routing_groups(cluster) if plain else None)
    if sharded:  # sharded before (a test's own FSDP2 model): already where it runs
        model.install_attention(sequence_parallel_attention)
        tensor_parallel = None
    else:
        model, tensor_parallel = place(model, mesh, groups, fsdp=fsdp, bf16=precision.autocast(rank_device().type),
                                       broadcast=broadcast, pool=None if plain else groups.pool)
    optimizer = make_optimizer(model, zero1, group=None if plain else groups.pool, **adamw)
    sync = None
    if not is_sharded(model):
        params = [p for p in model.parameters() if p.requires_grad]
        owners = zero1_owners(optimizer, params, None if plain else groups.pool) if zero1 else None
        sync = GradSync(params, groups.gradients, bucket_bytes, owners)
    run = PipelineExecutor if mesh.pp > 1 else Executor
    return run(model, optimizer, cluster, mesh, groups, routing, sync=sync, tensor_parallel=tensor_parallel,
               measure_activations=measure_activations, precision=precision)


def make_optimizer(model: nn.Module, zero1: bool = False, *, group: ProcessGroup | None = None,
                   **adamw: float) -> torch.optim.Optimizer:
    """AdamW over the model's parameters; with `zero1`, its state sharded over the world, or over
    `group` (a pool's ranks under tensor or pipeline parallelism) (ZeRO-1): each rank keeps and
    updates the state of its share of the parameters, then broadcasts them. A model sharded with
    FSDP (`shard_model`) has sharded state already."""
    params = [p for p in model.parameters() if p.requires_grad]
    if zero1 and is_sharded(model):
        raise ValueError("ZeRO-1 and FSDP both shard the optimizer state: use one of them")
    if zero1:
        # Imported here: torch.distributed.optim costs every rank about 0.5 s at start.
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=group, **adamw)
    return torch.optim.AdamW(params, **adamw)
