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

The time of a wave's exchange is its busiest NIC's bytes / NIC bandwidth (NICs are full duplex:
bytes out and in count apart), plus for a routed exchange the busiest rank's dispatch and
combine bytes / the node's all-to-all bandwidth (`Cluster.intra_node_bandwidth`). Transfers
inside a node never touch a NIC and are not priced here: the cost model prices them already.
Pure functions of the transfers and the `Cluster`; docs/design.md, section 4, has the formulas.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .cluster import Cluster

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

    def time(self, cluster: Cluster) -> float:
        """Seconds of the exchange: dispatch, the busiest NIC's bytes, combine, one after the
        other (each phase needs the previous one's bytes; chunked pipelining would overlap them,
        so this is the conservative price)."""
        seconds = self.busiest / cluster.nic_bandwidth if self.busiest else 0.0
        if self.dispatch or self.combine:
            seconds += (self.dispatch + self.combine) / cluster.intra_node_bandwidth
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


def exchange_time(transfers: Transfers, cluster: Cluster, spread: int = 1) -> float:
    """Seconds the NICs (and, routed, the dispatch and combine) take for `transfers`."""
    return nic_load(transfers, cluster, spread).time(cluster)


def routing_pays(transfers: Transfers, cluster: Cluster, spread: int | None = None) -> bool:
    """Whether spreading the wave's inter-node transfers over `spread` NICs of each node (all of
    them unless given) ends its exchange sooner than sending each through its own NIC. It does not
    when the proxies' NICs are already as busy with their own ranks' traffic: the busiest NIC
    carries as much either way and dispatch and combine come on top."""
    spread = cluster.nics_per_node if spread is None else spread
    return spread > 1 and exchange_time(transfers, cluster, spread) < exchange_time(transfers, cluster)
