"""NIC loads of a wave's exchange, unrouted and routed (ballast/nics.py), against hand-computed values."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.vocabulary.cluster import Cluster, get_cluster
from ballast.pricing.nics import NicLoad, nic_load
from ballast.pricing.cost_sources import analytic_cost

GB = 1e9
A800_NVLINK_ALL_TO_ALL = 96.5 / 300 * 200 * GB    # bandwidth[8] of an A800 node (tests/vocabulary/test_cluster.py)
A800 = (25 * GB, A800_NVLINK_ALL_TO_ALL)           # (NIC, link) rates at the cards' own figures


def test_one_rank_to_the_next_node_on_a800():
    a800 = get_cluster("a800-16")
    transfers = {(0, 8): 8 * GB}
    # Unrouted: rank 0's NIC sends all 8 GB, rank 8's NIC receives them.
    assert nic_load(transfers, a800) == NicLoad((8 * GB,) + (0.0,) * 7, (0.0,) * 4 + (8 * GB,) + (0.0,) * 3, 0, 0)
    assert nic_load(transfers, a800).time(*A800) == pytest.approx(8 * GB / (25 * GB))
    # Routed over the 4 NICs: 2 GB on each, both sides. Rank 0 hands 3 chunks to its proxies 2, 4
    # and 6 over NVLink, rank 8 takes 3 chunks from 10, 12 and 14: 6 GB each way.
    routed = nic_load(transfers, a800, 4)
    assert routed == NicLoad((2 * GB,) * 4 + (0.0,) * 4, (0.0,) * 4 + (2 * GB,) * 4, 6 * GB, 6 * GB)
    assert routed.time(*A800) == pytest.approx(2 * GB / (25 * GB) + 12 * GB / A800_NVLINK_ALL_TO_ALL)
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
    assert routed.time(*A800) > unrouted.time(*A800) == pytest.approx(2 * GB / (25 * GB))


def test_the_cpu_two_node_emulation():
    cpu = get_cluster("cpu", world_size=4, nodes=2)
    # Rank 1 (NIC 1) to rank 2 (NIC 2), 1 GB over both NICs: chunk 0 leaves NIC 1 and enters
    # NIC 2 (both ranks' own); chunk 1 goes 1 -> 0, leaves NIC 0, enters NIC 3 and goes 3 -> 2.
    routed = nic_load({(1, 2): 1 * GB}, cpu, 2)
    assert routed == NicLoad((0.5 * GB, 0.5 * GB, 0.0, 0.0), (0.0, 0.0, 0.5 * GB, 0.5 * GB), 0.5 * GB, 0.5 * GB)
    # gloo's links inside a node are no faster than its "NICs": routing costs more than it saves.
    assert routed.time(0.7 * GB, 0.7 * GB) == pytest.approx((0.5 + 1.0) / 0.7)
    assert nic_load({(1, 2): 1 * GB}, cpu).time(0.7 * GB, 0.7 * GB) == pytest.approx(1 / 0.7)


def test_transfers_inside_a_node_touch_no_nic():
    h100 = get_cluster("h100-16")
    transfers = {(0, 7): 5 * GB, (9, 8): 1 * GB, (3, 3): 2 * GB, (4, 12): 0.0}
    for spread in (1, 8):
        assert nic_load(transfers, h100, spread) == NicLoad((0.0,) * 16, (0.0,) * 16, 0.0, 0.0)
    assert nic_load({}, get_cluster("cpu")).time(1.0, 1.0) == 0


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


@settings(max_examples=200, database=None, derandomize=True)
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


# --- pricing: what the timeline asks ----------------------------------------------------------
def _cost(cluster):
    from ballast.vocabulary.model_shape import get_model_shape
    return analytic_cost(get_model_shape("tiny"), cluster)


def test_an_even_exchange_loads_equal_nics_evenly_and_routing_only_adds_hand_offs():
    from ballast.pricing.nics import EvenExchange, even_exchange
    # a800: two ranks per NIC. Each rank sends 8 bytes across (1 to each rank of the other node).
    # Routed over 4 NICs, rank 0 hands 6 of them to proxies 2, 4 and 6 and, as the proxy under NIC
    # 0 of ranks 2, 4 and 6, takes 2 from each: 6 bytes; the far side's combine likewise.
    assert even_exchange(get_cluster("a800-16")) == EvenExchange(1.0, 12 / 8)
    # Device 0 alone under NIC 0, devices 1-3 under NIC 1: NIC 1 carries 3 ranks' 4 bytes, the
    # even share of 2 NICs is 16 / 2.
    uneven = Cluster("u", 2, 4, 1e10, 1e14, 0.5, {2: 1e11, 4: 1e11, 8: 1e10}, nic_devices=[[0], [1, 2, 3]])
    assert even_exchange(uneven).nic_factor == pytest.approx(12 / 8)


def test_the_surcharge_is_nothing_on_equal_nics_unrouted_and_the_hand_offs_routed():
    from ballast.pricing.nics import exchange_surcharge, link_rate
    cost = _cost(get_cluster("cpu", world_size=4, nodes=2))
    tokens = 1000.0
    assert exchange_surcharge(cost, 2, 1, tokens, routed=True) == 0      # inside a node
    assert exchange_surcharge(cost, 4, 1, tokens, routed=False) == 0     # one rank per NIC: even
    # Routed over 2 NICs, 2 ranks per node: each rank sends payload / 2 across, hands half of it
    # to its node's other rank and takes as much from it, and the far side combines as much.
    payload = cost.exchange_bytes(4) * tokens / 4
    assert exchange_surcharge(cost, 4, 1, tokens, routed=True) == pytest.approx(
        (payload / 4 + payload / 4) / link_rate(cost))
    # A 2 x 2 split keeps its Ulysses pairs inside the nodes: nothing to route.
    assert exchange_surcharge(cost, 4, 2, tokens, routed=True) == 0


def test_a_remap_move_over_two_nodes_by_hand():
    from ballast.pricing.nics import move_time, move_transfers
    cost = _cost(get_cluster("cpu", world_size=4, nodes=2))
    bpt, rate = cost.bytes_per_token, 0.7 * GB
    # Rank 0 holds 4 tokens, the others none: it keeps 1 and sends 1 to each other rank.
    assert move_transfers([4, 0, 0, 0], 0, bpt) == {(0, 1): bpt, (0, 2): bpt, (0, 3): bpt}
    # Unrouted its NIC carries 2 tokens' bytes (the per-rank rate of the old price would charge 3).
    assert move_time(cost, [4, 0, 0, 0], 0, routed=False) == pytest.approx(2 * bpt / rate)
    # Routed: 1 token's bytes on each NIC, after rank 0 hands 1 to rank 1 and before ranks 2 and 3
    # hand each other half a token: gloo's links are no faster than its NICs, so it does not pay.
    assert move_time(cost, [4, 0, 0, 0], 0, routed=True) == pytest.approx((1 + 1 + 0.5) * bpt / rate)


@settings(max_examples=100, database=None, derandomize=True)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=8).filter(lambda t: sum(t) % len(t) == 0))
def test_move_transfers_are_the_runtime_overlaps(tokens):
    from ballast.pricing.nics import move_transfers
    from ballast.runtime.remap import overlaps
    n, share = len(tokens), sum(tokens) // len(tokens)
    expected = {(s, t): float(rows) for s in range(n)
                for t, rows in enumerate(overlaps(tokens, [share] * n, s)[0]) if rows and s != t}
    assert move_transfers(tokens, 0, 1.0) == pytest.approx(expected)


def test_unequal_nics_surcharge_the_bytes_that_cross():
    from ballast.pricing.nics import exchange_surcharge
    # Device 0 alone under NIC 0, devices 1-3 under NIC 1: the busiest NIC carries 1.5x the even
    # share of a degree-8 all-to-all (two nodes of 4), so the bytes each rank sends across -- half
    # its payload -- cost half again their time at bandwidth[8].
    uneven = Cluster("u", 2, 4, 1e10, 1e14, 0.5, {2: 1e11, 4: 1e11, 8: 1e10}, nic_devices=[[0], [1, 2, 3]])
    cost = _cost(uneven)
    payload = cost.exchange_bytes(8) * 800 / 8
    assert exchange_surcharge(cost, 8, 1, 800.0, routed=False) == pytest.approx(0.5 * (payload / 2) / 1e10, rel=1e-12)
    # recomputed layers repeat their forward exchanges, and with them the NIC excess: level 1 -> x 1.5
    assert exchange_surcharge(cost, 8, 1, 800.0, routed=False, recompute=1.0) == pytest.approx(
        1.5 * 0.5 * (payload / 2) / 1e10, rel=1e-12)
