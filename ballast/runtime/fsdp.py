"""FSDP2 (ZeRO-3) for plans: parameters, gradients and optimizer state sharded over the world.

`shard_model` applies `torch.distributed.fsdp.fully_shard` to every block (`ParallelModel.blocks`)
and then to the root (embedding, final norm, output layer), the torchtitan layout: a block's parameters are
all-gathered just before its forward (and again before its backward) and freed after, so a
rank holds one block's full parameters at a time and 1/world of everything else.

What this asks of the executor (`executor.py`):
  - every rank joins every all-gather, so every rank must run the same number of forward and
    backward passes per wave: plans must be lockstep (`Plan.lockstep`), and an empty filler
    micro-batch still runs a pass, on one dummy token whose loss is multiplied by zero;
  - activation recomputation needs nothing: FSDP2's pre-backward hook gathers a block before
    its recomputation, whose own forward hooks then do no communication, so ranks of different
    recompute levels issue the same collectives;
  - every backward reduce-scatters its gradients, which accumulate sharded: a rank never holds
    a whole gradient, as the cost model's memory (states sharded over all ranks) assumes. The
    alternative, FSDP2's `set_requires_gradient_sync(False)` until the step's last pass, would
    save the per-pass reduce-scatters but keep an unsharded gradient for the whole step;
  - the reduction is a plain SUM: the executor's loss is already divided by the step's tokens
    (FSDP's default would divide again by the world size), and gloo has no PREMUL_SUM;
  - under bf16 autocast, a `MixedPrecisionPolicy` gathers the parameters in bf16 (half the
    bytes of each all-gather, and autocast's casts of the weights become no-ops) and reduces
    the gradients in fp32 (their sum over the world keeps fp32's precision, as the replicated
    sync's does); the sharded parameters, gradients and AdamW's state stay fp32. The root's
    inputs are left as the model was given them (a video model's timesteps stay fp32 for their
    sinusoids, as in one process under autocast). Under fp32 there is no policy: everything is fp32.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from ..models.protocol import ParallelModel

# FSDP2 and DTensor are imported where a model is sharded, not with this module: they pull in
# sympy and torch's tensor-parallel ops (about 1 s), which every rank of a run with replicated
# weights and every command would otherwise pay at start. A module or tensor of theirs can
# only exist once they are imported, so `is_sharded` and `full_tensor` look in sys.modules.
_FSDP, _DTENSOR = "torch.distributed.fsdp", "torch.distributed.tensor"


def shard_model(model: ParallelModel, bf16: bool = False, group: ProcessGroup | None = None,
                device: torch.device | None = None) -> ParallelModel:
    """Shard `model` over the world, or over `group` (a pool's ranks under tensor or pipeline
    parallelism: the data-parallel dimension), with FSDP2 (in place; returns it); `bf16`: the run
    computes in bf16 (`Precision.autocast`), so parameters are gathered in bf16 and gradients
    reduced in fp32; `device`: where the shards go (default: where the parameters are), a block
    at a time as it is sharded (a model on the host never sits whole on the device; one on the
    meta device stays there, its shards given storage after). Collective: every rank calls it,
    with the same weights (`parallelize` broadcasts each pool's first rank's first)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy, root = MixedPrecisionPolicy(), MixedPrecisionPolicy()
    if bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        # The root's forward inputs are the model's own (token ids, latents, a clip's timestep
        # and condition), which autocast casts where it computes with them: casting them ahead
        # would round a clip's t to bf16 before its sinusoidal embedding (t x 1000 off by up to 2).
        root = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    kind = (device or next(model.parameters()).device).type
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, kind)
    for block in model.blocks():
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=root)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # both settings are per module, not recursive
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    fsdp = sys.modules.get(_FSDP)
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def full_tensor(t: Tensor) -> Tensor:
    """The whole tensor of a sharded parameter or gradient (a collective), a plain one as it is."""
    dtensor = sys.modules.get(_DTENSOR)
    return t.full_tensor() if dtensor is not None and isinstance(t, dtensor.DTensor) else t
