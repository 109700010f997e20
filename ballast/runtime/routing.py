"""Zeppelin's routing layer: an uneven all-to-all over whole nodes whose inter-node rows cross
the node boundary over every NIC of the node, not only the sending rank's.

Each rank sits under one NIC of its node (`NodeNics`). An unrouted exchange (`remap.Route`)
sends a rank's rows for another node through its own NIC, however idle its node's others are.
`RoutedExchange` moves the same rows in three all-to-alls, each one `all_to_all_single`:

    1 scatter  over the node group: rows for a rank of the same node go straight to it; rows
               for rank t of another node are cut into k contiguous chunks (k NICs per node, as
               even as `shard_sizes` cuts), chunk p to this node's proxy under NIC p
    2 cross    over the rail group (the ranks of the span with the same local index, one per
               node): each proxy sends its chunks to the rank of its own local index on t's node,
               so each NIC carries 1/k of every inter-node piece, all k NICs at once
    3 combine  over the node group: the far proxies forward the chunks to t

and t puts the rows from each source in source order, from phase 1 (its node) and phase 3
(the others): the output is `Route`'s, bit for bit (only rows move). Under NIC p, the proxy of a
rank at position m of its own NIC's ranks is the rank at position m (mod their count) of NIC p's:
a rank is its own proxy for its NIC's chunk, and the ranks of a NIC spread the others' traffic
over distinct proxies. Every rank knows which rows every rank of the span sends to every other
(`matrix`), since a proxy must know what it receives and forwards.

Backward (`reversed`, what `all_to_all.AllToAll` runs on the gradient): the routed exchange of
the transposed matrix, again scatter / cross / combine, three all-to-alls.

`RoutingGroups` makes the node and rail groups once at start-up, as `groups.ProcessGroups`
makes the plan's blocks. It is a sibling, not part of ProcessGroups: its groups depend on the
Cluster's nodes and NICs, and a one-node run makes none (`routing_groups`: it pays no rendezvous
for them), and the blocks a plan names are ranks, while the rails are per block of nodes. A
node group of a power-of-two node duplicates an aligned block of ProcessGroups: one
communicator per node more.

The executor runs a routed wave's (`plans.Wave.routed`) remap slots, Ulysses exchanges and 2D
video layout switches over 2+ nodes as `RoutedExchange`s (`RoutingGroups.spanning`), each
with a matrix every rank computes.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from ..vocabulary.cluster import Cluster
from ..vocabulary.nic_devices import proxy
from .shard_sizes import shard_sizes
from .world import world_timeout

Key = tuple[int, int, int]
"""A piece of the exchange: (source, destination, chunk), ranks in span order; chunk p of an
inter-node piece crosses under NIC p, an intra-node piece is one chunk 0."""
Span = tuple[int, int, int]
"""Rows lo..hi-1 of buffer b (0: the input, 1-3: what phase 1-3 received): (b, lo, hi)."""


@dataclass(frozen=True)
class NodeNics:
    """Ranks per node (nodes are contiguous blocks of ranks) and the local ranks each NIC of a
    node serves: a `Cluster`'s `devices_per_node` and `nic_devices` (`of`), which the Cluster
    fills in and validates (`nic_devices.fill_nic_devices`)."""

    ranks_per_node: int
    nic_devices: tuple[tuple[int, ...], ...]
    """The local ranks under each NIC, in NIC order; every local rank under exactly one."""

    @classmethod
    def of(cls, cluster: Cluster) -> NodeNics:
        return cls(cluster.devices_per_node, tuple(map(tuple, cluster.nic_devices)))

    @property
    def nics_per_node(self) -> int:
        return len(self.nic_devices)

    def proxy(self, nic: int, local: int) -> int:
        """The local rank that carries local rank `local`'s chunks under NIC `nic`."""
        return proxy(self.nic_devices, local, nic)


@dataclass(frozen=True)
class Phase:
    """One all-to-all of a rank: the rows it sends (`take`, grouped by peer in group order) and
    how many rows go to and come from each peer of the phase's group."""

    take: tuple[Span, ...]
    send: tuple[int, ...]
    recv: tuple[int, ...]


@dataclass(frozen=True)
class RankPlan:
    phases: tuple[Phase, Phase, Phase]
    """Scatter over the node group, cross over the rail group, combine over the node group."""
    output: tuple[Span, ...]
    """The received rows in source order (from buffers 1 and 3)."""


