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
    4. the weights: under PP every rank keeps its stage's part of the model (`pipeline/split.py`),
       under TP its shard of the split layers of that part (`tensor_parallel/`, the model's own
       plan); only that part goes to the rank's device (a model built on the host never holds
       more than its shard there), and every rank of a pool takes its first rank's (a
       broadcast, a bucket at a time: the weights the model was built with, alike on every
       rank, from one of them), replicated over the pool or then sharded over it with FSDP2
       (`fsdp.py`). Given a `ModelBuild` (as train and verify give theirs), the ranks of a host
       build it in turns (`build_turns.py`), each keeping its part before the next turn
       builds, so a host holds as many whole models at once as its memory does;
    5. AdamW over the parameters, its state sharded over the pool with ZeRO-1 or not (FSDP2
       shards it with the parameters), and for replicated weights the bucketed gradient sync
       over the pool (`grad_sync.py`; FSDP2 reduces its own);
    6. the `Executor` that runs plans with all of it (`PipelineExecutor` under PP).

Train, verify, profile, check and bench all build their executor here.
"""
from __future__ import annotations

import dataclasses
import itertools

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
from .fsdp import is_sharded, shard_model
from ..vocabulary.sharding import BUCKET_BYTES
from .grad_sync import GradSync, chunks, zero1_owners
from .groups import ProcessGroups
from .pipeline import PipelineExecutor, split_model
from .routing import NodeNics, RoutingGroups, routing_groups
from .world import rank_device
from .tensor_parallel import TensorParallel, parallelize_tensors
from .build_turns import ModelBuild, in_turns


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
    built = isinstance(model, nn.Module)  # else a ModelBuild, built below in turns: on the host, never sharded
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
    elif built:
        tensor_parallel = local_part(model, mesh, groups)
    else:
        model, tensor_parallel = built_in_turns(model, mesh, groups)
    if not sharded:
        if broadcast:
            here = mesh.coordinate(dist.get_rank())
            broadcast_weights(model, mesh.rank(here.stage, 0, here.tp_index), None if plain else groups.pool)
        if fsdp:
            shard_model(model, bf16=precision.autocast(next(model.parameters()).device.type),
                        group=None if plain else groups.pool)
    optimizer = make_optimizer(model, zero1, group=None if plain else groups.pool, **adamw)
    sync = None
    if not is_sharded(model):
        params = [p for p in model.parameters() if p.requires_grad]
        owners = zero1_owners(optimizer, params, None if plain else groups.pool) if zero1 else None
        sync = GradSync(params, groups.gradients, bucket_bytes, owners)
    run = PipelineExecutor if mesh.pp > 1 else Executor
    return run(model, optimizer, cluster, mesh, groups, routing, sync=sync, tensor_parallel=tensor_parallel,
               measure_activations=measure_activations, precision=precision)


def local_part(model: ParallelModel, mesh: JobMesh, groups: ProcessGroups) -> TensorParallel | None:
    """Keep this rank's part of `model` and move it to the rank's device: under PP its stage's
    blocks, under TP its shard of their split layers; the sequence-parallel attention installed.
    Its TP split (None without TP). No collective: the ranks of a host may run it in turns."""
    model.install_attention(sequence_parallel_attention)
    here = mesh.coordinate(dist.get_rank())
    if mesh.pp > 1:
        split_model(model, mesh, here.stage)
    tensor_parallel = parallelize_tensors(model, groups.tensor, mesh.tp, here.tp_index) if mesh.tp > 1 else None
    to_device(model, rank_device())
    return tensor_parallel


def built_in_turns(build: ModelBuild, mesh: JobMesh, groups: ProcessGroups
                   ) -> tuple[ParallelModel, TensorParallel | None]:
    """`build`'s model built on this rank's host in its turn (`build_turns.in_turns`), and its
    part kept (`local_part`) before the next turn builds; where a rank can read its part of the
    weights (`ModelBuild.part`), built without them, cut, and its part read, in no turn."""
    if build.part is not None:
        model = build.part.skeleton()
        tensor_parallel = local_part(model, mesh, groups)
        build.part.fill(model, tensor_parallel.shard_of if tensor_parallel is not None else lambda name: None)
        return model, tensor_parallel

    def part() -> tuple[ParallelModel, TensorParallel | None]:
        model = build.build()
        return model, local_part(model, mesh, groups)

    return in_turns(build.shape, part, mesh.first, groups.job)


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


def to_device(model: nn.Module, device: torch.device) -> None:
    """Move `model` to `device` in place; its tensors on the meta device (built without weights)
    get empty storage there, which its caller fills, and the others keep their values (the
    buffers of a model whose parameters alone were left on meta, `models.PartLoad`)."""
    named = list(itertools.chain(model.named_parameters(), model.named_buffers()))
    if not any(t.is_meta for _, t in named):
        model.to(device)
        return
    kept = {name: t.detach().clone() for name, t in named if not t.is_meta}
    # to_empty gives each module a parameter of its own (from meta it cannot swap the data in
    # place), which would untie a tied embedding and output layer: tied again after.
    tied: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    model.to_empty(device=device)
    for first, *others in tied.values():
        for name in others:
            owner, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(owner), attribute, model.get_parameter(first))
    with torch.no_grad():
        for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
            if name in kept:
                t.copy_(kept[name])


def broadcast_weights(model: nn.Module, src: int = 0, group: ProcessGroup | None = None,
                      bucket_bytes: int = BUCKET_BYTES) -> None:
    """Every rank (of `group`) takes global rank `src`'s weights: the summed gradient means
    something only if all ranks start from the same ones. One broadcast per bucket of about
    `bucket_bytes` of the parameters flattened, sent from the backend's device (NCCL's is the
    GPU) and copied back where the parameters are: a model built on the host never has more
    than a bucket of itself on the device."""
    device = rank_device()
    params = [p for p in model.parameters() if p.requires_grad]
    for bucket in chunks(params, bucket_bytes):
        flat = torch.cat([p.detach().reshape(-1) for p in bucket]).to(device)
        dist.broadcast(flat, src=src, group=group)
        with torch.no_grad():
            for p, piece in zip(bucket, torch.split(flat, [p.numel() for p in bucket])):
                p.copy_(piece.view_as(p))

