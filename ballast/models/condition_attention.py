"""Cross-attention over a packed stream: every held token attends to its own sample's condition
tokens (a caption embedding, a label's tokens), never another sample's. The video DiTs'
`video_layers.CrossAttention` and diffusers Wan's cross-attention (`wan_attention.py`) call it
with their own projections.

Samples are batched by how many rows they hold: all samples with c held tokens go as one SDPA
call [samples, heads, c, head_dim] against their own condition tokens, gathered into place by
one index over the rows and put back by one, so a micro-batch of hundreds of tiny clips makes a
few calls (at most one per distinct clip size: n tokens have ~sqrt(2n) sizes at most), not one
per sample. The kernel never scores a token against another sample's condition (a block mask
over all of them would cost tokens x all condition tokens, mostly masked). Conditions of one
length need no padding. Captions vary in length: a batch's captions are padded to its longest
with a key mask, after the key and value projections (padding rows are gathered copies, masked
out). That keeps memory at most samples x longest caption x kv_dim per batch, the order of the
captions themselves; padding queries too, into one call, would cost samples x longest clip (one
large clip beside hundreds of tiny ones), and gathering each token's own keys tokens x caption
length x kv_dim. Always local: every process has every sample's condition.
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .stream_index import equal_groups, to_device, token_order
from .video_conditioning import HeldSamples

KeysValues = Callable[[Tensor], tuple[Tensor, Tensor]]
"""Condition tokens [m, width] -> (keys, values), each [m, kv heads, head_dim]: a model's own
projections (and key norm); applied per row, so to any subset of the rows alike."""


def condition_attention(q: Tensor, held: HeldSamples, bounds: tuple[int, ...], rows: Tensor, tokens: Tensor,
                        keys_values: KeysValues) -> Tensor:
    """[n, heads, head_dim]: attention of the held tokens' queries `q` [n, heads, head_dim] (in
    the held samples' runs, `held`) to their own sample's condition tokens. Sample i's condition
    is rows[bounds[i]:bounds[i + 1]] of `tokens` [distinct rows, width] (`rows` on the CPU);
    `keys_values` projects them, before the gather when that is fewer rows (labels: a few
    distinct rows shared by many samples), else after."""
    n, device = q.shape[0], q.device
    edges = torch.tensor(bounds, dtype=torch.long)
    # The held runs batched by their rows (`equal_groups`: runs of one size, wherever they are).
    order, sizes, runs = equal_groups(held.counts)
    picked = order if order is not None else torch.arange(held.counts.numel())
    samples, counts = held.samples[picked], held.counts[picked]
    lengths = (edges[1:] - edges[:-1])[samples]
    # Every held sample's condition tokens, in batch order.
    context = to_device(rows[token_order(edges[:-1][samples], lengths)], tokens.device)
    if n and tokens.shape[0] <= context.numel():
        k, v = (t.index_select(0, context) for t in keys_values(tokens))
    else:
        k, v = keys_values(tokens.index_select(0, context))
    if n == 0:
        # No held token: an empty output that keeps k and v (empty too, so their sums are 0) on
        # the graph, so that their weights get a (zero) gradient as on every other rank.
        return q + (k.sum() + v.sum())
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    if order is not None:
        firsts = (torch.cumsum(held.counts, 0) - held.counts)[picked]
        order = to_device(token_order(firsts, counts), device)
        q = q.index_select(0, order)
    key_lengths = lengths.tolist()
    firsts = list(itertools.accumulate(runs, initial=0))
    batches = [key_lengths[a:b] for a, b in zip(firsts, firsts[1:])]
    outputs = []
    for size, count, run, batch_lengths, q_batch, k_batch, v_batch in zip(
            sizes, runs, firsts, batches, q.split([r * c for r, c in zip(sizes, runs)]),
            k.split([sum(b) for b in batches]), v.split([sum(b) for b in batches])):
        longest, mask = max(batch_lengths), None
        if longest == min(batch_lengths):
            k_batch, v_batch = (t.view(count, longest, kv_heads, head_dim) for t in (k_batch, v_batch))
        else:  # captions of several lengths: pad to the longest, mask the padding
            own = lengths[run:run + count]
            slot = torch.arange(longest)
            pick = (torch.cumsum(own, 0) - own)[:, None] + torch.minimum(slot[None, :], own[:, None] - 1)
            pick = to_device(pick.reshape(-1), device)
            k_batch, v_batch = (t.index_select(0, pick).view(count, longest, kv_heads, head_dim)
                                for t in (k_batch, v_batch))
            mask = to_device(slot[None, :] < own[:, None], device)[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q_batch.view(count, size, heads, head_dim).transpose(1, 2), k_batch.transpose(1, 2),
            v_batch.transpose(1, 2), attn_mask=mask, enable_gqa=True)
        outputs.append(out.transpose(1, 2).reshape(count * size, heads, head_dim))
    out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    if order is not None:
        out = torch.empty_like(out).index_copy(0, order, out)
    return out
