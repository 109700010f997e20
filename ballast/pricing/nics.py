"""The NIC load of one wave's exchange: which NIC carries how many bytes, unrouted or routed.

Every rank of a node sits under one of the node's NICs (`Cluster.nic_devices`). Unrouted, a
transfer between nodes leaves through its source rank's NIC and enters through its destination
rank's, so under data-centric plans the few ranks whose long sequence spans nodes saturate
their NICs while the others' stay idle. Zeppelin's routing layer spreads each inter-node
transfer over k NICs of the node: the source hands k - 1 of its k equal chunks to proxy ranks
under other NICs over the node's links (dispatch), the k chunks cross in parallel, and the
destination's proxies hand theirs on to it (combine). Chunk i leaves through NIC (a + i) mod
nics_per_node of the source node, a the source's own NIC, and enters through NIC (b + i) mod
nics_per_node of the destination node, b the destination's: with k = 1 this is the unrouted
exchange, and under any k each NIC carries the mean of k NICs' unrouted loads, so routing never
loads the busiest NIC more.

The time of an exchange is its busiest NIC's bytes / the NIC's rate (NICs are full duplex:
bytes out and in count apart), plus for a routed exchange the busiest rank's dispatch and combine
bytes / the node's link rate. Transfers inside a node never touch a NIC. The rates are the ones
the cost model's per-degree all-to-all bandwidths imply (`nic_rate`, `link_rate`), not the cards'
data sheets: those bandwidths were measured on real all-to-alls, whose efficiency a data sheet
does not know. What the timeline asks (docs/design.md, section 4, has the formulas):

    even_exchange    how an all-to-all in which every rank of whole nodes sends alike (Ulysses
                     groups wider than a node, CP all-gathers) loads the NICs, unrouted and routed
    exchange_surcharge  what a group's micro-batch pays beyond its degree's bandwidth for that
    group_nic_bytes, move_load   what a group's exchanges and a remap move put on each NIC
    move_time        the seconds of a remap domain's token move over two or more nodes
    fastest_move_rate   the lower bound's rate of such a move
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..vocabulary.cluster import Cluster
from .cost import CostModel
from .micro_batch import recomputed_exchanges

Transfers = Mapping[tuple[int, int], float]
"""Bytes each (source rank, destination rank) pair moves in one wave; absent pairs move none."""


@dataclass(frozen=True)
class NicLoad:
    """The bytes a wave's exchange puts on each NIC and on the busiest rank's intra-node links."""

    sent: tuple[float, ...]
    """Bytes each NIC sends, by global NIC index (`Cluster.nic_of`)."""
    received: tuple[float, ...]
    """Bytes each NIC receives, by global NIC index."""
    dispatch: float
    """The most bytes one rank sends or receives over its node's links handing chunks to proxies
    before the NICs send (0 unrouted): the NICs cannot start before their chunks are there."""
    combine: float
    """The most bytes one rank sends or receives over its node's links handing received chunks
    on from proxies to their destination (0 unrouted)."""

    @property
    def busiest(self) -> float:
        """Bytes of the busiest NIC in its busier direction: the NIC the exchange waits for."""
        return max(self.sent + self.received, default=0.0)

    def time(self, nic_rate: float, link_rate: float) -> float:
        """Seconds of the exchange: dispatch, the busiest NIC's bytes at `nic_rate`, combine at
        `link_rate` (bytes/s), one after the other (each phase needs the previous one's bytes;
        chunked pipelining would overlap them, so this is the conservative price)."""
        seconds = self.busiest / nic_rate if self.busiest else 0.0
        if self.dispatch or self.combine:
            seconds += (self.dispatch + self.combine) / link_rate
        return seconds


def nic_load(transfers: Transfers, cluster: Cluster, spread: int = 1) -> NicLoad:
    """The load of `transfers` with every inter-node transfer spread over `spread` NICs of each
    node: 1 is unrouted, up to `cluster.nics_per_node` routed (chunks of bytes / spread)."""
    if not 1 <= spread <= cluster.nics_per_node:
        raise ValueError(f"cluster {cluster.name!r}: a transfer can be spread over 1 to "
                         f"{cluster.nics_per_node} NICs of a node, not {spread}")
    per_node, world = cluster.nics_per_node, cluster.world_size
    sent, received = [0.0] * cluster.nics, [0.0] * cluster.nics
    dispatch_out, dispatch_in = [0.0] * world, [0.0] * world
    combine_out, combine_in = [0.0] * world, [0.0] * world
    for (source, destination), size in transfers.items():
        assert 0 <= source < world and 0 <= destination < world and size >= 0, (source, destination, size)
        if not size or cluster.node_of(source) == cluster.node_of(destination):
            continue
        chunk = size / spread
        source_node, source_nic = divmod(cluster.nic_of(source), per_node)
        destination_node, destination_nic = divmod(cluster.nic_of(destination), per_node)
        source_proxies, destination_proxies = cluster.proxies(source), cluster.proxies(destination)
        for i in range(spread):
            out_nic, in_nic = (source_nic + i) % per_node, (destination_nic + i) % per_node
            sent[source_node * per_node + out_nic] += chunk
            received[destination_node * per_node + in_nic] += chunk
            proxy = source_proxies[out_nic]
            if proxy != source:
                dispatch_out[source] += chunk
                dispatch_in[proxy] += chunk
            proxy = destination_proxies[in_nic]
            if proxy != destination:
                combine_out[proxy] += chunk
                combine_in[destination] += chunk
    return NicLoad(tuple(sent), tuple(received), max(dispatch_out + dispatch_in), max(combine_out + combine_in))


class EvenExchange(NamedTuple):
    """How an all-to-all in which every rank of whole nodes sends each rank of the other nodes
    alike loads the NICs, per byte a rank sends across."""

    nic_factor: float
    """The busiest NIC's unrouted load over the even share of the node's NICs (1 where every NIC
    serves as many ranks: the load the per-degree bandwidths were measured under)."""
    handoff: float
    """Routed over every NIC of the node (each NIC then carries the even share): the busiest
    rank's dispatch + combine bytes per byte a rank sends across."""


