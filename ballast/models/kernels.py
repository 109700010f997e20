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
    kernel): all equally long spans of the stream (the frames of a clip, its patch columns,
    the frames of all tiny clips of one size) go as one batch. It needs no
    block-diagonal mask and, through PyTorch's CPU flash kernel, no memory quadratic in the
    span. Spans of at most TINY_SPAN tokens skip SDPA, whose CPU kernel costs about as much per
    span of 1-3 tokens as per span of 16 (`_tiny_attention`). On a GPU it is a Python loop of
    one launch per length: the varlen kernels above run a whole packed stream in one.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPAParams
from torch.torch_version import TorchVersion

from ..vocabulary.patterns import Span
from .protocol import PackedStream, stream_spans

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


def to_device(index: Tensor, device: torch.device) -> Tensor:
    """A host-built index or length tensor on `device`, copied without blocking the host on a
    GPU (from pinned memory, which the copy needs to be asynchronous: a pageable source makes
    the host wait for the device to drain). Indices built on the host are the rule here: they
    come from the plan's Python ints."""
    if index.device == device:
        return index
    if device.type == "cuda":
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)


# Index and length tensors an attention call needs are built on the host from the micro-batch's
# bounds (Python ints) and copied to the device. Every layer of a micro-batch asks for the same
# ones, so they are cached by value (the bounds and the device, small LRU caches): built and
# copied at the first layer, not per layer; a new micro-batch's bounds make new entries.
METADATA_CACHE = 16
"""Entries each attention-metadata cache keeps: a micro-batch needs a few (its patterns' spans,
query and key bounds), a remap slot or a profile's next run replaces them."""


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


def equal_groups(sizes: Tensor) -> tuple[Tensor | None, list[int], list[int]]:
    """Items (spans, samples' runs) grouped by equal size, however far apart they sit.

    sizes: [items] int64 (CPU). Returns (order, group sizes, group counts): taking the items in
    `order` (None: the items' own order) puts every group's items together, in their own order,
    groups ordered by where their first item is (so items that already come in runs of equal
    sizes, each size in one run, keep their order); group g has `counts[g]` items of size
    `sizes[g]`. All vectorised: the Python work is per group, not per item."""
    if sizes.numel() == 0:
        return None, [], []
    values, inverse = torch.unique(sizes, return_inverse=True)
    positions = torch.arange(sizes.numel())
    first = torch.full((values.numel(),), sizes.numel(), dtype=torch.long).scatter_reduce_(
        0, inverse, positions, "amin")
    key = first[inverse]  # a group's key: where its first item is
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    group_keys, counts = torch.unique_consecutive(sorted_key, return_counts=True)
    if torch.equal(order, positions):
        order = None
    return order, sizes[group_keys].tolist(), counts.tolist()


def token_order(starts: Tensor, lengths: Tensor) -> Tensor:
    """The rows of consecutive spans (start, length): starts[0] .. + lengths[0], then the next."""
    total = int(lengths.sum())
    span_offsets = torch.cumsum(lengths, 0) - lengths
    return torch.repeat_interleave(starts - span_offsets, lengths, output_size=total) + torch.arange(total)


@functools.lru_cache(maxsize=METADATA_CACHE)
def _equal_runs(bounds: tuple[int, ...], device: torch.device) -> tuple[Tensor | None, list[tuple[int, int]]]:
    """(order on `device`, [(span length, spans)]): the rows of the non-empty spans (an empty
    span attends to nothing) taken in `order` (None: stream order) are groups of equally long
    spans, one after another; a group holds every span of its length, wherever it sits."""
    edges = torch.tensor(bounds, dtype=torch.long)
    starts, lengths = edges[:-1], edges[1:] - edges[:-1]
    spans, group_lengths, counts = equal_groups(lengths)
    groups = [(length, count) for length, count in zip(group_lengths, counts) if length > 0]
    if spans is None:
        return None, groups  # already in runs of equal spans, each length in one run
    spans = spans[lengths[spans] > 0]
    order = token_order(starts[spans], lengths[spans])
    # Spans apart only by empty ones are in order already.
    return (None if torch.equal(order, torch.arange(order.numel())) else to_device(order, device)), groups


