"""Attention over a packed stream of spans: the one attention kernel the models call.

Attention never crosses a span boundary (a span is a sequence, or for a video model a frame,
a patch column or a whole clip; `protocol.attention_spans`), and is causal inside each span
(text decoders) or bidirectional (video DiTs). The implementation is picked at call time
(`attention_kernel`), best first:
  - `flash-attn`: flash-attn's varlen kernel, when the tensors are on a GPU in half precision
    and `flash_attn` (>= FLASH_ATTN_MIN) is importable;
  - `torch-varlen`: PyTorch's own varlen flash kernel (`torch.nn.attention.varlen.varlen_attn`,
    torch >= 2.12), when flash-attn is not installed and PyTorch's flash attention takes the
    tensors (a CUDA build, a GPU it supports, fp16/bf16, a head size it handles). It has no
    CPU implementation;
  - `sdpa`: one `scaled_dot_product_attention` per span length (CPU, fp32, or neither
    kernel), all equally long spans of the stream as one batch (`span_sdpa.py`).
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable, Sequence

import torch
from torch import Tensor
from torch.nn.attention import SDPAParams
from torch.torch_version import TorchVersion

from ..vocabulary.patterns import Span
from .protocol import PackedStream, stream_spans
from .span_sdpa import batched_sdpa, span_sdpa
from .stream_index import METADATA_CACHE, to_device

FLASH_ATTN_MIN = "2.1"
"""Least flash-attn version ballast uses: before 2.1 its causal mask is aligned top-left, not
bottom-right, when a sequence has fewer queries than keys, so a context-parallel chunk (its
queries the last of its keys) would attend the wrong keys without an error."""


@functools.cache
def flash_attn_varlen() -> Callable | None:
    """flash-attn's `flash_attn_varlen_func`, or None where flash-attn is not installed or older
    than FLASH_ATTN_MIN (then a warning, once, and the next kernel serves). Imported on first use
    by a CUDA tensor."""
    try:
        import flash_attn
    except ImportError:  # CPU machines and GPUs without flash-attn use one of the others
        return None
    version = getattr(flash_attn, "__version__", "0")
    if TorchVersion(version) < FLASH_ATTN_MIN:
        warnings.warn(f"flash-attn {version} is older than {FLASH_ATTN_MIN}, whose bottom-right causal mask "
                      f"context parallelism needs; ballast does not use it (pip install 'flash-attn>="
                      f"{FLASH_ATTN_MIN}' to)", stacklevel=2)
        return None
    return flash_attn.flash_attn_varlen_func


@functools.cache
def torch_varlen_attn() -> Callable | None:
    """PyTorch's `varlen_attn`, or None where this torch has none that takes what ballast passes.

    Imported on first use, by a CUDA tensor: `torch.nn.attention.varlen` imports torch's
    compiler stack (about 2 s), which every CPU rank and command would otherwise pay at start."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.10 has no varlen attention of its own
        return None
    # Causal masking and grouped-query heads are spelled `window_size=(-1, 0)` and `enable_gqa`
    # since torch 2.12; 2.10 and 2.11 had `is_causal` and no grouped-query attention.
    if not {"window_size", "enable_gqa"} <= inspect.signature(varlen_attn).parameters.keys():
        return None
    return varlen_attn


_HALF = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=METADATA_CACHE)
def _cu_seqlens(bounds: tuple[int, ...], device: torch.device) -> tuple[Tensor, int]:
    """cu_seqlens as the varlen kernels take them (int32 on the device) and the longest sequence."""
    return (to_device(torch.tensor(bounds, dtype=torch.int32), device),
            max(b - a for a, b in zip(bounds, bounds[1:])))


def packed_varlen(kernel: str, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, longest_q: int,
                  longest_k: int, causal: bool) -> Tensor:
    """One call of a varlen kernel ("flash-attn" or "torch-varlen"): the queries of sequence i
    (rows cu_q[i]:cu_q[i+1]) against its keys (cu_k[i]:cu_k[i+1]). Both run flash-attn 2's
    kernel, whose causal diagonal is bottom-right: a sequence with fewer queries than keys has
    them at its keys' end, which context parallelism's chunks need."""
    if kernel == "flash-attn":
        return flash_attn_varlen()(q, k, v, cu_q, cu_k, longest_q, longest_k, causal=causal)
    assert kernel == "torch-varlen", kernel
    return torch_varlen_attn()(q, k, v, cu_q, cu_k, longest_q, longest_k, window_size=(-1, 0) if causal else (-1, -1),
                               enable_gqa=k.shape[1] != q.shape[1])


def _flash_attn(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int], causal: bool) -> Tensor:
    cu_seqlens, longest = _cu_seqlens(tuple(bounds), q.device)
    return packed_varlen("flash-attn", q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal)


def _torch_varlen(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int], causal: bool) -> Tensor:
    cu_seqlens, longest = _cu_seqlens(tuple(bounds), q.device)
    return packed_varlen("torch-varlen", q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal)


