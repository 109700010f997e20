"""Context-parallel (CP) attention over a packed varlen stream (Llama 3's context parallelism).

Each rank of a CP group of degree c holds chunks of every sequence (`context_shard.py`: head-tail
pairs for causal attention) with all heads. Attention gathers K and V over the group, so every
rank has every sequence's keys, and attends its own queries to them under each document's mask
with the queries' global positions: a causal query at position p sees its sequence's keys at
positions <= p. Only kv heads travel, which grouped-query attention makes cheap
(`CostModel.gathered_per_token` prices them). Groups with a CP part run it through `hybrid.HybridShard`.

A spatial-temporal DiT's blocks attend within frames or patch columns (`patterns.SPATIAL`,
`TEMPORAL`); their CP chunks are whole-clip chunks (c per clip, which balance both: every query
of a clip attends a frame's S keys or a column's F), and each query attends its own frame's or
column's gathered keys (`_span_attention`).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed import ProcessGroup

from ..models.kernels import attention_kernel, packed_varlen, span_attention
from ..models.offset_causal import offset_causal_attention
from ..models.protocol import PackedStream, pattern_spans
from ..models.stream_index import to_device, token_order
from ..vocabulary.patterns import CAUSAL, Span
from ..vocabulary.samples import Sample
from .context_shard import held_chunks, held_indices

Chunks = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, kw_only=True)
class ContextShard(PackedStream):
    """This rank's chunks of a packed stream that a CP group shares (`held_chunks`).

    `positions` holds the positions of this rank's rows only (a text token's rotary position, a
    clip token's (sample, frame, row, column)); `bounds` and `grids` describe the whole stream."""

    group: ProcessGroup | None
    degree: int
    index: int
    causal_balance: bool
    """Whether the chunks were cut for causal work (2c head-tail chunks) or bidirectional (c)."""

    @classmethod
    def create(cls, samples: list[Sample], group: ProcessGroup | None, degree: int, index: int,
               device: torch.device | str | None = None, pattern: Span = CAUSAL) -> ContextShard:
        """The index-th CP shard of the stream of these samples (text lengths, or clip shapes:
        a clip is one sequence of its frame-major tokens), balanced for `pattern`."""
        whole = PackedStream.of(samples, device)
        held = held_indices(held_chunks(whole.bounds, degree, index, pattern.causal)).to(whole.positions.device)
        return cls(whole.bounds, whole.positions[held], whole.grids, pattern=pattern, group=group, degree=degree,
                   index=index, causal_balance=pattern.causal)

    def chunks_of(self, index: int) -> Chunks:
        """Rank `index`'s chunks: (sequence start, chunk start, chunk end) in the stream."""
        return held_chunks(self.bounds, self.degree, index, self.causal_balance)

    @functools.cached_property
    def held(self) -> Tensor:
        """The stream indices of this rank's rows, in row order."""
        return held_indices(self.chunks_of(self.index)).to(self.positions.device)

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        """Rows every rank of the group holds."""
        return tuple(sum(b - a for _, a, b in self.chunks_of(i)) for i in range(self.degree))

    @functools.cached_property
    def gathered(self) -> Tensor:
        """The stream indices of every rank's rows, rank after rank (the order a gather receives)."""
        return torch.cat([held_indices(self.chunks_of(i)) for i in range(self.degree)]).to(self.positions.device)

    @functools.cached_property
    def gathered_order(self) -> Tensor:
        """Where each stream token sits among the gathered rows: `gathered`'s inverse."""
        return torch.empty_like(self.gathered).index_copy_(
            0, self.gathered, torch.arange(len(self.gathered), device=self.gathered.device))

    @functools.cached_property
    def span_rows(self) -> tuple[Tensor, tuple[int, ...], Tensor | None, tuple[int, ...]]:
        """For a frame or column pattern: (this rank's rows by span, where each span's rows end,
        the stream's tokens by span or None where stream order is already so, where each span's
        tokens end) -- the queries and keys of `span_attention`."""
        order, k_bounds = pattern_spans(self.grids, self.bounds, self.pattern)
        lengths = torch.tensor(k_bounds, dtype=torch.long).diff()
        span_ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        span_of = span_ids if order is None else torch.empty_like(span_ids).index_copy_(0, order, span_ids)
        mine = span_of[self.held.cpu()]
        q_bounds = (0, *torch.bincount(mine, minlength=len(lengths)).cumsum(0).tolist())
        device = self.positions.device
        return (torch.argsort(mine, stable=True).to(device), q_bounds,
                None if order is None else order.to(device), k_bounds)

    @functools.cached_property
    def chunk_keys(self) -> tuple[tuple[int, int], ...]:
        """The keys [start, end) each held chunk attends: a causal chunk [a, b) of a sequence
        starting at s reads [s, b); bidirectional, the whole sequence."""
        ends = dict(zip(self.bounds, self.bounds[1:]))
        return tuple((s, b if self.pattern.causal else ends[s]) for s, _, b in self.chunks_of(self.index))

    @functools.cached_property
    def varlen_chunks(self) -> tuple[Tensor, Tensor, Tensor, int, int]:
        """The held chunks as one varlen call takes them: (the stream rows of every chunk's keys,
        packed chunk after chunk; the queries' cu_seqlens; the keys'; the longest chunk; the
        longest key run), on the device. A rank's head and tail chunks of one document are
        separate entries (their key prefixes differ), and the prefixes are copied into one key
        buffer, as cu_seqlens_k must not overlap. Built on the host once per micro-batch (they
        depend on the plan only) and copied without blocking it: no layer pays a launch per
        chunk or waits for the device."""
        chunks, keys = self.chunks_of(self.index), self.chunk_keys
        q_lens = [b - a for _, a, b in chunks]
        k_lens = [e - s for s, e in keys]
        rows = token_order(torch.tensor([s for s, _ in keys], dtype=torch.long), torch.tensor(k_lens, dtype=torch.long))
        device = self.positions.device
        cu_q, cu_k = (to_device(torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32), device)
                      for lens in (q_lens, k_lens))
        return to_device(rows, device), cu_q, cu_k, max(q_lens), max(k_lens)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return context_parallel_attention(q, k, v, self)