def even_exchange(cluster: Cluster) -> EvenExchange:
    """`EvenExchange` of `cluster`'s NIC layout (the same for any number of nodes and bytes: every
    load is proportional to what a rank sends across; measured on two nodes, one byte a pair)."""
    return _even_exchange(cluster.devices_per_node, tuple(map(tuple, cluster.nic_devices)))


@functools.lru_cache(maxsize=64)
def _even_exchange(per_node: int, layout: tuple[tuple[int, ...], ...]) -> EvenExchange:
    # Loads are proportional to bytes, so unit rates and bandwidths do: only the layout matters.
    bandwidth = {1 << i: 1.0 for i in range(1, (2 * per_node).bit_length())}
    two = Cluster("even exchange", 2, per_node, 1.0, 1.0, bandwidth=bandwidth, nic_bandwidth=1.0,
                  nic_devices=[list(devices) for devices in layout])
    transfers = {(s, t): 1.0 for s in range(2 * per_node) for t in range(2 * per_node)}
    even = per_node * per_node / len(layout)
    routed = nic_load(transfers, two, len(layout))
    assert abs(routed.busiest - even) <= 1e-9 * even, (routed.busiest, even)
    return EvenExchange(nic_load(transfers, two).busiest / even, (routed.dispatch + routed.combine) / per_node)


def link_rate(cost: CostModel) -> float:
    """Bytes/s per rank of an all-to-all over a whole node: what handing chunks to and from
    proxies costs."""
    per_node = cost.network.devices_per_node
    return cost.bandwidth[per_node] if per_node > 1 else float("inf")


def nic_rate(cost: CostModel, size: int) -> float:
    """Bytes/s of one NIC under an all-to-all over `size` ranks: the per-rank bandwidth of the
    widest degree within `size` times the ranks a NIC serves (every rank under a NIC drove it at
    that rate when the bandwidth was measured)."""
    network = cost.network
    degree = max((d for d in cost.bandwidth if d <= size), default=min(cost.bandwidth))
    return cost.bandwidth[degree] * network.devices_per_node / network.nics_per_node


def fastest_move_rate(cost: CostModel, size: int) -> float:
    """The most bytes/s one rank can move off in a remap domain of `size` ranks over two or more
    nodes, however routed: its node's links and every NIC of its node at once. `move_time` never
    prices a rank's bytes faster (its inside part at the link rate, the rest on its node's NICs,
    each at `nic_rate`), so the lower bound may use it."""
    links = cost.bandwidth[cost.network.devices_per_node] if cost.network.devices_per_node > 1 else 0.0
    return links + cost.network.nics_per_node * nic_rate(cost, size)


def crosses_nodes(cost: CostModel, size: int) -> bool:
    """Whether an aligned block of `size` ranks spans nodes whose NICs the cost model knows."""
    return cost.network is not None and size > cost.network.devices_per_node


def cross_bytes(cost: CostModel, degree: int, cp: int, tokens: float) -> tuple[float, float]:
    """(Ulysses, CP) bytes each rank of a group of `degree` split `cp` ways sends to other nodes
    in a micro-batch of `tokens`: the all-to-all's share for ranks of its sub-group of degree / cp
    contiguous ranks beyond the node, and the all-gather's (and its backward reduce-scatter's) for
    the CP peers, ranks a stride of degree / cp apart, in other nodes."""
    per_node, u = cost.network.devices_per_node, degree // cp
    ulysses = cost.exchange_bytes(u) * tokens / degree * (u - per_node) / u if u > per_node else 0.0
    if cp == 1 or degree <= per_node:
        return ulysses, 0.0
    peers_inside = per_node // u - 1 if u < per_node else 0
    gathered = 2.0 * cost.gathered_per_token(degree, cp) * (cp - 1) / cp * tokens
    return ulysses, gathered * (cp - 1 - peers_inside) / (cp - 1)


