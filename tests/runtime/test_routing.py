"""The routed exchange (Zeppelin's routing layer): its plan run on lists against a brute-force
simulation of each row's path, and on 4 gloo ranks declared as 2 nodes x 2 ranks (1 and 2 NICs
per node) and 4 nodes x 1 rank against the unrouted `Route`, forward and backward, bit for bit;
in the same spawn, the executor's routed waves (remap slots, Ulysses exchanges and 2D video
layout switches over both nodes) against the same waves unrouted, bit for bit, and one process."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from runtime_cases import LENGTHS, clip_batch, load_params, make_batches, perturbed_params

from ballast import verify
from ballast.vocabulary.cluster import Cluster, get_cluster
from ballast.vocabulary.model_shape import MODEL_PRESETS
from ballast.models import build_model
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import ProcessGroups, parallelize, run_local
from ballast.runtime.all_to_all import all_to_all
from ballast.runtime.remap import Route
from ballast.runtime.routing import NodeNics, RoutedExchange, SpanGroups, plan, routing_groups
from ballast.verify.command import routed as _routed

pytestmark = pytest.mark.usefixtures("single_thread")


def _cluster(nics: int | None = None, nic_devices: list[list[int]] | None = None, nodes: int = 2) -> Cluster:
    """The cpu cluster of 4 ranks as `nodes` nodes, with these NICs (default: one per rank)."""
    return dataclasses.replace(get_cluster("cpu", world_size=4, nodes=nodes), nics_per_node=nics,
                               nic_devices=nic_devices)


def test_the_node_nics_are_the_clusters_and_proxies_as_the_cluster_prices():
    a800 = get_cluster("a800-16")  # 8 GPUs under 4 NICs, contiguous pairs
    nics = NodeNics.of(a800)
    assert nics == NodeNics(8, ((0, 1), (2, 3), (4, 5), (6, 7)))
    # Under NIC p, a rank's proxy sits at its own position among its NIC's ranks.
    assert [nics.proxy(p, 3) for p in range(4)] == [1, 3, 5, 7]
    odd = dataclasses.replace(a800, nics_per_node=None, nic_devices=[[0, 5, 6], [1, 2, 3, 4, 7]])
    for cluster in (a800, odd):
        nics = NodeNics.of(cluster)
        assert all([nics.proxy(p, local) for p in range(cluster.nics_per_node)] == cluster.proxies(local)
                   for local in range(8))
    assert [NodeNics.of(odd).proxy(0, local) for local in (1, 3, 7)] == [0, 6, 5]  # positions 0, 2, 4 mod 3


def test_a_route_inside_one_node_is_not_routed():
    with pytest.raises(ValueError, match="two or more whole nodes of 2 ranks, not 2 ranks"):
        plan([[0, 1], [1, 0]], NodeNics(2, ((0, 1),)), 0)


def _simulate(matrix, nics):
    """Brute force: each row (source, destination, row) walks its path from the routing rule;
    the rows each rank sends each rank in each of the three phases."""
    r, k, size = nics.ranks_per_node, nics.nics_per_node, len(matrix)
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
                own = next(ranks for ranks in nics.nic_devices if s % r in ranks)
                proxy = nics.nic_devices[chunk][own.index(s % r) % len(nics.nic_devices[chunk])]
                near, far = s // r * r + proxy, t // r * r + proxy
                messages[0][s, near, label] += 1
                messages[1][near, far, label] += 1
                messages[2][far, t, label] += 1
    return messages


def _execute(matrix, nics):
    """Every rank's plan run on lists of row labels: each phase's all-to-all delivered by hand
    within the node groups (phases 1, 3) and the rails (phase 2); the outputs and the rows each
    rank sent each rank in each phase."""
    r, size = nics.ranks_per_node, len(matrix)
    plans = [plan(matrix, nics, i) for i in range(size)]
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
    # Any NIC assignment that leaves no NIC idle (the Cluster refuses the others).
    nic_of = draw(st.permutations(list(range(k)) + draw(st.lists(st.integers(0, k - 1), min_size=r - k,
                                                                 max_size=r - k))))
    nics = NodeNics(r, tuple(tuple(i for i in range(r) if nic_of[i] == p) for p in range(k)))
    size = nodes * r
    matrix = [[draw(st.sampled_from([0, 0, 1, 2, 3, 5, 9])) for _ in range(size)] for _ in range(size)]
    for empty in draw(st.sets(st.integers(0, size - 1), max_size=2)):  # ranks that send and receive nothing
        for other in range(size):
            matrix[empty][other] = matrix[other][empty] = 0
    return matrix, nics


@given(_exchanges())
def test_the_plan_moves_every_row_along_its_route_to_the_unrouted_exchanges_place(exchange):
    matrix, nics = exchange
    outputs, messages = _execute(matrix, nics)
    size = len(matrix)
    for t in range(size):  # Route's output: from each source in rank order, its rows in order
        assert outputs[t] == [(s, t, row) for s in range(size) for row in range(matrix[s][t])]
    assert messages == _simulate(matrix, nics)


def test_the_reverse_exchange_routes_the_transposed_matrix():
    matrix = ((0, 3, 5, 1), (2, 0, 0, 7), (4, 4, 0, 0), (1, 0, 6, 2))
    forward = RoutedExchange(SpanGroups(NodeNics.of(_cluster()), 4, 1, None, None), matrix)
    backward = forward.reversed()
    assert backward.matrix == ((0, 2, 4, 1), (3, 0, 4, 0), (5, 0, 0, 6), (1, 7, 0, 2))
    assert forward.recv == (3, 0, 4, 0) and backward.recv == matrix[1]
    assert backward.reversed().plan == forward.plan
    with pytest.raises(ValueError, match="over 4 ranks needs a 4 x 4 matrix of rows, got \\[4, 4, 4\\]"):
        RoutedExchange(forward.groups, matrix[:3])


# The gloo world: 4 ranks as 2 nodes x 2 ranks (2 NICs and 1 per node) and 4 nodes x 1 rank,
# whose blocks of 2 nodes are spans of their own.
CLUSTERS = [_cluster(), _cluster(nics=1), _cluster(nodes=4)]
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


def _worker(text: verify.VerifyBatch, clips: verify.VerifyBatch) -> dict:
    torch.set_num_threads(1)
    blocks, results, routings = ProcessGroups(), [], []
    for cluster in CLUSTERS:
        groups = routing_groups(cluster)
        routings.append(groups)
        r, k = groups.nics.ranks_per_node, groups.nics.nics_per_node
        for start, size in _spans(r):
            index = dist.get_rank() - start
            for seed in SEEDS:
                matrix = _matrix(seed, size)
                route = Route(blocks.get(start, size), tuple(matrix[index]), tuple(row[index] for row in matrix))
                routed = RoutedExchange(groups.get(start, size), tuple(map(tuple, matrix)))
                for shape in SHAPES:
                    x = _payload(seed, index, sum(route.send), shape, 0)
                    grad_out = _payload(seed, index, sum(route.recv), shape, 1)
                    runs = []
                    for exchange in (route, routed):
                        leaf = x.clone().requires_grad_()
                        y = all_to_all(leaf, exchange)
                        (y * grad_out).sum().backward()
                        runs.append((y.detach(), leaf.grad))
                    results.append(((r, k), start, size, index, seed, shape, runs))
    # The executor on CLUSTERS[0], 2 nodes of 2 ranks, each plan unrouted and every wave routed.
    steps = {(shape.name, routes): _step(shape, _routed(case) if routes else case, batch, blocks, routings[0])
             for shape, case, batch in ((TEXT, text_plan(), text), (STDIT, stdit_plan(), clips))
             for routes in (False, True)}
    return {"exchanges": results, "steps": steps if dist.get_rank() == 0 else None}


# The executor on 2 nodes of 2 ranks: every wave crosses both nodes, routed or not.
TEXT, STDIT = MODEL_PRESETS["tiny"], MODEL_PRESETS["stdit-tiny"]
GRIDS = [(4, 8, 8), (3, 4, 5), (1, 6, 6), (5, 1, 1), (1, 1, 3)]
ROUTES = {"tiny": {"all_to_all", "attention"}, "stdit-tiny": {"all_to_all", "attention", "video_sp"}}
"""The modules whose exchanges a routed run of each plan routes (`_counting_routed_runs`)."""


def text_plan() -> Plan:
    """A remap domain of both nodes holding a group of 2, a rank and an idle rank; Ulysses over
    both nodes; then the two together: a remap slot of one group of 4."""
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([0, 1], 0.5), MicroBatch([2])]), Group(2, 1, [MicroBatch([3], 1.0)]),
              Group(3, 1)], remap=[(0, 4)]),
        Wave([Group(0, 4, [MicroBatch([4, 5, 6], 0.25), MicroBatch([8])])]),
        Wave([Group(0, 4, [MicroBatch([7, 9])])], remap=[(0, 4)]),
    ], planner="routed-text")


def stdit_plan() -> Plan:
    """A spatial-temporal DiT's 2D layouts over both nodes (the 5 x 1 x 1 clip's one column
    balances over no 4 ranks: its temporal blocks run Ulysses over both nodes); its context
    layout, the layout switches over both nodes, Ulysses in each node; a remap domain."""
    return Plan([f * h * w for f, h, w in GRIDS], [
        Wave([Group(0, 4, [MicroBatch([0]), MicroBatch([3], 1.0)])]),
        Wave([Group(0, 4, [MicroBatch([1, 4], 0.5)], cp=2)]),
        Wave([Group(0, 2, [MicroBatch([2])], cp=2), Group(2, 2)], remap=[(0, 4)]),
    ], shapes=GRIDS, planner="routed-stdit")


@contextlib.contextmanager
def _counting_routed_runs():
    """The routed exchanges run meanwhile, by the module that ran them: `attention` (Ulysses),
    `all_to_all` (a remap slot's route, through `AllToAll`), `video_sp` (a layout switch)."""
    counts, run = Counter(), RoutedExchange.run

    def counted(self, x):
        counts[Path(sys._getframe(1).f_code.co_filename).stem] += 1
        return run(self, x)

    RoutedExchange.run = counted
    try:
        yield counts
    finally:
        RoutedExchange.run = run


def _step(shape, case, batch, groups, routing):
    """One step of plan `case` from `perturbed_params(shape)` (adaLN-zero's zeros would leave a
    DiT's gradients mostly zero) on 2 emulated nodes: the loss, the summed gradient and the
    routed exchanges run."""
    model = build_model(shape, seed=0)
    executor = parallelize(model, CLUSTERS[0], groups=groups, routing=routing, lr=1e-3)
    load_params(model, perturbed_params(shape))
    with _counting_routed_runs() as counts:
        loss = executor.step(case, batch.samples).loss
    return loss, verify.flatten(p.grad for p in model.parameters()), counts


def _by_hand(matrix, seed, shape, index):
    """Rank `index`'s output: each source's rows for it, in source order; and its gradient: each
    destination's output gradient at the rows this rank sent it."""
    size = len(matrix)
    sent = [_payload(seed, s, sum(matrix[s]), shape, 0) for s in range(size)]
    grads = [_payload(seed, t, sum(row[t] for row in matrix), shape, 1) for t in range(size)]
    output = [sent[s][sum(matrix[s][:index]):][:matrix[s][index]] for s in range(size)]
    grad = [grads[t][sum(row[t] for row in matrix[:index]):][:matrix[index][t]] for t in range(size)]
    return torch.cat(output), torch.cat(grad)


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return run_local(4, _worker, make_batches()[0], clip_batch(STDIT, GRIDS), timeout=300)


@pytest.mark.slow
def test_routed_exchange_on_4_gloo_ranks_equals_the_unrouted_one_forward_and_backward(world4):
    checked, empty = Counter(), 0
    for results in (rank["exchanges"] for rank in world4):
        for layout, start, size, index, seed, shape, runs in results:
            matrix = _matrix(seed, size)
            expected, grad = _by_hand(matrix, seed, shape, index)
            (route_out, route_grad), (routed_out, routed_grad) = runs
            assert torch.equal(route_out, expected) and torch.equal(route_grad, grad)
            assert torch.equal(routed_out, route_out) and torch.equal(routed_grad, route_grad)
            checked[layout, start, size] += 1
            empty += routed_out.shape[0] == routed_grad.shape[0] == 0
    assert empty > 0  # the odd seeds' empty rank took part in every phase and got nothing
    assert sorted(checked) == [((1, 1), 0, 2), ((1, 1), 0, 4), ((1, 1), 2, 2), ((2, 1), 0, 4), ((2, 2), 0, 4)]
    assert all(n == len(SEEDS) * len(SHAPES) * (2 if key[2] == 2 else 4) for key, n in checked.items())


@pytest.mark.slow
@pytest.mark.parametrize("shape", [TEXT, STDIT], ids=lambda s: s.name)
def test_routed_waves_train_as_the_unrouted_ones_bit_for_bit_and_as_one_process(world4, shape):
    (loss, grads, unrouted), (routed_loss, routed_grads, routed) = (world4[0]["steps"][shape.name, r]
                                                                    for r in (False, True))
    assert routed_loss == loss and torch.equal(routed_grads, grads)  # only rows moved, otherwise
    assert not unrouted and set(routed) == ROUTES[shape.name]
    batch = make_batches()[0] if shape is TEXT else clip_batch(STDIT, GRIDS)
    params = perturbed_params(shape)
    expected = verify.reference_at(shape, verify.Trajectory([], [], [params], params), [batch])
    want = expected.grads[0]
    assert float((grads - want).abs().max() / want.abs().max()) <= verify.GRAD_TOLERANCE
    assert loss == pytest.approx(expected.losses[0], rel=verify.GRAD_TOLERANCE)


def test_one_node_makes_no_routing_groups():
    assert routing_groups(get_cluster("cpu", world_size=4)) is None  # (without torch.distributed: no collective)