def _gather(x: Tensor, shard: ContextShard) -> Tensor:
    """Every rank's rows of `x`, in stream order: an all-gather with uneven sizes, as one
    all-to-all whose pieces are all this rank's rows (no padding rows to leak)."""
    rows = shard.sizes[shard.index]
    received = x.new_empty(sum(shard.sizes), *x.shape[1:])
    dist.all_to_all_single(received, x.repeat(shard.degree, *[1] * (x.dim() - 1)),
                           output_split_sizes=list(shard.sizes), input_split_sizes=[rows] * shard.degree,
                           group=shard.group)
    return received.index_select(0, shard.gathered_order)


def _reduce_scatter(grad: Tensor, shard: ContextShard) -> Tensor:
    """The adjoint of `_gather`: the sum over ranks of each rank's gradient for this rank's rows."""
    by_rank = grad.index_select(0, shard.gathered)
    rows = shard.sizes[shard.index]
    received = grad.new_empty(shard.degree * rows, *grad.shape[1:])
    dist.all_to_all_single(received, by_rank.contiguous(), output_split_sizes=[rows] * shard.degree,
                           input_split_sizes=list(shard.sizes), group=shard.group)
    return received.view(shard.degree, rows, *grad.shape[1:]).sum(0)


def _chunk_sdpa(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """One chunk's queries [m, H, hd] against its sequence's keys [n, kv, hd] (the SDPA path).
    Causal, the queries are the last m of those keys, so the diagonal is bottom-right, not SDPA's
    top-left: on CPU `offset_causal_attention` (no mask, which the CPU kernel would keep for
    backward), elsewhere SDPA with a lower-right causal bias (CUDA's memory-efficient kernel takes
    it as a mask type, not a tensor). Batched 4-D, as `span_sdpa.batched_sdpa`: on CPU a 3-D call
    falls back to the math path, which keeps the scores and ran ~10x slower here."""
    if causal and q.device.type == "cpu":
        return offset_causal_attention(q, k, v)
    mask = None
    if causal:
        # Imported here: torch.nn.attention.bias imports torch._dynamo (~2 s), which CPU ranks
        # never need.
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q.shape[0], k.shape[0])
        if k.shape[1] != q.shape[1]:
            # Grouped-query heads: the lower-right mask runs unmaterialised only in SDPA's flash
            # kernel (which would have served as the varlen kernel, had it taken these tensors)
            # or its memory-efficient one, which refuses GQA (torch 2.13); otherwise the bias is
            # materialised and the math kernel keeps heads x chunk x prefix scores. Repeating the
            # kv heads costs (heads / kv - 1) copies of the chunk's keys and values, linear in
            # the prefix, and lets the memory-efficient kernel take the mask as a mask type.
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
    return out[0].transpose(0, 1)