TINY_SPAN = 3
"""Spans up to this long skip SDPA in the `sdpa` path (`_tiny_attention`)."""


def _tiny_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """Attention inside spans of tiny lengths, as elementwise ops (no SDPA call).

    q: [spans, m, heads, head_dim]; k, v: [spans, s, kv_heads, head_dim] (m = s unless the
    queries are a part of their span: `span_attention`). Returns q's shape.
    PyTorch's CPU flash kernel costs ~1 us per span and head forward and backward however
    short the span (measured: 2048 tokens in spans of 1, 2 and 3 cost 9.1, 8.6 and 6.5 ms;
    in spans of 16, 2.9 ms): the frames of a patch or two, the columns of one to three frames.
    Here a span of one key is its value (the softmax of one score is 1; exact), and the
    m x s scores of longer ones are broadcast products, cheaper than the kernel up to s = 3
    (1.6, 3.3 and 4.2 ms; 6.9 vs 6.3 at s = 4). Equal to SDPA up to float rounding."""
    spans, m, heads, head_dim = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    assert not causal or m == s, (m, s)
    if s == 1:
        # q and k stay on the graph (their empty sums are 0): their weights get a (zero)
        # gradient on every rank, as when SDPA ran.
        out = v.repeat_interleave(heads // kv_heads, dim=2) if heads != kv_heads else v
        return out.expand(spans, m, heads, head_dim) + (q[:0].sum() + k[:0].sum())
    # Query head h reads kv head h // (heads / kv_heads), as SDPA's enable_gqa.
    queries = q.view(spans, m, 1, kv_heads, heads // kv_heads, head_dim)
    keys, values = (t.view(spans, 1, s, kv_heads, 1, head_dim) for t in (k, v))
    scores = (queries * keys).sum(-1) * head_dim ** -0.5  # [spans, query, key, kv_heads, group]
    if causal:
        later = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)[:, :, None, None]
        scores = scores.masked_fill(later, float("-inf"))
    weights = scores.softmax(2)
    return (weights.unsqueeze(-1) * values).sum(2).view(spans, m, heads, head_dim)


def _batched_sdpa(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int], causal: bool) -> Tensor:
    # All spans of one length go as one batch: a clip's F frames (or S columns) are one call,
    # and so are all the equally long frames of all the clips of a micro-batch (hundreds of tiny
    # clips have few distinct lengths: n tokens have at most ~sqrt(2n) of them). Spans that are
    # not consecutive are gathered into place by one index over the rows and put back by one
    # (not a slice per span: each slice's backward fills a zero gradient of the whole input,
    # quadratic in the spans). Every span's attention is the same computation as alone.
    # Spans of up to TINY_SPAN tokens skip SDPA (`_tiny_attention`).
    # A 4-D input matters too: on CPU it reaches PyTorch's flash kernel, which saves O(s) for
    # backward; 3-D ones fall back to the math path, which keeps the s^2 scores (measured on
    # `tiny`: 570 KB instead of 46 KB per token at 4096 tokens, and 13x slower).
    order, groups = _equal_runs(tuple(bounds), q.device)
    assert groups, "an empty stream has nothing to attend to; callers skip it"
    if order is not None:
        q, k, v = q.index_select(0, order), k.index_select(0, order), v.index_select(0, order)
    sizes = [length * count for length, count in groups]
    outputs = []
    for (length, count), qg, kg, vg in zip(groups, q.split(sizes), k.split(sizes), v.split(sizes)):
        qg, kg, vg = (t.view(count, length, *t.shape[1:]) for t in (qg, kg, vg))
        if length <= TINY_SPAN:
            out = _tiny_attention(qg, kg, vg, causal)
        else:
            out = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                 is_causal=causal, enable_gqa=True).transpose(1, 2)
        outputs.append(out.reshape(length * count, *q.shape[1:]))
    out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    if order is None:
        return out
    # Back to stream order (`order` is a permutation of the rows: empty spans hold none).
    return torch.empty_like(out).index_copy(0, order, out)


