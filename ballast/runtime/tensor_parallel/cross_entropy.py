"""Cross-entropy over a vocabulary split across a TP group (Megatron's vocabulary-parallel loss):
the logits stay split, [tokens, V / t] on each rank, and are never gathered.

For token i with logits z (all V entries, each rank holding its V / t) and target y:

    loss_i = log Σ_v exp(z_v - m) - (z_y - m),    m = max_v z_v

Communication, forward only (three all-reduces over the group of [tokens] values, not of
[tokens, V]): MAX of the ranks' maxima m, SUM of the ranks' Σ exp(z_v - m), SUM of z_y - m, which
one rank holds and the others add as 0. Backward none: every rank holds the same loss and gets
the same gradient of it, and the gradient of its own logits is (softmax_v - [v = y]) times it,
from its own exp(z_v - m) and the summed denominator. The max is a shift the loss does not
depend on (it only keeps exp from overflowing), so it is no path of the gradient.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from ..memory import mark_loss


def _all_reduce(x: Tensor, group: ProcessGroup, op: dist.ReduceOp = dist.ReduceOp.SUM) -> Tensor:
    if x.numel():  # a group holds as many tokens on every rank: all skip an empty shard alike
        dist.all_reduce(x, op=op, group=group)
    return x


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of split logits [tokens, V / t] (fp32) against targets [tokens] (ids
    in the whole vocabulary); `start` is this rank's first vocabulary entry."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, start: int, group: ProcessGroup) -> Tensor:
        m = _all_reduce(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)
        shifted = logits - m.unsqueeze(-1)
        exp = shifted.exp()
        total = _all_reduce(exp.sum(dim=-1), group)
        local = targets - start
        held = (local >= 0) & (local < logits.shape[-1])
        local = local.masked_fill(~held, 0)
        target = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~held, 0.0)
        target = _all_reduce(target, group)
        ctx.save_for_backward(mark_loss(exp.div_(total.unsqueeze(-1))), local, held)
        return (total.log() - target).sum()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        softmax, local, held = ctx.saved_tensors
        # Each token's own entry loses 1 on the rank that holds its target.
        out = softmax.scatter_add(-1, local.unsqueeze(-1), -held.to(softmax.dtype).unsqueeze(-1))
        return out.mul_(grad), None, None, None


def vocab_parallel_cross_entropy(logits: Tensor, targets: Tensor, start: int, group: ProcessGroup) -> Tensor:
    """The summed loss of split logits, in fp32 as `F.cross_entropy` computes under autocast."""
    return VocabParallelCrossEntropy.apply(logits.float(), targets, start, group)
