"""The routed exchange (Zeppelin's routing layer): its plan run on lists against a brute-force
simulation of each row's path, and on 4 gloo ranks declared as 2 nodes x 2 ranks (1 and 2 NICs
per node) and 4 nodes x 1 rank against the unrouted `Route`, forward and backward, bit for bit."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from ballast.runtime import ProcessGroups, run_local
from ballast.runtime.all_to_all import all_to_all
from ballast.runtime.remap import Route
from ballast.runtime.routing import NodeLayout, RoutedExchange, RoutingGroups, SpanGroups, plan

pytestmark = pytest.mark.usefixtures("single_thread")


def test_default_nics_serve_contiguous_blocks_of_local_ranks():
    assert NodeLayout(8, 4).nic_of == (0, 0, 1, 1, 2, 2, 3, 3)
    assert NodeLayout(3, 2).nic_of == (0, 0, 1)
    assert NodeLayout(2, 1).under == ((0, 1),)
    # Under NIC p, a rank's proxy sits at its own position among its NIC's ranks.
    layout = NodeLayout(8, 4)
    assert [layout.proxy(p, 3) for p in range(4)] == [1, 3, 5, 7]
    assert [NodeLayout(3, 2).proxy(p, 1) for p in range(2)] == [1, 2]  # position 1 mod 1 rank


@pytest.mark.parametrize("args, match", [((2, 3), "a NIC would serve no rank"), ((0, 1), "at least one rank"),
                                         ((2, 2, (0, 0)), "each NIC at least once"),
                                         ((2, 1, (0,)), "for each of the 2 ranks")])
def test_bad_node_layouts(args, match):
    with pytest.raises(ValueError, match=match):
        NodeLayout(*args)


def test_a_route_inside_one_node_is_not_routed():
    with pytest.raises(ValueError, match="two or more whole nodes of 2 ranks, not 2 ranks"):
        plan([[0, 1], [1, 0]], NodeLayout(2, 1), 0)


def _simulate(matrix, layout):
    """Brute force: each row (source, destination, row) walks its path from the routing rule;
    the rows each rank sends each rank in each of the three phases."""
    r, k, size = layout.ranks_per_node, layout.nics_per_node, len(matrix)
    messages = [Counter() for _ in range(3)]
    for s in range(size):
        for t in range(size):
            n = matrix[s][t]
            for row in range(n):
                label = (s, t, row)
                if s // r == t // r:
                    messages[0][s, t, label] += 1
                    continue
                # Chunk p holds n // k rows, one more for the first n % k chunks.
                chunk = next(p for p in range(k) if row < sum(n // k + (q < n % k) for q in range(p + 1)))
                nic_ranks = [i for i in range(r) if layout.nic_of[i] == chunk]
                own = [i for i in range(r) if layout.nic_of[i] == layout.nic_of[s % r]]
                proxy = nic_ranks[own.index(s % r) % len(nic_ranks)]
                near, far = s // r * r + proxy, t // r * r + proxy
                messages[0][s, near, label] += 1
                messages[1][near, far, label] += 1
                messages[2][far, t, label] += 1
    return messages


def _execute(matrix, layout):
    """Every rank's plan run on lists of row labels: each phase's all-to-all delivered by hand
    within the node groups (phases 1, 3) and the rails (phase 2); the outputs and the rows each
    rank sent each rank in each phase."""
    r, size = layout.ranks_per_node, len(matrix)
    plans = [plan(matrix, layout, i) for i in range(size)]
    buffers = [[[(s, t, row) for t in range(size) for row in range(matrix[s][t])]] for s in range(size)]
    nodes = [[n * r + i for i in range(r)] for n in range(size // r)]
    rails = [[n * r + i for n in range(size // r)] for i in range(r)]
    messages = [Counter() for _ in range(3)]

    def take(rank, spans):
        return [label for b, lo, hi in spans for label in buffers[rank][b][lo:hi]]

    for b, groups in enumerate((nodes, rails, nodes)):
        received = {}
        for group in groups:
            pieces = {}
            for sender in group:
                phase = plans[sender].phases[b]
                sent = take(sender, phase.take)
                assert len(sent) == sum(phase.send) and len(phase.send) == len(group)
                cuts = [sum(phase.send[:j]) for j in range(len(group) + 1)]
                pieces[sender] = [sent[cuts[j]:cuts[j + 1]] for j in range(len(group))]
            for j, receiver in enumerate(group):
                assert [len(pieces[sender][j]) for sender in group] == list(plans[receiver].phases[b].recv)
                received[receiver] = [label for sender in group for label in pieces[sender][j]]
                for sender in group:
                    messages[b].update((sender, receiver, label) for label in pieces[sender][j])
        for rank in range(size):
            buffers[rank].append(received[rank])
    return [take(rank, plans[rank].output) for rank in range(size)], messages


@st.composite
def _exchanges(draw):
    nodes, r = draw(st.integers(2, 4)), draw(st.integers(1, 4))
    k = draw(st.integers(1, r))
    if draw(st.booleans()):  # any NIC assignment that leaves no NIC idle
        nic_of = draw(st.permutations(list(range(k)) + draw(st.lists(st.integers(0, k - 1), min_size=r - k,
                                                                     max_size=r - k))))
        layout = NodeLayout(r, k, tuple(nic_of))
    else:
        layout = NodeLayout(r, k)
    size = nodes * r
    matrix = [[draw(st.sampled_from([0, 0, 1, 2, 3, 5, 9])) for _ in range(size)] for _ in range(size)]
    for empty in draw(st.sets(st.integers(0, size - 1), max_size=2)):  # ranks that send and receive nothing
        for other in range(size):
            matrix[empty][other] = matrix[other][empty] = 0
    return matrix, layout


@given(_exchanges())
def test_the_plan_moves_every_row_along_its_route_to_the_unrouted_exchanges_place(exchange):
    matrix, layout = exchange
    outputs, messages = _execute(matrix, layout)
    size = len(matrix)
    for t in range(size):  # Route's output: from each source in rank order, its rows in order
        assert outputs[t] == [(s, t, row) for s in range(size) for row in range(matrix[s][t])]
    assert messages == _simulate(matrix, layout)


def test_the_reverse_exchange_routes_the_transposed_matrix():
    matrix = ((0, 3, 5, 1), (2, 0, 0, 7), (4, 4, 0, 0), (1, 0, 6, 2))
    forward = RoutedExchange(SpanGroups(NodeLayout(2, 2), 4, 1, None, None), matrix)
    backward = forward.reversed()
    assert backward.matrix == ((0, 2, 4, 1), (3, 0, 4, 0), (5, 0, 0, 6), (1, 7, 0, 2))
    assert forward.recv == (3, 0, 4, 0) and backward.recv == matrix[1]
    assert backward.reversed().plan == forward.plan
    with pytest.raises(ValueError, match="over 4 ranks needs a 4 x 4 matrix of rows, got \\[4, 4, 4\\]"):
        RoutedExchange(forward.groups, matrix[:3])


# The gloo world: 4 ranks as 2 nodes x 2 ranks (2 NICs and 1 per node) and 4 nodes x 1 rank,
# whose blocks of 2 nodes are spans of their own.
LAYOUTS = [(2, 2), (2, 1), (1, 1)]
SHAPES = [(), (3,), (2, 5)]
SEEDS = range(4)


def _matrix(seed, size):
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.randint(0, 6, (size, size), generator=generator)
    matrix *= torch.rand(size, size, generator=generator) < 0.7  # zeros
    if seed % 2:  # an empty rank
        matrix[seed % size] = 0
        matrix[:, seed % size] = 0
    return matrix.tolist()


def _payload(seed, rank, rows, shape, tag):
    return torch.randn(rows, *shape, generator=torch.Generator().manual_seed(seed * 1000 + rank * 10 + tag))


def _spans(ranks_per_node):
    rank = dist.get_rank() if dist.is_initialized() else 0
    return [(0, 4)] if ranks_per_node == 2 else [(0, 4), (rank // 2 * 2, 2)]


def _worker():
    torch.set_num_threads(1)
    blocks, results = ProcessGroups(), []
    for r, k in LAYOUTS:
        groups = RoutingGroups(NodeLayout(r, k))
        for start, size in _spans(r):
            index = dist.get_rank() - start
            for seed in SEEDS:
                matrix = _matrix(seed, size)
                route = Route(blocks.get(start, size), tuple(matrix[index]), tuple(row[index] for row in matrix))
                routed = RoutedExchange(groups.get(start, size), tuple(map(tuple, matrix)))
                gathered = RoutedExchange.gather(route, groups).matrix
                for shape in SHAPES:
                    x = _payload(seed, index, sum(route.send), shape, 0)
                    grad_out = _payload(seed, index, sum(route.recv), shape, 1)
                    runs = []
                    for exchange in (route, routed):
                        leaf = x.clone().requires_grad_()
                        y = all_to_all(leaf, exchange)
                        (y * grad_out).sum().backward()
                        runs.append((y.detach(), leaf.grad))
                    results.append(((r, k), start, size, index, seed, shape, gathered, runs))
    return results


def _by_hand(matrix, seed, shape, index):
    """Rank `index`'s output: each source's rows for it, in source order; and its gradient: each
    destination's output gradient at the rows this rank sent it."""
    size = len(matrix)
    sent = [_payload(seed, s, sum(matrix[s]), shape, 0) for s in range(size)]
    grads = [_payload(seed, t, sum(row[t] for row in matrix), shape, 1) for t in range(size)]
    output = [sent[s][sum(matrix[s][:index]):][:matrix[s][index]] for s in range(size)]
    grad = [grads[t][sum(row[t] for row in matrix[:index]):][:matrix[index][t]] for t in range(size)]
    return torch.cat(output), torch.cat(grad)


@pytest.mark.slow
def test_routed_exchange_on_4_gloo_ranks_equals_the_unrouted_one_forward_and_backward():
    checked, empty = Counter(), 0
    for results in run_local(4, _worker, timeout=240):
        for layout, start, size, index, seed, shape, gathered, runs in results:
            matrix = _matrix(seed, size)
            assert [list(row) for row in gathered] == matrix
            expected, grad = _by_hand(matrix, seed, shape, index)
            (route_out, route_grad), (routed_out, routed_grad) = runs
            assert torch.equal(route_out, expected) and torch.equal(route_grad, grad)
            assert torch.equal(routed_out, route_out) and torch.equal(routed_grad, route_grad)
            checked[layout, start, size] += 1
            empty += routed_out.shape[0] == routed_grad.shape[0] == 0
    assert empty > 0  # the odd seeds' empty rank took part in every phase and got nothing
    assert sorted(checked) == [((1, 1), 0, 2), ((1, 1), 0, 4), ((1, 1), 2, 2), ((2, 1), 0, 4), ((2, 2), 0, 4)]
    assert all(n == len(SEEDS) * len(SHAPES) * (2 if key[2] == 2 else 4) for key, n in checked.items())
