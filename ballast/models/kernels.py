"""Causal attention over a packed stream of sequences: the one attention kernel the models call.

Attention never crosses a sequence boundary. The implementation is picked at call time
(`attention_kernel`), best first:
  - `flash-attn`: flash-attn's varlen kernel, when the tensors are on a GPU in half precision
    and `flash_attn` is importable;
  - `torch-varlen`: PyTorch's own varlen flash kernel (`torch.nn.attention.varlen.varlen_attn`,
    torch >= 2.12), when flash-attn is not installed and PyTorch's flash attention takes the
    tensors (a CUDA build, a GPU it supports, fp16/bf16, a head size it handles). It has no
    CPU implementation;
  - `sdpa`: one `scaled_dot_product_attention` per sequence (CPU, fp32, or neither kernel),
    which needs no block-diagonal mask and, through PyTorch's CPU flash kernel, no memory
    quadratic in the sequence. On a GPU it is a Python loop of one launch per sequence: the
    varlen kernels above run a whole packed stream in one.
"""
from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    from flash_attn import flash_attn_varlen_func
except ImportError:  # CPU machines and GPUs without flash-attn use one of the others
    flash_attn_varlen_func = None

try:
    from torch.nn.attention import SDPAParams
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # torch < 2.10 has no varlen attention of its own
    varlen_attn = None
# Causal masking and grouped-query heads are spelled `window_size=(-1, 0)` and `enable_gqa`
# since torch 2.12; 2.10 and 2.11 had `is_causal` and no grouped-query attention.
if varlen_attn is not None and not {"window_size", "enable_gqa"} <= inspect.signature(varlen_attn).parameters.keys():
    varlen_attn = None

_HALF = (torch.float16, torch.bfloat16)


def _cu_seqlens(bounds: Sequence[int], device: torch.device) -> tuple[Tensor, int]:
    """cu_seqlens as the varlen kernels take them (int32 on the device) and the longest sequence."""
    return (torch.tensor(bounds, dtype=torch.int32, device=device),
            max(b - a for a, b in zip(bounds, bounds[1:])))


def _flash_attn(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int]) -> Tensor:
    cu_seqlens, longest = _cu_seqlens(bounds, q.device)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=True)


def _torch_varlen(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int]) -> Tensor:
    cu_seqlens, longest = _cu_seqlens(bounds, q.device)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, longest, longest, window_size=(-1, 0),
                       enable_gqa=k.shape[1] != q.shape[1])


def _per_sequence_sdpa(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int]) -> Tensor:
    # A batch dimension of one matters: on CPU, 4-D inputs reach PyTorch's flash kernel, which
    # saves O(s) for backward; 3-D ones fall back to the math path, which keeps the s^2 scores
    # (measured on `tiny`: 570 KB instead of 46 KB per token at 4096 tokens, and 13x slower).
    outputs = [
        F.scaled_dot_product_attention(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None],
                                       v[a:b].transpose(0, 1)[None], is_causal=True, enable_gqa=True)
        [0].transpose(0, 1)
        for a, b in zip(bounds, bounds[1:]) if b > a  # an empty sequence attends to nothing
    ]
    assert outputs, "an empty stream has nothing to attend to; callers skip it"
    return torch.cat(outputs)


KERNELS: dict[str, Callable[[Tensor, Tensor, Tensor, Sequence[int]], Tensor]] = {
    "flash-attn": _flash_attn, "torch-varlen": _torch_varlen, "sdpa": _per_sequence_sdpa}


def torch_varlen_supports(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether PyTorch's varlen kernel runs these [tokens, heads, head_dim] tensors.

    `varlen_attn` calls the flash kernel that SDPA dispatches to, so SDPA's own check of that
    kernel (build, GPU architecture, dtype, head size, grouped-query heads) answers for it,
    asked about the same tensors as one batch of one sequence."""
    if varlen_attn is None or not q.is_cuda or q.dtype not in _HALF:
        return False
    params = SDPAParams(*(t.transpose(0, 1)[None] for t in (q, k, v)), None, 0.0, True, k.shape[1] != q.shape[1])
    return torch.backends.cuda.can_use_flash_attention(params)


def attention_kernel(q: Tensor, k: Tensor, v: Tensor) -> str:
    """Name (a key of KERNELS) of the implementation `varlen_causal_attention` uses for these tensors."""
    if flash_attn_varlen_func is not None and q.is_cuda and q.dtype in _HALF:
        return "flash-attn"
    if torch_varlen_supports(q, k, v):
        return "torch-varlen"
    return "sdpa"


def varlen_causal_attention(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int]) -> Tensor:
    """Causal attention inside every sequence of a packed stream.

    q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim] (grouped-query attention:
    heads is a multiple of kv_heads); bounds: cu_seqlens of the stream as Python ints,
    (0, s1, s1 + s2, ..., tokens). Returns [tokens, heads, head_dim].
    """
    assert bounds[0] == 0 and bounds[-1] == q.shape[0], (bounds[-1], q.shape)
    return KERNELS[attention_kernel(q, k, v)](q, k, v, bounds)