@functools.lru_cache(maxsize=METADATA_CACHE)
def _span_batches(q_bounds: tuple[int, ...], k_bounds: tuple[int, ...], device: torch.device
                  ) -> tuple[Tensor, Tensor, list[tuple[int, int, int]]] | None:
    """`span_attention`'s batches: (its queries' rows, its keys' rows, both on `device`, batch by
    batch, and every batch's (queries, keys, spans)); None when no span has queries."""
    edges_q, edges_k = torch.tensor(q_bounds, dtype=torch.long), torch.tensor(k_bounds, dtype=torch.long)
    queries, keys = edges_q[1:] - edges_q[:-1], edges_k[1:] - edges_k[:-1]
    used = queries > 0
    assert bool((keys[used] > 0).all()), "a span with queries has keys"
    if not bool(used.any()):
        return None
    q_starts, k_starts, queries, keys = edges_q[:-1][used], edges_k[:-1][used], queries[used], keys[used]
    # Spans of equal (queries, keys) go as one batch (`equal_groups` on one key for the pair).
    width = int(keys.max()) + 1
    order, pairs, counts = equal_groups(queries * width + keys)
    if order is not None:
        q_starts, k_starts, queries, keys = q_starts[order], k_starts[order], queries[order], keys[order]
    return (to_device(token_order(q_starts, queries), device), to_device(token_order(k_starts, keys), device),
            [(pair // width, pair % width, count) for pair, count in zip(pairs, counts)])


def span_attention(q: Tensor, k: Tensor, v: Tensor, q_bounds: Sequence[int], k_bounds: Sequence[int]) -> Tensor:
    """Bidirectional attention of span i's queries q[q_bounds[i]:q_bounds[i+1]] to its keys
    k[k_bounds[i]:k_bounds[i+1]]: the queries may be part of their span (context parallelism
    holds a piece of every frame or column and gathers their keys whole). A span without
    queries is skipped; one with queries has keys. Returns q's shape.

    On CUDA one varlen call with separate query and key cu_seqlens (flash-attn's, or PyTorch's);
    else one SDPA (or `_tiny_attention`) per distinct (queries, keys) pair of lengths, which a
    clip's pieces of frames or columns take a handful of."""
    assert q_bounds[-1] == q.shape[0] and k_bounds[-1] == k.shape[0], (q_bounds[-1], q.shape, k_bounds[-1], k.shape)
    kernel = attention_kernel(q, k, v)
    if kernel != "sdpa":
        cu_q, longest_q = _cu_seqlens(tuple(q_bounds), q.device)
        cu_k, longest_k = _cu_seqlens(tuple(k_bounds), q.device)
        return packed_varlen(kernel, q, k, v, cu_q, cu_k, longest_q, longest_k, causal=False)
    batches = _span_batches(tuple(q_bounds), tuple(k_bounds), q.device)
    if batches is None:
        return q.clone()  # no queries: an empty output
    q_rows, k_rows, shapes = batches
    qs, ks, vs = q.index_select(0, q_rows), k.index_select(0, k_rows), v.index_select(0, k_rows)
    outputs = []
    for (m, s, count), qg, kg, vg in zip(shapes, qs.split([m * c for m, _, c in shapes]),
                                         ks.split([s * c for _, s, c in shapes]), vs.split([s * c for _, s, c in shapes])):
        qg, kg, vg = qg.view(count, m, *q.shape[1:]), kg.view(count, s, *k.shape[1:]), vg.view(count, s, *v.shape[1:])
        if s <= TINY_SPAN:
            out = _tiny_attention(qg, kg, vg, causal=False)
        else:
            out = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                 enable_gqa=True).transpose(1, 2)
        outputs.append(out.reshape(m * count, *q.shape[1:]))
    out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    # Back to the queries' order (`q_rows` is a permutation of them: every query is in a span).
    return torch.empty_like(out).index_copy(0, q_rows, out)


KERNELS: dict[str, Callable[[Tensor, Tensor, Tensor, Sequence[int], bool], Tensor]] = {
    "flash-attn": _flash_attn, "torch-varlen": _torch_varlen, "sdpa": _batched_sdpa}


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