def plan(matrix: Sequence[Sequence[int]], nics: NodeNics, index: int) -> RankPlan:
    """Rank `index`'s three phases when rank s of the span sends matrix[s][t] rows to rank t."""
    size, r, k = len(matrix), nics.ranks_per_node, nics.nics_per_node
    if size % r or size // r < 2:
        raise ValueError(f"a routed exchange spans two or more whole nodes of {r} ranks, not {size} ranks")
    node, local = index // r, index % r
    here = range(node * r, node * r + r)

    @functools.cache
    def cut(s: int, t: int) -> tuple[int, ...]:
        """The rows of each chunk of the piece s -> t."""
        return (matrix[s][t],) if s // r == t // r else shard_sizes(matrix[s][t], k)

    def rows(key: Key) -> int:
        return cut(key[0], key[1])[key[2]]

    def scatter_to(key: Key) -> int:
        s, t, p = key
        return t % r if s // r == t // r else nics.proxy(p, s % r)

    def pieces(sources: Iterable[int], targets: Iterable[int], keep) -> list[Key]:
        return [(s, t, p) for s in sources for t in targets for p in range(len(cut(s, t))) if keep((s, t, p))]

    def split(keys: list[Key], peer, peers: int) -> tuple[int, ...]:
        counts = [0] * peers
        for key in keys:
            counts[peer(key)] += rows(key)
        return tuple(counts)

    def proxy_of(key: Key) -> int:
        return nics.proxy(key[2], key[0] % r)

    # Phase b sends what this rank holds before it (buffers[b]), grouped by peer (to[b], stable:
    # each peer's rows keep the buffer's order), and holds after it every peer's rows for it,
    # peers in group order (told apart by source[b]): buffers[b + 1].
    others = [s for s in range(size) if s // r != node]
    buffers = [pieces([index], range(size), lambda key: True),  # the input, by destination
               # Phase 1: each rank of the node sends in its input's order: sources in rank order.
               pieces(here, range(size), lambda key: scatter_to(key) == local),
               # Phase 2: from each other node in rank order, the chunks its proxy sends here.
               pieces(others, here, lambda key: proxy_of(key) == local),
               # Phase 3: each proxy's chunks for this rank in (source, chunk) order, proxies in order.
               sorted(pieces(others, [index], lambda key: True), key=proxy_of)]
    to = [scatter_to, lambda key: key[1] // r, lambda key: key[1] % r]
    held = [buffers[0], [key for key in buffers[1] if key[1] // r != node], buffers[2]]  # (rows for here stay)
    sent = [sorted(keys, key=to[b]) for b, keys in enumerate(held)]
    source = [lambda key: key[0] % r, lambda key: key[0] // r, proxy_of]
    peers = [r, size // r, r]
    spans = _locator(buffers, rows)
    phases = tuple(Phase(spans([(b, key) for key in sent[b]]), split(sent[b], to[b], peers[b]),
                         split(buffers[b + 1], source[b], peers[b])) for b in range(3))
    output = [(1 if s // r == node else 3, (s, index, p)) for s in range(size) for p in range(len(cut(s, index)))]
    return RankPlan(phases, spans(output))


def _locator(buffers: list[list[Key]], rows):
    """A function from wanted pieces (buffer, key) to where they sit, adjacent rows merged."""
    where = [{key: start for key, start in zip(keys, itertools.accumulate(map(rows, keys), initial=0))}
             for keys in buffers]

    def spans(wanted: list[tuple[int, Key]]) -> tuple[Span, ...]:
        merged: list[Span] = []
        for b, key in wanted:
            lo, n = where[b][key], rows(key)
            if n and merged and merged[-1][0] == b and merged[-1][2] == lo:
                merged[-1] = (b, merged[-1][1], lo + n)
            elif n:
                merged.append((b, lo, lo + n))
        return tuple(merged)
    return spans


@dataclass(frozen=True)
class SpanGroups:
    """This rank's groups for a routed exchange over a span of `size` ranks (whole nodes,
    `RoutingGroups.get`)."""

    nics: NodeNics
    size: int
    index: int
    """This rank's place in the span."""
    node: ProcessGroup | None
    """Its node's ranks; None for one rank per node (phases 1 and 3 then only copy)."""
    rail: ProcessGroup
    """The span's ranks with its local index, one per node."""

    def exchange(self, matrix: Sequence[Sequence[int]]) -> RoutedExchange:
        """The routed exchange over the span in which rank s sends matrix[s][t] rows to rank t."""
        return RoutedExchange(self, tuple(map(tuple, matrix)))


class RoutingGroups:
    """This rank's node group and its rail groups in every aligned power-of-two block of 2+ nodes
    (and all the world's nodes): the spans a routed exchange may cover, as `ProcessGroups`'
    aligned blocks are the groups a plan may name. Made in one fixed order on every rank
    (`dist.new_group` is a collective of the world), with the world's timeout. A world of n
    nodes of r ranks has n node groups and about (n - 1) r rails."""

    def __init__(self, nics: NodeNics) -> None:
        timeout = world_timeout()
        if not dist.is_initialized() or timeout is None:
            raise ValueError("RoutingGroups needs torch.distributed to be initialised first, by "
                             "ballast.runtime.init_distributed or run_local (they record its timeout)")
        world, r = dist.get_world_size(), nics.ranks_per_node
        if world % r:
            raise ValueError(f"a world of {world} ranks is not whole nodes of {r} ranks")
        self.nics, self.rank, nodes = nics, dist.get_rank(), world // r
        self._node: ProcessGroup | None = None
        for first in range(0, world, r):  # (one-rank nodes need no group)
            group = dist.new_group(list(range(first, first + r)), timeout=timeout) if r > 1 else None
            if first <= self.rank < first + r:
                self._node = group
        blocks = [(first, count) for count in (2 ** e for e in range(1, nodes.bit_length()))
                  for first in range(0, nodes - count + 1, count)]
        blocks += [] if (0, nodes) in blocks or nodes < 2 else [(0, nodes)]
        self._rails: dict[tuple[int, int], ProcessGroup] = {}
        """(first rank, ranks) of a block -> this rank's rail in it."""
        for first, count in blocks:
            for local in range(r):
                ranks = [(first + b) * r + local for b in range(count)]
                group = dist.new_group(ranks, timeout=timeout)
                if self.rank in ranks:
                    self._rails[(first * r, count * r)] = group

    def spanning(self, size: int) -> SpanGroups | None:
        """This rank's groups for an exchange over the aligned block of `size` ranks that holds it
        (every group, Ulysses sub-group and remap domain of a plan is one) when the block covers
        two or more nodes; None when it lies inside one node: nothing of it crosses a NIC."""
        if size <= self.nics.ranks_per_node:
            return None
        return self.get(self.rank - self.rank % size, size)

    def get(self, start: int, size: int) -> SpanGroups:
        """This rank's groups for an exchange over ranks start..start+size-1."""
        rail = self._rails.get((start, size))
        if rail is None or not start <= self.rank < start + size:
            raise ValueError(f"no routing groups for ranks {start}..{start + size - 1} on rank {self.rank}: a "
                             f"routed exchange spans an aligned power-of-two block of 2+ nodes of "
                             f"{self.nics.ranks_per_node} ranks (or all of them) that holds this rank")
        return SpanGroups(self.nics, size, self.rank - start, self._node, rail)


@dataclass(frozen=True, eq=False)
class RoutedExchange:
    """One rank's side of a routed uneven all-to-all (see the module docstring): an
    `all_to_all.Exchange` that moves exactly `Route`'s rows."""

    groups: SpanGroups
    matrix: tuple[tuple[int, ...], ...]
    """Rows each rank of the span sends each rank (span order): this rank's row is Route's
    `send`, its column Route's `recv`."""

    def __post_init__(self) -> None:
        if len(self.matrix) != self.groups.size or any(len(row) != self.groups.size for row in self.matrix):
            raise ValueError(f"a routed exchange over {self.groups.size} ranks needs a {self.groups.size} x "
                             f"{self.groups.size} matrix of rows, got {[len(row) for row in self.matrix]}")

    @property
    def recv(self) -> tuple[int, ...]:
        return tuple(row[self.groups.index] for row in self.matrix)

    @functools.cached_property
    def plan(self) -> RankPlan:
        return plan(self.matrix, self.groups.nics, self.groups.index)

    def run(self, x: Tensor) -> Tensor:
        assert x.shape[0] == sum(self.matrix[self.groups.index]), (x.shape, self.matrix[self.groups.index])
        buffers = [x.contiguous()]
        for phase, group in zip(self.plan.phases, (self.groups.node, self.groups.rail, self.groups.node)):
            sent = _take(buffers, phase.take, x)
            if group is None:  # one rank per node: the phase is a copy to itself
                buffers.append(sent)
                continue
            received = x.new_empty((sum(phase.recv), *x.shape[1:]))
            dist.all_to_all_single(received, sent, list(phase.recv), list(phase.send), group=group)
            buffers.append(received)
        return _take(buffers, self.plan.output, x)

    def reversed(self) -> RoutedExchange:
        return RoutedExchange(self.groups, tuple(zip(*self.matrix)))


def _take(buffers: list[Tensor], spans: tuple[Span, ...], like: Tensor) -> Tensor:
    """The spans' rows in order; a whole received buffer itself, without a copy (never the input:
    the output must not alias it)."""
    if len(spans) == 1 and spans[0][0] > 0 and spans[0][1] == 0 and spans[0][2] == buffers[spans[0][0]].shape[0]:
        return buffers[spans[0][0]]
    if not spans:
        return like.new_empty((0, *like.shape[1:]))
    return torch.cat([buffers[b][lo:hi] for b, lo, hi in spans])


def routing_groups(cluster: Cluster) -> RoutingGroups | None:
    """The routing groups of `cluster`'s nodes and NICs, made collectively on every rank (see
    `RoutingGroups`), when it has two or more nodes; None for one node, which routes nothing and
    so pays no rendezvous."""
    return RoutingGroups(NodeNics.of(cluster)) if cluster.nodes > 1 else None
