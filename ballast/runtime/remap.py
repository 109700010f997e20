"""Zeppelin's remapping layer: linear modules on a balanced token layout, attention on the plan's.

A remap domain (`Wave.remap`) is an aligned block of ranks whose groups run their micro-batches
slot by slot: slot m is the m-th micro-batch of every group in the domain. The slot's tokens,
in domain order (groups by first rank, each group's packed stream in order), are laid out twice,
each layout a contiguous partition of that order over the domain's ranks:

    attention layout  each group's stream split over its ranks as `StreamShard` splits it
                      (ranks of a group idle in the slot hold nothing); a group with a CP part
                      holds head-tail rows (`hybrid.HybridShard`), so the domain order is
                      every rank's attention rows in rank order, not the stream's;
    balanced layout   the whole slot split evenly over the domain's ranks (`shard_sizes`).

Everything but attention (embedding, norms, projections, MLP, output layer, loss) runs on the
balanced layout, so every rank of the domain does the same linear work whatever the groups'
loads. Each attention call moves q, k, v to the attention layout and its output back:

    [q | k | v] balanced rows  --all-to-all over the domain-->  attention rows
    Ulysses attention inside the group (its own all-to-alls, `attention.py`)
    out attention rows         --all-to-all over the domain-->  balanced rows

Between two contiguous partitions of one order a rank exchanges only the overlaps of its
interval with the other ranks' intervals, so the all-to-alls have uneven (mostly empty) splits.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from ..models.protocol import PackedStream
from .all_to_all import Exchange, all_to_all


def overlaps(source: Sequence[int], target: Sequence[int], index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rows rank `index` sends to and receives from every rank when one order of rows,
    partitioned contiguously by `source` sizes, is re-partitioned by `target` sizes."""
    assert sum(source) == sum(target), (source, target)
    src = list(itertools.accumulate(source, initial=0))
    dst = list(itertools.accumulate(target, initial=0))

    def common(a: int, b: int, c: int, d: int) -> int:
        return max(0, min(b, d) - max(a, c))

    send = tuple(common(src[index], src[index + 1], dst[j], dst[j + 1]) for j in range(len(target)))
    recv = tuple(common(src[j], src[j + 1], dst[index], dst[index + 1]) for j in range(len(source)))
    return send, recv


@dataclass(frozen=True)
class Route:
    """One re-partition over a domain's process group, from this rank's point of view: an
    `all_to_all.Exchange` with uneven splits."""

    group: ProcessGroup | None
    send: tuple[int, ...]
    """Rows sent to each rank of the domain (in domain order)."""
    recv: tuple[int, ...]
    """Rows received from each rank of the domain."""

    def run(self, x: Tensor) -> Tensor:
        assert x.shape[0] == sum(self.send), (x.shape, self.send)
        out = x.new_empty((sum(self.recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(self.recv), list(self.send), group=self.group)
        return out

    def reversed(self) -> Route:
        return Route(self.group, self.recv, self.send)


@dataclass(frozen=True, kw_only=True)
class RemappedStream(PackedStream):
    """This rank's balanced share of a remapped slot; `positions` are its tokens' positions,
    `bounds` the cu_seqlens of the slot's whole stream in domain order."""

    shard: PackedStream | None
    """This rank's attention-layout shard of its group's stream (an `attention.StreamShard`,
    whose `attend` runs the group's attention); None when the group is idle."""
    route: Exchange
    """Balanced layout -> attention layout over the domain: a `Route`, or in a routed wave over
    two or more nodes the same rows as a `routing.RoutedExchange`."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The group's attention (`shard.attend`) on the attention layout, for q, k, v and a
        result on the balanced layout.

        Communication: forward, one all-to-all of q, k and v together and one of the output over
        the domain; backward, the same two in reverse (each three all-to-alls when routed). A
        rank whose group is idle in the slot still takes part in both, and its (empty) output
        stays on q, k, v's graph so that backward's all-to-alls run on every rank of the domain.
        """
        heads, kv_heads = q.shape[1], k.shape[1]
        qkv = all_to_all(torch.cat([q, k, v], dim=1), self.route)
        if self.shard is None:
            out = qkv[:, :heads]
        else:
            q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
            out = dataclasses.replace(self.shard, pattern=self.pattern).attend(q, k, v)
        return all_to_all(out, self.route.reversed())