def _span_attention(q: Tensor, k: Tensor, v: Tensor, shard: ContextShard) -> Tensor:
    """This rank's queries [rows, H, hd] against the whole stream's keys and values
    [tokens, kv, hd], each query to the keys of its frame or patch column (`span_rows`)."""
    by_span, q_bounds, k_order, k_bounds = shard.span_rows
    if k_order is not None:
        k, v = k.index_select(0, k_order), v.index_select(0, k_order)
    out = span_attention(q.index_select(0, by_span), k, v, q_bounds, k_bounds)
    return torch.empty_like(out).index_copy(0, by_span, out)


def _chunk_attention(q: Tensor, k: Tensor, v: Tensor, shard: ContextShard) -> Tensor:
    """This rank's queries [rows, H, hd] against the whole stream's keys and values
    [tokens, kv, hd]: each chunk attends its sequence's keys, all of them (bidirectional) or
    those up to the chunk's last position (causal); under a frame or column pattern, each
    query its span's (`_span_attention`)."""
    causal = shard.pattern.causal
    chunks = shard.chunks_of(shard.index)
    if not chunks:
        return q.clone()  # no rows (the caller keeps the gathered K/V in the graph)
    if not shard.pattern.whole_sample:
        return _span_attention(q, k, v, shard)
    kernel = attention_kernel(q, k, v)
    if kernel != "sdpa":
        # One varlen call with separate query and key cu_seqlens: with the causal diagonal
        # bottom-right (`packed_varlen`), each chunk is its own query "sequence" whose keys end
        # at the chunk's last token, so query i of chunk [a, b) sees keys up to a + i, its
        # global position. Runs on CUDA only (no GPU here: `test_context_parallel` checks the
        # call's metadata against the SDPA path with a stand-in for the kernel).
        rows, cu_q, cu_k, longest_q, longest_k = shard.varlen_chunks
        return packed_varlen(kernel, q, k.index_select(0, rows), v.index_select(0, rows), cu_q, cu_k, longest_q,
                             longest_k, causal)
    # Without a varlen kernel (CPU; a GPU in fp32 or without one): a call per chunk. PyTorch
    # 2.13's CPU build has no varlen kernel (torch.nn.attention.varlen runs on CUDA only), and
    # flex_attention's block mask would batch the chunks only compiled (a compile per shape;
    # eager it materialises the scores).
    out, row = [], 0
    for (s, a, b), (_, e) in zip(chunks, shard.chunk_keys):
        rows = slice(row, row + b - a)
        out.append(_chunk_sdpa(q[rows], k[s:e], v[s:e], causal))
        row += b - a
    return torch.cat(out)


class GatherKV(torch.autograd.Function):
    """K and V of every rank of the CP group, in stream order (Llama 3's context parallelism).

    Forward:  one all-gather of this rank's K and V rows (together) over the CP group, with
              uneven shard sizes (as an all-to-all without padding, `_gather`).
    Backward: one reduce-scatter of the gathered rows' gradient (`_reduce_scatter`): each rank's
              gradient for the keys another rank owns, summed at the owner.
    The attention on the gathered rows is plain autograd, so what it saves for backward (q and
    the gathered K/V) goes through the saved-tensor hooks: a recomputed layer drops it and
    recomputes it (the gather included), and no attention is run twice otherwise."""

    @staticmethod
    def forward(ctx, kv: Tensor, shard: ContextShard) -> Tensor:
        ctx.shard = shard
        return _gather(kv, shard)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return _reduce_scatter(grad.contiguous(), ctx.shard), None


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, shard: ContextShard) -> Tensor:
    """Attention of `shard.pattern` (causal or full inside every sequence, or inside every frame
    or patch column of a clip) for this CP rank's rows: q [rows, heads, hd], k and v [rows, kv
    heads, hd]: K and V gathered over the group (`GatherKV`), then each held chunk against its
    sequence's keys (`_chunk_attention`)."""
    assert q.shape[0] == shard.sizes[shard.index], (q.shape, shard.sizes, shard.index)
    kv_heads = k.shape[1]
    kv = GatherKV.apply(torch.cat([k, v], dim=1), shard)
    out = _chunk_attention(q, kv[:, :kv_heads], kv[:, kv_heads:], shard)
    if not shard.chunks_of(shard.index):
        # No rows here: tie the gathered K/V into the graph anyway, so this rank's backward
        # joins the group's reduce-scatter (with zeros) instead of leaving its peers waiting.
        out = out + 0.0 * kv.sum()
    return out
