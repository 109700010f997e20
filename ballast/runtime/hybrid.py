"""Hybrid Ulysses x context-parallel attention over a packed stream (USP's 2D layout).

A group of degree d split u x c (`plans.Group.cp` is c, d = u c): group rank r has CP index
r // u and Ulysses index r % u. The Ulysses sub-groups are the contiguous u ranks of one CP
index (fast links inside a node); the CP groups are the c ranks u apart, one per Ulysses index.
CP shard i (`context_parallel.ContextShard` of index i over c: head-tail chunks of every
sequence for causal attention) is split contiguously over the u ranks of sub-group i
(`shard_sizes`), so a rank's rows are a contiguous piece of its CP shard's rows: a
set of stream indices (`HybridShard.local`), not a slice of the stream.

Attention, per call:
    q, k, v  [rows, H, hd]  --Ulysses all-to-all in the sub-group-->  [CP shard rows, H/u, hd]
    context-parallel attention over the CP group with those heads (K, V all-gathered)
    out      [CP shard rows, H/u, hd]  --all-to-all back-->  [rows, H, hd]
Communication: forward, the Ulysses all-to-all of q, k, v (kv heads replicated to lcm(kv, u)
where u does not divide them, as `attention.ulysses_attention` does), the CP all-gather of K
and V over the CP group, the all-to-all of the output; backward, the all-to-all of the output's
gradient, the CP reduce-scatter of dK and dV, the all-to-all of dq, dk, dv. u = 1 is pure
context parallelism (no Ulysses exchange); c = 1 is `attention.StreamShard`.

Rotary positions stay each token's global position in its sequence (a clip token's (sample,
frame, row, column)); clips run CP in c contiguous chunks each (`balance_of`).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from ..models.protocol import PackedStream
from ..vocabulary.patterns import CAUSAL, FULL, Span
from ..vocabulary.samples import Sample
from .attention import StreamShard, _shard_slice
from .context_parallel import ContextShard
from .context_shard import held_chunks, held_indices
from .groups import ContextGroups
from .routing import RoutingGroups
from .shard_sizes import shard_sizes


def balance_of(samples: list[Sample]) -> Span:
    """The pattern CP chunks of these samples are balanced for, which the samples say: text is
    causal (head-tail chunks); clips are bidirectional, c contiguous chunks per clip, which
    balance a full-attention DiT's whole-clip attention and a spatial-temporal one's frames and
    columns alike (every query of a clip attends as many keys)."""
    return FULL if any(isinstance(x, tuple) for x in samples) else CAUSAL


def attention_rows(samples: list[Sample], degree: int, cp: int) -> list[Tensor]:
    """The stream indices every rank of a group of `degree` ranks split u x `cp` holds of a
    micro-batch of `samples` for attention, rank by rank (`HybridShard.create`'s default cut;
    at cp = 1 `StreamShard`'s contiguous shards), computed without the group: what a remap
    domain lays its attention layout out by (`executor._run_slot`)."""
    u, bounds = degree // cp, PackedStream.of(samples).bounds
    rows = []
    for j in range(cp):
        held = (torch.arange(bounds[-1]) if cp == 1
                else held_indices(held_chunks(bounds, cp, j, balance_of(samples).causal)))
        cuts = list(itertools.accumulate(shard_sizes(len(held), u), initial=0))
        rows += [held[a:b] for a, b in zip(cuts, cuts[1:])]
    return rows


@dataclass(frozen=True, kw_only=True)
class HybridShard(StreamShard):
    """This rank's rows of a micro-batch its group runs u x c. `group`, `degree` and `index` are
    the Ulysses sub-group's (u ranks, this rank's place in it); `context` is the CP shard the
    sub-group shares, with the CP group; `positions` are this rank's rows'."""

    context: ContextShard

    @classmethod
    def create(cls, samples: list[Sample], group: ContextGroups, degree: int, index: int,
               device: torch.device | str | None = None, pattern: Span | None = None, *,
               routing: RoutingGroups | None = None) -> HybridShard:
        """Group rank `index`'s rows of the stream of these samples, for a group of `degree`
        ranks split `group.cp` ways context-parallel (`ProcessGroups.get(start, degree, cp)`),
        its chunks balanced for `pattern` (by default `balance_of` the samples). Attention takes
        the stream's pattern, whichever the chunks were cut for: only their balance differs.
        `routing`: the routed wave's routing groups, which route the Ulysses exchange where the
        sub-group spans nodes (the CP all-gathers stay unrouted)."""
        assert 0 <= index < degree and degree % group.cp == 0, (index, degree, group.cp)
        u = degree // group.cp
        context = ContextShard.create(samples, group.context, group.cp, index // u, device,
                                      pattern or balance_of(samples))
        rows = _shard_slice(shard_sizes(context.sizes[context.index], u), index % u)
        return cls(context.bounds, context.positions[rows], context.grids, pattern=context.pattern,
                   group=group.ulysses, degree=u, index=index % u, context=context,
                   routing=routing.spanning(u) if routing is not None else None)

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        """Rows of each rank of the Ulysses sub-group: its CP shard split contiguously."""
        return shard_sizes(self.context.sizes[self.context.index], self.degree)

    @property
    def local(self) -> Tensor:  # type: ignore[override]
        """The stream indices of this rank's rows, in row order."""
        return self.context.held[_shard_slice(self.sizes, self.index)]

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attention of `pattern` for this rank's rows: context-parallel at u = 1, else Ulysses in
        the sub-group around it (`ulysses_attention`, which calls `attend_heads`)."""
        if self.degree == 1:
            return self.attend_heads(q, k, v)
        return super().attend(q, k, v)

    def attend_heads(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The CP shard's rows with this rank's heads, attended context-parallel over the CP group."""
        context = self.context if self.context.pattern == self.pattern else \
            dataclasses.replace(self.context, pattern=self.pattern)
        return context.attend(q, k, v)