def span_attention(q: Tensor, k: Tensor, v: Tensor, q_bounds: Sequence[int], k_bounds: Sequence[int]) -> Tensor:
    """Bidirectional attention of span i's queries q[q_bounds[i]:q_bounds[i+1]] to its keys
    k[k_bounds[i]:k_bounds[i+1]]: the queries may be part of their span (context parallelism
    holds a piece of every frame or column and gathers their keys whole). A span without
    queries is skipped; one with queries has keys. Returns q's shape.

    On CUDA one varlen call with separate query and key cu_seqlens (flash-attn's, or PyTorch's);
    else `span_sdpa`."""
    assert q_bounds[-1] == q.shape[0] and k_bounds[-1] == k.shape[0], (q_bounds[-1], q.shape, k_bounds[-1], k.shape)
    kernel = attention_kernel(q, k, v)
    if kernel != "sdpa":
        cu_q, longest_q = _cu_seqlens(tuple(q_bounds), q.device)
        cu_k, longest_k = _cu_seqlens(tuple(k_bounds), q.device)
        return packed_varlen(kernel, q, k, v, cu_q, cu_k, longest_q, longest_k, causal=False)
    return span_sdpa(q, k, v, q_bounds, k_bounds)


KERNELS: dict[str, Callable[[Tensor, Tensor, Tensor, Sequence[int], bool], Tensor]] = {
    "flash-attn": _flash_attn, "torch-varlen": _torch_varlen, "sdpa": batched_sdpa}


def torch_varlen_supports(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether PyTorch's varlen kernel runs these [tokens, heads, head_dim] tensors.

    `varlen_attn` calls the flash kernel that SDPA dispatches to, so SDPA's own check of that
    kernel (build, GPU architecture, dtype, head size, grouped-query heads) answers for it,
    asked about the same tensors as one batch of one sequence."""
    if not q.is_cuda or q.dtype not in _HALF or torch_varlen_attn() is None:
        return False
    params = SDPAParams(*(t.transpose(0, 1)[None] for t in (q, k, v)), None, 0.0, True, k.shape[1] != q.shape[1])
    return torch.backends.cuda.can_use_flash_attention(params)


def attention_kernel(q: Tensor, k: Tensor, v: Tensor) -> str:
    """Name (a key of KERNELS) of the implementation `varlen_attention` uses for these tensors."""
    if q.is_cuda and q.dtype in _HALF and flash_attn_varlen() is not None:
        return "flash-attn"
    if torch_varlen_supports(q, k, v):
        return "torch-varlen"
    return "sdpa"


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int], causal: bool = True) -> Tensor:
    """Attention inside every span of a packed stream, causal or bidirectional.

    q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim] (grouped-query attention:
    heads is a multiple of kv_heads); bounds: the spans' cu_seqlens as Python ints,
    (0, s1, s1 + s2, ..., tokens). Returns [tokens, heads, head_dim].
    """
    assert bounds[0] == 0 and bounds[-1] == q.shape[0], (bounds[-1], q.shape)
    return KERNELS[attention_kernel(q, k, v)](q, k, v, bounds, causal)


def in_autocast_dtype(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v in the autocast dtype of their device while autocast is on there, else as given.

    Under autocast a model's projections give bf16, but what it applies after them need not:
    transformers' RoPE builds cos and sin in fp32 and an RMSNorm's fp32 weight promotes q and k
    (ballast's video models' too), so q and k, and any concatenation with v, would reach the
    exchanges, the K/V gather and the kernel in fp32: twice the bytes on the wire, and the
    varlen kernels, which take half precision only, never chosen. Every attention function
    starts with this cast (`local_attention`, the runtime's `sequence_parallel_attention`), so
    every model family gets it; autocast's backward casts the gradients back."""
    device = q.device.type
    if not (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)):
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@functools.lru_cache(maxsize=METADATA_CACHE)
def _spans_on(grids: tuple[tuple[int, int, int], ...] | None, bounds: tuple[int, ...], pattern: Span,
              device: torch.device) -> tuple[Tensor | None, tuple[int, ...]]:
    """`protocol.attention_spans` of a stream, its order on `device` (built on the host)."""
    order, spans = stream_spans(grids, bounds, pattern)
    return (None if order is None else to_device(order, device)), spans


def local_attention(q: Tensor, k: Tensor, v: Tensor, stream: PackedStream) -> Tensor:
    """Attention of `stream.pattern` when this process holds the whole stream (in stream order)."""
    q, k, v = in_autocast_dtype(q, k, v)
    order, bounds = _spans_on(stream.grids, stream.bounds, stream.pattern, q.device)
    causal = stream.pattern.causal
    if order is None:
        return varlen_attention(q, k, v, bounds, causal)
    # index_select, not q[order]: its backward is an index_add, not an accumulating index_put.
    out = varlen_attention(q.index_select(0, order), k.index_select(0, order), v.index_select(0, order), bounds,
                           causal)
    return torch.empty_like(out).index_copy_(0, order, out)