def exchange_surcharge(cost: CostModel, degree: int, cp: int, tokens: float, routed: bool,
                       recompute: float = 0.0) -> float:
    """Seconds a micro-batch of `tokens` in a group of `degree` (split `cp` ways) at recompute
    level `recompute` (its recomputed layers repeat their forward exchanges, as `CostModel.comm`
    counts them) spends on its exchanges beyond `CostModel.comm`, which prices them at the
    degree's bandwidth: the busiest NIC's excess over the even share on the bytes that cross
    (`cross_bytes`) where the NICs serve unequal numbers of ranks, and, routed, the hand-offs to
    and from proxies instead. The Ulysses all-to-all crosses nodes where its sub-group of
    degree / cp ranks does; the CP all-gathers, never routed, wherever the group does."""
    if not crosses_nodes(cost, degree) or tokens == 0:
        return 0.0
    even, u = even_exchange(cost.network), degree // cp
    if not routed and even.nic_factor == 1.0:  # equal NICs: the degree's bandwidth is the price
        return 0.0
    ulysses, context = cross_bytes(cost, degree, cp, tokens)
    # The busiest NIC's excess prices the bytes that cross, at the rate their exchange was priced at.
    extra = (even.nic_factor - 1.0) * context / cost.bandwidth[degree] if context else 0.0
    if ulysses:
        extra += (even.handoff * ulysses / link_rate(cost) if routed else
                  (even.nic_factor - 1.0) * ulysses / cost.bandwidth[u])
    return extra * recomputed_exchanges(recompute)


def group_nic_bytes(cost: CostModel, start: int, degree: int, cp: int, tokens: float, routed: bool) -> np.ndarray:
    """Bytes each NIC of the cluster sends for a micro-batch of `tokens` in the group of `degree`
    ranks from `start`: every rank's `cross_bytes` through its own NIC, or, routed, the Ulysses
    part spread evenly over its node's NICs."""
    network = cost.network
    sent = np.zeros(network.nics)
    ulysses, context = cross_bytes(cost, degree, cp, tokens)
    per_node, n = network.devices_per_node, network.nics_per_node
    served = np.array([len(devices) for devices in network.nic_devices], dtype=float)
    for node in range(start // per_node, (start + degree) // per_node):
        sent[node * n:(node + 1) * n] += served * context + (per_node / n if routed else served) * ulysses
    return sent


def move_transfers(tokens: Sequence[float], start: int, bytes_per_token: float) -> dict[tuple[int, int], float]:
    """The bytes each rank pair moves when ranks start, start + 1, ... holding `tokens` (in rank
    order, one contiguous order of rows) re-partition them into equal contiguous shares, as a
    remap domain does (`runtime.remap.overlaps`)."""
    mean = sum(tokens) / len(tokens)
    held = list(itertools.accumulate(tokens, initial=0.0))
    transfers = {}
    for s in range(len(tokens)):
        first, last = int(held[s] // mean) if mean else 0, min(len(tokens) - 1, int(held[s + 1] // mean) if mean else 0)
        for t in range(first, last + 1):
            common = min(held[s + 1], (t + 1) * mean) - max(held[s], t * mean)
            if common > 0 and s != t:
                transfers[(start + s, start + t)] = common * bytes_per_token
    return transfers


def move_load(cost: CostModel, tokens: Sequence[float], start: int, routed: bool) -> NicLoad:
    """The NIC load of a remap domain's token move over ranks start .. start + len(tokens) - 1
    holding `tokens` each (`move_transfers`), routed over every NIC of the node or not."""
    return _loaded(cost, move_transfers(tokens, start, cost.bytes_per_token), routed)


def _loaded(cost: CostModel, transfers: Transfers, routed: bool) -> NicLoad:
    return nic_load(transfers, cost.network, cost.network.nics_per_node if routed else 1)


def move_time(cost: CostModel, tokens: Sequence[float], start: int, routed: bool) -> float:
    """Seconds of a remap domain's token move over ranks start .. start + len(tokens) - 1, two or
    more whole nodes, holding `tokens` each: the busiest NIC (routed: over every NIC of the node,
    with the hand-offs) or the busiest rank's bytes inside its node, whichever is longer."""
    network, size = cost.network, len(tokens)
    transfers = move_transfers(tokens, start, cost.bytes_per_token)
    load = _loaded(cost, transfers, routed)
    inside = [0.0] * (2 * size)
    for (s, t), size_bytes in transfers.items():
        if network.node_of(s) == network.node_of(t):
            inside[s - start] += size_bytes
            inside[size + t - start] += size_bytes
    links = link_rate(cost)
    return max(max(inside) / links, load.time(nic_rate(cost, size), links))
