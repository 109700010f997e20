"""Ulysses sequence-parallel attention over a packed stream of variable-length sequences.

A micro-batch's packed stream of n tokens is split contiguously over the d ranks of its group,
as evenly as possible (shard sizes differ by at most one token; `StreamShard`). Everything but
attention is per token, so each rank runs it on its shard alone. Attention needs whole
sequences, so it re-shards by heads:

    q, k, v  [n_r, heads, hd] per rank  --all-to-all-->  [n, heads/d, hd] per rank
    attention of the stream's pattern inside every sample over the whole stream (heads/d heads)
    out      [n, heads/d, hd] per rank  --all-to-all-->  [n_r, heads, hd] per rank

Shards differ by a token where d does not divide n, so the exchanges use uneven splits: each
rank sends its own rows and receives the whole stream in order, with no padding. Users never pad.

Rotary positions are applied before the exchange, on the shard, from the global
per-sequence positions that `StreamShard.positions` holds for the shard's tokens.

A video stream under 2D sequence parallelism (`video_sp.VideoShard`) may instead hold whole
frames (spatial blocks) or whole patch columns (temporal blocks): that attention is local over
the spans a rank holds (`StreamShard.held_spans`), with no communication; on its `tokens`
layout it is the Ulysses attention above.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from ..vocabulary.layouts import ULYSSES
from ..vocabulary.samples import Sample
from ..models.protocol import PackedStream
from ..models.kernels import in_autocast_dtype, local_attention
from .all_to_all import Exchange, all_to_all
from .remap import RemappedStream, Route
from .routing import RoutingGroups, SpanGroups
from .shard_sizes import shard_sizes


def _shard_slice(sizes: tuple[int, ...], index: int) -> slice:
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])


@dataclass(frozen=True, kw_only=True)
class StreamShard(PackedStream):
    """This rank's contiguous slice of a packed stream that a process group shares.

    `positions` holds the rotary positions of this rank's tokens only; `bounds` describes the
    whole stream.
    """

    group: ProcessGroup | None
    """The group that shares the stream; None when one rank holds all of it."""
    degree: int
    """Ranks in the group (the SP degree)."""
    index: int
    """This rank's place in the group (its shard is the index-th)."""
    routing: SpanGroups | None = None
    """The group's routing groups when its Ulysses exchange is routed over every NIC of its
    nodes (a routed wave, a group over two or more nodes: `routing.RoutedExchange`); None: one
    `all_to_all_single` over `group`."""

    @classmethod
    def create(cls, samples: list[Sample], group: ProcessGroup | None, degree: int, index: int,
               device: torch.device | str | None = None, *, routing: RoutingGroups | None = None) -> StreamShard:
        """The index-th shard of the stream of these samples (text lengths or clip shapes);
        `routing`: the routed wave's routing groups (None: unrouted)."""
        assert 0 <= index < degree, (index, degree)
        whole = PackedStream.of(samples, device)
        local = _shard_slice(shard_sizes(whole.bounds[-1], degree), index)
        return cls(whole.bounds, whole.positions[local], whole.grids, group=group, degree=degree, index=index,
                   routing=routing.spanning(degree) if routing is not None else None)

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        return shard_sizes(self.bounds[-1], self.degree)

    @property
    def local(self) -> slice:
        """Where this rank's tokens sit in the whole stream."""
        return _shard_slice(self.sizes, self.index)

    @property
    def held_spans(self) -> tuple[int, ...] | None:
        """cu_seqlens of the spans of `pattern` over this rank's rows when it holds every span it
        attends over whole (a 2D sequence-parallel video layout, `video_sp.py`); None for a
        contiguous shard, whose attention is Ulysses'."""
        return None

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of `pattern` for this rank's rows: local at degree 1, else Ulysses over the
        group (`ulysses_attention`)."""
        if self.degree == 1:
            return local_attention(q, k, v, self)
        return ulysses_attention(q, k, v, self)

    def attend_heads(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of this rank's head shard over the rows Ulysses' exchange gathered (the
        whole stream): local. `hybrid.HybridShard` gathers only its CP shard's rows and attends
        context-parallel across the CP group."""
        return local_attention(q, k, v, self)


def _to_heads_route(shard: StreamShard) -> Exchange:
    """The all-to-all under `_seq_to_head`: every rank sends each rank its own rows (for that
    rank's heads) and receives every rank's, in group order; routed over every NIC of the
    group's nodes when `shard.routing` says so (the same rows move: bit for bit the same)."""
    d, rows = shard.degree, shard.sizes[shard.index]
    if shard.routing is None:
        return Route(shard.group, (rows,) * d, shard.sizes)
    return shard.routing.exchange([(n,) * d for n in shard.sizes])


