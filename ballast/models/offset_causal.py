"""Causal attention of a chunk of queries whose keys start before it does, without a mask (CPU).

A context-parallel rank's causal chunk [a, b) of a sequence that starts at s attends the keys
[s, b): its causal diagonal sits bottom-right, where SDPA's `is_causal` puts it top-left. An
explicit mask would say it, but PyTorch's CPU kernel turns a mask into floats and keeps them for
backward: (b - a) x (b - s) of them per chunk and layer, quadratic in the sequence (a 1024-query
tail chunk of a 4096-token document: 16 MB a layer, 32 times the chunk's queries on `tiny`).

So the keys are split in two: the prefix [s, a), which every query of the chunk sees whole, and
the chunk's own keys [a, b), a square whose diagonal is SDPA's top-left one. PyTorch's CPU flash
kernel runs each part and returns its log-sum-exp; the parts merge by it, as ring attention merges
its blocks. Backward runs the kernel's backward on each part with the merged output and
log-sum-exp: the flash backward rebuilds each part's probabilities as exp(scores - lse) and its
correction term from the output, so with the merged ones it yields exactly the whole softmax's
gradient for that part's keys and the part's share of the queries'. What it keeps for backward is
what SDPA without a mask keeps: the queries, keys and values (views), the output, one log-sum-exp
per query and head. It also runs faster than the masked call (1.3-1.8x on chunks of 1k-2k queries
here, forward and backward), which reads the mask in both passes.

The private ATen ops are the CPU flash kernel SDPA itself dispatches to; they take grouped-query
heads (fewer kv heads) as they are.
"""
from __future__ import annotations

import torch
from torch import Tensor

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _merge(first: tuple[Tensor, Tensor], second: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """One softmax's output and log-sum-exp from those over two disjoint key sets (out [B, H, m,
    hd], lse [B, H, m]): the outputs weighted by each part's share of the total, exp(lse_i - lse),
    the first's being sigmoid(lse_1 - lse_2). Few ops: a CP rank runs this per chunk and layer."""
    (out_1, lse_1), (out_2, lse_2) = first, second
    weight = torch.sigmoid(lse_1 - lse_2).unsqueeze(-1).to(out_1.dtype)
    return torch.lerp(out_2, out_1, weight), torch.logaddexp(lse_1, lse_2)


class OffsetCausalAttention(torch.autograd.Function):
    """Queries [B, H, m, hd] at the last m positions of keys and values [B, kv, prefix + m, hd],
    each seeing the keys up to its own position.

    Forward:  the CPU flash kernel on the prefix keys (no mask) and on the last m keys (causal),
              merged by their log-sum-exp.
    Backward: the kernel's backward on each part with the merged output and log-sum-exp; the
              queries' gradient is the parts' sum, the keys' and values' the parts' concatenation."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, prefix: int) -> Tensor:
        out, lse = _FORWARD(q, k[:, :, prefix:], v[:, :, prefix:], 0.0, True)
        if prefix:
            out, lse = _merge(_FORWARD(q, k[:, :, :prefix], v[:, :, :prefix], 0.0, False), (out, lse))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.prefix = prefix
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors
        p = ctx.prefix
        grad = grad.contiguous()
        dq, dk, dv = _BACKWARD(grad, q, k[:, :, p:], v[:, :, p:], out, lse, 0.0, True)
        if p:
            dq_prefix, dk_prefix, dv_prefix = _BACKWARD(grad, q, k[:, :, :p], v[:, :, :p], out, lse, 0.0, False)
            dq, dk, dv = dq + dq_prefix, torch.cat([dk_prefix, dk], dim=2), torch.cat([dv_prefix, dv], dim=2)
        return dq, dk, dv, None


def offset_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention of queries [m, H, hd] that are the last m of their sequence's keys and
    values [n, kv, hd] (n >= m): query i sees keys 0 .. n - m + i. Returns [m, H, hd]."""
    m, n = q.shape[0], k.shape[0]
    assert 0 < m <= n and q.device.type == "cpu", (q.shape, k.shape, q.device)
    out = OffsetCausalAttention.apply(*(t.transpose(0, 1)[None] for t in (q, k, v)), n - m)
    return out[0].transpose(0, 1)
