"""NIC loads of a wave's exchange, unrouted and routed (ballast/nics.py), against hand-computed values."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.cluster import Cluster, get_cluster
from ballast.nics import NicLoad, exchange_time, nic_load, routing_pays

GB = 1e9
A800_NVLINK_ALL_TO_ALL = 96.5 / 300 * 200 * GB    # bandwidth[8] of an A800 node (tests/core/test_cluster.py)


def test_one_rank_to_the_next_node_on_a800():
    a800 = get_cluster("a800-16")
    transfers = {(0, 8): 8 * GB}
    # Unrouted: rank 0's NIC sends all 8 GB, rank 8's NIC receives them.
    assert nic_load(transfers, a800) == NicLoad((8 * GB,) + (0.0,) * 7, (0.0,) * 4 + (8 * GB,) + (0.0,) * 3, 0, 0)
    assert exchange_time(transfers, a800) == pytest.approx(8 * GB / (25 * GB))
    # Routed over the 4 NICs: 2 GB on each, both sides. Rank 0 hands 3 chunks to its proxies 2, 4
    # and 6 over NVLink, rank 8 takes 3 chunks from 10, 12 and 14: 6 GB each way.
    routed = nic_load(transfers, a800, 4)
    assert routed == NicLoad((2 * GB,) * 4 + (0.0,) * 4, (0.0,) * 4 + (2 * GB,) * 4, 6 * GB, 6 * GB)
    assert routed.time(a800) == pytest.approx(2 * GB / (25 * GB) + 12 * GB / A800_NVLINK_ALL_TO_ALL)
    assert routing_pays(transfers, a800)
    # Over 2 NICs: rank 0's and rank 2's (NICs 0 and 1), entering NICs 4 and 5.
    half = nic_load(transfers, a800, 2)
    assert (half.sent[:2], half.received[4:6], half.dispatch, half.combine) == ((4 * GB,) * 2, (4 * GB,) * 2,
                                                                                4 * GB, 4 * GB)


def test_routing_does_not_pay_when_every_nic_is_busy():
    # Every rank of node 0 sends 1 GB to its peer on node 1: each NIC already carries 2 GB, and
    # routing moves the same 2 GB per NIC after a dispatch and before a combine.
    a800 = get_cluster("a800-16")
    transfers = {(r, r + 8): 1 * GB for r in range(8)}
    unrouted, routed = nic_load(transfers, a800), nic_load(transfers, a800, 4)
    assert unrouted.sent == routed.sent == (2 * GB,) * 4 + (0.0,) * 4
    assert unrouted.received == routed.received == (0.0,) * 4 + (2 * GB,) * 4
    # Rank 0 hands 3 chunks of 0.25 GB away; rank 2 takes one from each of ranks 0, 4 and 6.
    assert (routed.dispatch, routed.combine) == (0.75 * GB, 0.75 * GB)
    assert routed.time(a800) > unrouted.time(a800) == pytest.approx(2 * GB / (25 * GB))
    assert not routing_pays(transfers, a800)


def test_the_cpu_two_node_emulation():
    cpu = get_cluster("cpu", world_size=4, nodes=2)
    # Rank 1 (NIC 1) to rank 2 (NIC 2), 1 GB over both NICs: chunk 0 leaves NIC 1 and enters
    # NIC 2 (both ranks' own); chunk 1 goes 1 -> 0, leaves NIC 0, enters NIC 3 and goes 3 -> 2.
    routed = nic_load({(1, 2): 1 * GB}, cpu, 2)
    assert routed == NicLoad((0.5 * GB, 0.5 * GB, 0.0, 0.0), (0.0, 0.0, 0.5 * GB, 0.5 * GB), 0.5 * GB, 0.5 * GB)
    # gloo's links inside a node are no faster than its "NICs": routing costs more than it saves.
    assert routed.time(cpu) == pytest.approx((0.5 + 1.0) / 0.7)
    assert exchange_time({(1, 2): 1 * GB}, cpu) == pytest.approx(1 / 0.7)
    assert not routing_pays({(1, 2): 1 * GB}, cpu)


def test_transfers_inside_a_node_touch_no_nic():
    h100 = get_cluster("h100-16")
    transfers = {(0, 7): 5 * GB, (9, 8): 1 * GB, (3, 3): 2 * GB, (4, 12): 0.0}
    for spread in (1, 8):
        assert nic_load(transfers, h100, spread) == NicLoad((0.0,) * 16, (0.0,) * 16, 0.0, 0.0)
    assert exchange_time(transfers, h100) == 0 and not routing_pays(transfers, h100)
    assert nic_load({}, get_cluster("cpu")).time(get_cluster("cpu")) == 0


@pytest.mark.parametrize("spread", [0, 5])
def test_spread_beyond_the_nics_of_a_node(spread):
    with pytest.raises(ValueError, match=f"'a800-16': a transfer can be spread over 1 to 4 NICs of a node, not {spread}"):
        nic_load({(0, 8): GB}, get_cluster("a800-16"), spread)


@st.composite
def waves(draw):
    """A small cluster (NICs in equal blocks or an uneven list), a wave's transfers, a spread."""
    nodes, per_node = draw(st.sampled_from([2, 3])), draw(st.sampled_from([2, 4, 8]))
    layout = draw(st.sampled_from(["blocks", "uneven"]))
    if layout == "blocks":
        nics = draw(st.sampled_from([n for n in (1, 2, 4, 8) if per_node % n == 0]))
        topology = {"nics_per_node": nics}
    else:      # device 0 alone under NIC 0, the rest under NIC 1
        topology = {"nic_devices": [[0], list(range(1, per_node))]}
    world = nodes * per_node
    bandwidth = {1 << i: 1e11 if 1 << i <= per_node else 1e10 for i in range(1, world.bit_length())}
    cluster = Cluster("t", nodes, per_node, 1e10, 1e14, 0.5, bandwidth, nic_bandwidth=2.5e10, **topology)
    pairs = st.tuples(st.integers(0, world - 1), st.integers(0, world - 1))
    transfers = draw(st.dictionaries(pairs, st.floats(0, 1e10), max_size=12))
    return cluster, transfers, draw(st.integers(1, cluster.nics_per_node))


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(waves())
def test_routing_moves_the_same_bytes_and_never_loads_the_busiest_nic_more(wave):
    cluster, transfers, spread = wave
    unrouted, routed = nic_load(transfers, cluster), nic_load(transfers, cluster, spread)
    n = cluster.nics_per_node
    for node in range(cluster.nodes):
        # Brute force: a node's NICs send what its ranks send to other nodes, and receive likewise.
        out = sum(b for (s, d), b in transfers.items() if cluster.node_of(s) == node != cluster.node_of(d))
        into = sum(b for (s, d), b in transfers.items() if cluster.node_of(d) == node != cluster.node_of(s))
        nics = slice(node * n, (node + 1) * n)
        for load in (unrouted, routed):
            assert sum(load.sent[nics]) == pytest.approx(out, rel=1e-9, abs=1e-3)
            assert sum(load.received[nics]) == pytest.approx(into, rel=1e-9, abs=1e-3)
        # Each NIC carries the mean of `spread` NICs' unrouted loads: itself and the ones before it.
        for direction in ("sent", "received"):
            before, after = getattr(unrouted, direction)[nics], getattr(routed, direction)[nics]
            for i in range(n):
                window = sum(before[(i - j) % n] for j in range(spread)) / spread
                assert after[i] == pytest.approx(window, rel=1e-9, abs=1e-3)
    assert routed.busiest <= unrouted.busiest * (1 + 1e-9) + 1e-3
    assert (unrouted.dispatch, unrouted.combine) == (0, 0)
    assert routing_pays(transfers, cluster, spread) == (routed.time(cluster) < unrouted.time(cluster))
