"""Where a rank's part of the model comes from and where it goes (`parallelize`'s step 4).

    a built model   cut to the rank's pipeline stage (`pipeline/split.py`), split to its TP shard
                    (`tensor_parallel/`), put on its device; every pool takes its first rank's
                    weights (a broadcast, a bucket at a time); then, under FSDP2, sharded over
                    the pool (`fsdp.py`)
    a ModelBuild    built whole on the host, a host's ranks in turns (`build_turns.py`), each
                    keeping its part before the next turn builds; then as a built model
    a part read     (`ModelBuild.part`: a Hugging Face folder's safetensors) built without its
                    weights, cut and split on the meta device, under FSDP2 sharded there too,
                    given storage on the device, and only the rank's block of every tensor read
                    from the files (`held_block`); no broadcast: every rank reads the same files

Under FSDP2 the rank's whole part never sits on its device: a built one stays on the host until
`fully_shard` moves it a block at a time (each block whole there only until it is sharded), a
read one is sharded while on the meta device and each rank reads just its rows of every tensor.
No collective before the broadcast or the sharding, so the ranks of a host may build in turns.
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor, Shard

from ..models.protocol import ParallelModel, PartLoad
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.sharding import BUCKET_BYTES
from .attention import sequence_parallel_attention
from .build_turns import ModelBuild, in_turns
from .fsdp import shard_model
from .grad_sync import chunks
from .groups import ProcessGroups
from .pipeline import split_model
from .tensor_parallel import TensorParallel, parallelize_tensors
from .world import rank_device


def place(model: ParallelModel | ModelBuild, mesh: JobMesh, groups: ProcessGroups, *, fsdp: bool, bf16: bool,
          broadcast: bool, pool: ProcessGroup | None) -> tuple[ParallelModel, TensorParallel | None]:
    """This rank's part of `model` (built, or a `ModelBuild`) on its device (module docstring),
    and its TP split (None without TP). `bf16`: the run computes in bf16 (FSDP2 then gathers in
    bf16); `broadcast`: every pool takes its first rank's weights; `pool`: the pool's group
    (None: the world's)."""
    device = rank_device()
    if isinstance(model, ModelBuild) and model.part is not None:
        return _read(model.part, mesh, groups, fsdp, bf16, pool)
    keep_on = None if fsdp else device  # FSDP2 moves each block as it shards it
    if isinstance(model, nn.Module):
        tensor_parallel = local_part(model, mesh, groups, keep_on)
    else:
        model, tensor_parallel = in_turns(model.shape, lambda: _built_part(model, mesh, groups, keep_on),
                                          mesh.first, groups.job)
    if broadcast:
        here = mesh.coordinate(dist.get_rank())
        broadcast_weights(model, mesh.rank(here.stage, 0, here.tp_index), pool)
    if fsdp:
        shard_model(model, bf16=bf16, group=pool, device=device)
        to_device(model, device)  # a model built without weights: its shards' storage
    return model, tensor_parallel


def _built_part(build: ModelBuild, mesh: JobMesh, groups: ProcessGroups, device: torch.device | None
                ) -> tuple[ParallelModel, TensorParallel | None]:
    """`build`'s model built whole on the host and its part kept (in the rank's turn)."""
    model = build.build()
    return model, local_part(model, mesh, groups, device)


def _read(part: PartLoad, mesh: JobMesh, groups: ProcessGroups, fsdp: bool, bf16: bool, pool: ProcessGroup | None
          ) -> tuple[ParallelModel, TensorParallel | None]:
    """The rank's part read from the weights (module docstring)."""
    device = rank_device()
    model = part.skeleton()
    tensor_parallel = local_part(model, mesh, groups, None)
    if fsdp:
        shard_model(model, bf16=bf16, group=pool, device=device)  # meta parameters stay meta, sharded
    to_device(model, device)
    part.fill(model, lambda name, tensor: held_block(name, tensor, tensor_parallel))
    return model, tensor_parallel


def local_part(model: ParallelModel, mesh: JobMesh, groups: ProcessGroups, device: torch.device | None
               ) -> TensorParallel | None:
    """Keep this rank's part of `model` and move it to `device` (None: leave it where it is):
    under PP its stage's blocks, under TP its shard of their split layers; the sequence-parallel
    attention installed. Its TP split (None without TP). No collective."""
    model.install_attention(sequence_parallel_attention)
    here = mesh.coordinate(dist.get_rank())
    if mesh.pp > 1:
        split_model(model, mesh, here.stage)
    tensor_parallel = parallelize_tensors(model, groups.tensor, mesh.tp, here.tp_index) if mesh.tp > 1 else None
    if device is not None:
        to_device(model, device)
    return tensor_parallel


def held_block(name: str, tensor: Tensor, tensor_parallel: TensorParallel | None) -> tuple[slice, ...] | None:
    """The block of the whole tensor `name` (the model's, as stored) that `tensor`, this rank's
    part of it, holds, one slice per dimension (None: all of it): its TP shard's rows or columns
    (`torch.chunk`'s blocks), and within that, under FSDP2, its own shard's (the DTensor's offset)."""
    local, starts = tensor, [0] * tensor.dim()
    whole = tensor.shape if tensor_parallel is None else tensor_parallel.whole_shape(name, tensor.shape)
    if isinstance(tensor, DTensor):  # an FSDP2 DTensor: its local shard of the TP shard
        local, starts = tensor.to_local(), list(shard_offset(tensor))
    if tensor_parallel is not None and tensor_parallel.is_split(name):
        dim = tensor_parallel.split_dims[name]
        starts[dim] += tensor_parallel.index * tensor.shape[dim]
    if tuple(local.shape) == tuple(whole):
        return None
    return tuple(slice(start, start + size) for start, size in zip(starts, local.shape))


def shard_offset(tensor: DTensor) -> tuple[int, ...]:
    """Where this rank's shard of an FSDP2 parameter starts in the tensor it shards: FSDP2 shards
    dimension d over a 1-D mesh of n ranks in `torch.chunk`'s blocks (ceil(size / n) rows each, the
    last ones shorter or empty), so the shard at mesh coordinate c starts at c ceil(size / n),
    capped at the size. Ours rather than torch's private `compute_local_shape_and_global_offset`,
    for the one placement FSDP2 gives here (ballast's TP is its own, no DTensor mesh dimension)."""
    (placement,) = tensor.placements
    assert isinstance(placement, Shard) and tensor.device_mesh.ndim == 1, tensor.placements
    dim, size = placement.dim, tensor.shape[placement.dim]
    chunk = -(-size // tensor.device_mesh.size())
    offset = [0] * tensor.dim()
    offset[dim] = min(tensor.device_mesh.get_local_rank() * chunk, size)
    return tuple(offset)


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