def _seq_to_head(x: Tensor, shard: StreamShard) -> Tensor:
    """[n_r, H, hd] on each rank (its tokens, all heads) -> [n, H/d, hd] (all the group's tokens,
    its heads; n is the stream's tokens, or under `hybrid.HybridShard` its CP shard's)."""
    d, rows = shard.degree, shard.sizes[shard.index]
    _, heads, head_dim = x.shape
    # Piece j (sent to rank j) is this rank's tokens for rank j's heads; piece i received is
    # rank i's shard, so the output is the stream in order. Uneven splits: no pad rows to
    # write, send and drop (they cost as much local copying as the exchange itself on CPU).
    send = x.view(rows, d, heads // d, head_dim).transpose(0, 1).contiguous()
    return _to_heads_route(shard).run(send.view(d * rows, heads // d, head_dim))


def _head_to_seq(y: Tensor, shard: StreamShard) -> Tensor:
    """The inverse (and adjoint) of `_seq_to_head`: [n, H/d, hd] -> [n_r, H, hd]."""
    d, rows = shard.degree, shard.sizes[shard.index]
    _, heads_here, head_dim = y.shape
    # Piece j (sent to rank j) is rank j's tokens, contiguous in the stream; piece i received
    # is this rank's tokens for rank i's heads: put the heads back in order.
    received = _to_heads_route(shard).reversed().run(y)
    return received.view(d, rows, heads_here, head_dim).transpose(0, 1).reshape(rows, d * heads_here, head_dim)


@dataclass(frozen=True)
class HeadExchange:
    """Ulysses' exchange over the shard's group: to heads (`_seq_to_head`) or back (`_head_to_seq`),
    each the other's reverse (see `all_to_all.py`), both around one all-to-all in which every
    rank sends every rank its own rows (`_to_heads_route`), routed or not."""

    shard: StreamShard
    to_heads: bool

    def run(self, x: Tensor) -> Tensor:
        return _seq_to_head(x, self.shard) if self.to_heads else _head_to_seq(x, self.shard)

    def reversed(self) -> HeadExchange:
        return HeadExchange(self.shard, not self.to_heads)


def sequence_parallel_attention(q: Tensor, k: Tensor, v: Tensor, stream: PackedStream) -> Tensor:
    """Attention of `stream.pattern` inside every sample of a stream however the runtime holds
    it: each of its stream classes attends in its own layout (`StreamShard.attend`: Ulysses;
    `video_sp.VideoShard`: the 2D layouts; `remap.RemappedStream`: the remapping layer's
    exchanges around its group's); a stream one process holds whole attends locally. A new
    layout is a new stream class with its `attend`, not a branch here. Under autocast q, k and
    v are cast to its dtype first (`in_autocast_dtype`), so every exchange moves half-precision
    values."""
    q, k, v = in_autocast_dtype(q, k, v)
    if isinstance(stream, (StreamShard, RemappedStream)):  # hybrid.HybridShard is a StreamShard
        return stream.attend(q, k, v)
    return local_attention(q, k, v, stream)


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, stream: StreamShard) -> Tensor:
    """Attention of `stream.pattern` inside every sample of a stream sharded over `stream.group`
    (Ulysses): with the whole stream on every rank for its heads, any pattern is local.

    Communication per call, for a group of degree d > 1:
      forward:  one all-to-all of q, k and v together (sequence- to head-sharded) and one of the
                output (head- to sequence-sharded);
      backward: one all-to-all of the output's gradient (sequence- to head-sharded) and one of
                the gradients of q, k and v together (head- to sequence-sharded);
    between them the head shard's attention, `stream.attend_heads` (local; context-parallel
    over the CP group under `hybrid.HybridShard`, with its own collectives). Each all-to-all is
    one `all_to_all_single` over the group or, routed (`stream.routing`), three
    (`routing.RoutedExchange`: to the node's proxies, across the nodes over every NIC, to the
    destinations).
    A recomputed layer repeats the two forward all-to-alls when it is recomputed in backward.
    Where d does not divide the kv heads, they are replicated to lcm(kv heads, d) before the
    exchange (the bytes `CostModel.exchange_bytes` prices).
    """
    d, heads = stream.degree, q.shape[1]
    ULYSSES.check(d, heads)  # raised on every rank of the group alike, before any communication
    rows, head_dim = q.shape[0], q.shape[2]
    assert rows == stream.sizes[stream.index], (rows, stream.sizes, stream.index)
    kv_heads = ULYSSES.exchanged_kv_heads(k.shape[1], d)
    if kv_heads != k.shape[1]:
        # GQA: query head h reads kv head h // (heads / kv). Repeating each kv head r times in
        # place gives kv_heads = lcm(kv, d) heads, a divisor of heads (d and kv both divide it),
        # and query head h reads repeated head h // (heads / kv_heads), a copy of the same kv
        # head. Rank i receives the i-th 1/d of the query heads and the i-th 1/d of the repeated
        # kv heads, exactly those they read, so the local attention is plain GQA with ratio
        # heads / kv_heads. Autograd sums the replicas' gradients in backward.
        r = kv_heads // k.shape[1]
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    # One exchange for q, k and v: rank j's piece is [q heads of j | k heads of j | v heads of j].
    qkv = torch.cat([t.reshape(rows, d, t.shape[1] // d, head_dim) for t in (q, k, v)], dim=2)
    qkv = all_to_all(qkv.reshape(rows, heads + 2 * kv_heads, head_dim), HeadExchange(stream, to_heads=True))
    q, k, v = qkv.split([heads // d, kv_heads // d, kv_heads // d], dim=1)
    return all_to_all(stream.attend_heads(q, k, v), HeadExchange(stream, to_heads=False))
