"""The collectives of tensor parallelism as autograd functions (Megatron's f and g).

A TP group's ranks hold the same tokens (one pool rank's share of a micro-batch) and split every
layer's weights. Between the split layers the hidden state is whole on every rank of the group
(no sequence-parallel activations: `tensor_parallel/__init__.py` says why), so two conjugate
operators carry the communication:

    f  CopyToTensorParallel      forward: none (the input is already on every rank);
                                 backward: SUM all-reduce of the input's gradient over the group
                                 (each rank's split weights give only its heads' / columns' part)
    g  ReduceFromTensorParallel  forward: SUM all-reduce of the partial outputs over the group;
                                 backward: none (the output's gradient is the same on every rank)

A column-parallel layer starts a split region with f, a row-parallel one ends it with g (and the
vocabulary-parallel embedding, whose ranks each look up their own rows, with g too).

Every rank of the group holds as many tokens, so a rank holding none (an empty shard of a
micro-batch) skips the all-reduce as all its partners do: no collective waits for a missing peer.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup


def _all_reduced(x: Tensor, group: ProcessGroup) -> Tensor:
    """The SUM of `x` over `group`, in a new tensor (autograd may still hold `x`)."""
    out = x.contiguous().clone()
    if out.numel():
        dist.all_reduce(out, group=group)
    return out


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward; backward, a SUM all-reduce of the gradient over the TP group."""

    @staticmethod
    def forward(ctx, x: Tensor, group: ProcessGroup) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return _all_reduced(grad, ctx.group), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: forward, a SUM all-reduce of the partial outputs over the TP group; identity backward."""

    @staticmethod
    def forward(ctx, x: Tensor, group: ProcessGroup) -> Tensor:
        return _all_reduced(x, group)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def copy_to_tensor_parallel(x: Tensor, group: ProcessGroup) -> Tensor:
    return CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: Tensor, group: ProcessGroup) -> Tensor:
    return ReduceFromTensorParallel.apply(x, group)
