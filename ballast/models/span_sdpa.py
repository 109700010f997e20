"""Attention inside spans without a varlen kernel (on CPU, in fp32, or where neither varlen
kernel runs): all equally long spans of a stream (the frames of a clip, its patch columns, the
frames of all tiny clips of one size) go to one `scaled_dot_product_attention` as one batch. It
needs no block-diagonal mask and, through PyTorch's CPU flash kernel, no memory quadratic in the
span. Spans of at most TINY_SPAN tokens skip SDPA, whose CPU kernel costs about as much per span
of 1-3 tokens as per span of 16 (`tiny_attention`). On a GPU it is a Python loop of one launch
per length: the varlen kernels (`kernels.py`) run a whole packed stream in one."""
from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .stream_index import METADATA_CACHE, equal_groups, to_device, token_order


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
"""Spans up to this long skip SDPA in the `sdpa` path (`tiny_attention`)."""


def tiny_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
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


def batched_sdpa(q: Tensor, k: Tensor, v: Tensor, bounds: Sequence[int], causal: bool) -> Tensor:
    # All spans of one length go as one batch: a clip's F frames (or S columns) are one call,
    # and so are all the equally long frames of all the clips of a micro-batch (hundreds of tiny
    # clips have few distinct lengths: n tokens have at most ~sqrt(2n) of them). Spans that are
    # not consecutive are gathered into place by one index over the rows and put back by one
    # (not a slice per span: each slice's backward fills a zero gradient of the whole input,
    # quadratic in the spans). Every span's attention is the same computation as alone.
    # Spans of up to TINY_SPAN tokens skip SDPA (`tiny_attention`).
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
            out = tiny_attention(qg, kg, vg, causal)
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


def span_sdpa(q: Tensor, k: Tensor, v: Tensor, q_bounds: Sequence[int], k_bounds: Sequence[int]) -> Tensor:
    """`kernels.span_attention` without a varlen kernel: one SDPA (or `tiny_attention`) per
    distinct (queries, keys) pair of lengths, which a clip's pieces of frames or columns take a
    handful of."""
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
            out = tiny_attention(qg, kg, vg, causal=False)
        else:
            out = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                 enable_gqa=True).transpose(1, 2)
        outputs.append(out.reshape(m * count, *q.shape[1:]))
    out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    # Back to the queries' order (`q_rows` is a permutation of them: every query is in a span).
    return torch.empty_like(out).index_copy(0, q_rows, out)
