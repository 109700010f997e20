"""The pipeline's price (`pricing/pipeline.py`): the 1F1B step of variable micro-batches against
hand-worked cases and a brute-force event simulation, the textbook bubble for equal ones, the
boundary's bytes, and memory per stage (states split, activations in flight)."""
from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.pricing.cost_sources import analytic_cost, device_memory, get_cost_model
from ballast.pricing.device_memory import ParameterCounts
from ballast.pricing.pipeline import (StagePart, boundary_bandwidth, boundary_bytes, in_flight_peak,
                                      one_f_one_b_parts, one_f_one_b_times, stage_activation_bytes, stage_counts,
                                      stage_memory, stage_passes, stage_states, transfer_seconds)
from ballast.pricing.tensor_parallel import parameter_counts
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import MODEL_PRESETS, get_model_shape
from ballast.vocabulary.pipeline_schedule import Pass, in_flight, one_f_one_b
from ballast.vocabulary.sharding import Sharding

TINY = MODEL_PRESETS["tiny"]


def test_one_f_one_b_order():
    assert [str(p) for p in one_f_one_b(0, 3, 4)] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert [str(p) for p in one_f_one_b(1, 3, 4)] == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert [str(p) for p in one_f_one_b(2, 3, 4)] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert one_f_one_b(0, 4, 2) == [Pass(True, 0), Pass(True, 1), Pass(False, 0), Pass(False, 1)]
    assert [len(h) for h in in_flight(0, 3, 5)] == [1, 2, 3, 3, 3] and [len(h) for h in in_flight(2, 3, 5)] == [1] * 5


def brute_force(forward, backward, transfer) -> float:
    """The step by simulated time: at every event each idle stage starts its next pass (in 1F1B
    order) once that pass's input has arrived; an input arrives a transfer after the pass that
    makes it ends. A clock and an event queue, nothing shared with `one_f_one_b_times`."""
    m, p = len(forward), len(forward[0])
    orders = [one_f_one_b(k, p, m) for k in range(p)]
    arrived: dict[tuple[bool, int, int], float] = {}  # (forward?, micro-batch, stage) -> input there at
    for i in range(m):
        arrived[(True, i, 0)] = 0.0
    nxt, busy_until, clock, events = [0] * p, [0.0] * p, 0.0, [0.0]
    while events:
        clock = heapq.heappop(events)
        for k in range(p):
            if busy_until[k] > clock or nxt[k] == len(orders[k]):
                continue
            step = orders[k][nxt[k]]
            key = (step.forward, step.micro_batch, k)
            if key not in arrived or arrived[key] > clock:
                continue
            i = step.micro_batch
            end = clock + (forward if step.forward else backward)[i][k]
            busy_until[k] = end
            nxt[k] += 1
            heapq.heappush(events, end)
            if step.forward:
                target = (True, i, k + 1) if k + 1 < p else (False, i, k)
                delay = transfer[i] if k + 1 < p else 0.0
            else:
                target, delay = ((False, i, k - 1), transfer[i]) if k > 0 else (None, 0.0)
            if target is not None:
                arrived[target] = end + delay
                heapq.heappush(events, end + delay)
    assert nxt == [len(o) for o in orders]
    return max(busy_until)


def test_hand_worked_cases():
    # p = 2, m = 2, forward 1 s and backward 2 s everywhere: stage 0 runs F0 [0,1] F1 [1,2], waits
    # for B0 (stage 1: F0 [1,2] B0 [2,4]) [4,6], stage 1 F1 [4,5] B1 [5,7], stage 0 B1 [7,9].
    equal = one_f_one_b_times([[1, 1], [1, 1]], [[2, 2], [2, 2]])
    assert (equal.step, equal.work, equal.bubble, equal.bubble_ratio) == (9, (6, 6), 3, 0.5)
    assert [ends[0] for ends in equal.forward_ends] == [(1, 2), (2, 5)]
    assert [ends[0] for ends in equal.backward_ends] == [(6, 4), (9, 7)]
    # 0.5 s across a boundary: stage 1 F0 [1.5,2.5] B0 [2.5,4.5], stage 0 B0 [5,7], stage 1 F1
    # [4.5,5.5] B1 [5.5,7.5], stage 0 B1 [8,10].
    assert one_f_one_b_times([[1, 1], [1, 1]], [[2, 2], [2, 2]], [0.5, 0.5]).step == 10
    # A long micro-batch (3 s + 6 s a stage) before a short one (1 s + 2 s): stage 0 F0 [0,3] F1
    # [3,4], stage 1 F0 [3,6] B0 [6,12], stage 0 B0 [12,18], stage 1 F1 [12,13] B1 [13,15],
    # stage 0 B1 [18,20]. Short first: stage 0 F0 [0,1] F1 [1,4], stage 1 F0 [1,2] B0 [2,4],
    # stage 0 B0 [4,6], stage 1 F1 [4,7] B1 [7,13], stage 0 B1 [13,19]: the bubble as it falls.
    long_first = one_f_one_b_times([[3, 3], [1, 1]], [[6, 6], [2, 2]])
    short_first = one_f_one_b_times([[1, 1], [3, 3]], [[2, 2], [6, 6]])
    assert (long_first.step, long_first.bubble) == (20, 8) and (short_first.step, short_first.bubble) == (19, 7)
    assert one_f_one_b_times([[1, 2, 3]], [[2, 4, 6]]).step == 18  # one micro-batch: its whole path
    assert one_f_one_b_times([[1], [2]], [[3], [4]]).bubble == 0  # one stage: no bubble


times = st.floats(0.0, 10.0, allow_nan=False, width=32)


@st.composite
def pipelines(draw):
    p, m = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    grid = st.lists(st.lists(times, min_size=p, max_size=p), min_size=m, max_size=m)
    return draw(grid), draw(grid), draw(st.lists(times, min_size=m, max_size=m))


@settings(max_examples=200, deadline=None)
@given(pipelines())
def test_the_step_is_the_event_simulation(case):
    forward, backward, transfer = case
    got = one_f_one_b_times(forward, backward, transfer)
    assert got.step == pytest.approx(brute_force(forward, backward, transfer), rel=1e-12, abs=1e-12)
    # Never below the busiest stage's work, nor a micro-batch's own path through every stage.
    paths = [sum(f) + sum(b) + 2 * (len(f) - 1) * t for f, b, t in zip(forward, backward, transfer)]
    assert got.step >= max(max(got.work), *paths) * (1 - 1e-12) and got.bubble >= -1e-9


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 16), st.floats(0.01, 5.0), st.floats(0.01, 5.0))
def test_equal_micro_batches_give_the_textbook_bubble(p, m, f, b):
    got = one_f_one_b_times([[f] * p] * m, [[b] * p] * m)
    assert got.step == pytest.approx((m + p - 1) * (f + b))
    assert got.bubble_ratio == pytest.approx((p - 1) / m)
    assert got.idle_fraction == pytest.approx((p - 1) / (m + p - 1))


@settings(max_examples=100, deadline=None)
@given(pipelines(), st.data())
def test_a_slower_pass_never_shortens_the_step(case, data):
    forward, backward, transfer = case
    i, k = data.draw(st.integers(0, len(forward) - 1)), data.draw(st.integers(0, len(forward[0]) - 1))
    slower = [row[:] for row in backward]
    slower[i][k] += data.draw(st.floats(0.0, 5.0))
    assert one_f_one_b_times(forward, slower, transfer).step >= one_f_one_b_times(forward, backward, transfer).step


def test_groups_of_a_pool_run_their_slots_together():
    # A pool of 2 on 2 stages, forward 1 s and backward 2 s a stage for any micro-batch. Slot 0:
    # one group of both ranks; slot 1: rank 0 alone (rank 1's group has run out); slot 2: both
    # again. Rank 1 has no pass in slot 1 and runs ahead to slot 2, whose passes then wait for
    # rank 0 (their collectives meet): the step is rank 0's three micro-batches in a row.
    both, alone = (0, 1), (0,)
    part = lambda lanes: StagePart(lanes, (1.0, 1.0), (2.0, 2.0))  # noqa: E731
    got = one_f_one_b_parts([[part(both)], [part(alone)], [part(both)]], 2, 2)
    single = one_f_one_b_times([[1, 1]] * 3, [[2, 2]] * 3)
    assert got.step == single.step == 12 and got.work == (9, 9)
    # Two one-rank groups side by side are two independent pipelines: the longer sets the step.
    short, long = StagePart((0,), (1.0, 1.0), (2.0, 2.0)), StagePart((1,), (3.0, 3.0), (6.0, 6.0))
    side = one_f_one_b_parts([[short, long], [short, long]], 2, 2)
    assert side.step == one_f_one_b_times([[3, 3]] * 2, [[6, 6]] * 2).step and side.work == (18, 18)
    # A slot with nothing to run takes no time but keeps its place in the order, as the runtime
    # walks it: stage 0 runs F0 [0,1], its empty F1, waits for B0 [4,6], F2 [6,7]; stage 1 F2
    # [7,8] B2 [8,10]; stage 0 B2 [10,12] (without the empty slot, 9 s: F1 before B0).
    assert one_f_one_b_parts([[part(both)], [], [part(both)]], 2, 2).step == 12


@settings(max_examples=100, deadline=None)
@given(st.lists(pipelines(), min_size=1, max_size=3).filter(
    lambda cases: len({(len(c[0]), len(c[0][0])) for c in cases}) == 1))
def test_one_rank_groups_are_independent_pipelines(cases):
    # Lanes that never share a group (every slot one part per lane) run as pipelines of their
    # own: the step is the slowest one's, each lane's work its own.
    m, p = len(cases[0][0]), len(cases[0][0][0])
    slots = [[StagePart((lane,), tuple(f[i]), tuple(b[i]), t[i]) for lane, (f, b, t) in enumerate(cases)]
             for i in range(m)]
    alone = [one_f_one_b_times(*case) for case in cases]
    got = one_f_one_b_parts(slots, p, len(cases))
    assert got.step == pytest.approx(max(a.step for a in alone), rel=1e-12, abs=1e-12)
    assert got.work == pytest.approx([max(a.work[k] for a in alone) for k in range(p)])


def test_a_stage_runs_its_share_of_a_micro_batch():
    # 9 s for the whole model (6 s without recomputation) on 3 stages: a forward of 6 / 3 / 3 = 2/3 s
    # a stage, the backward the rest of the stage's 3 s.
    forward, backward = stage_passes(9.0, 6.0, 3)
    assert forward == pytest.approx(2 / 3) and backward == pytest.approx(3 - 2 / 3)
    # A stage a share of a node: the TP group's and its counterpart's 2 t devices exchanging; whole
    # nodes: the node's NICs shared by its devices.
    h100 = get_cluster("h100-32")
    assert boundary_bandwidth(h100, JobMesh.of(h100, tp=2, pp=8)) == h100.bandwidth[4]
    assert boundary_bandwidth(h100, JobMesh.of(h100, tp=8, pp=4)) == \
        h100.nic_bandwidth * h100.nics_per_node / h100.devices_per_node


def test_boundary_bytes_and_seconds():
    # 1000 tokens of hidden 128 in fp32 cross a boundary: 512 kB each way; a group of 4 sends it
    # at once, 128 kB per rank at 1 GB/s: 128 us, plus the latency.
    assert boundary_bytes(1000, 128) == 512_000
    assert transfer_seconds(1000, 4, 128, 1e9, 1e-5) == pytest.approx(128e-6 + 1e-5)
    assert transfer_seconds(0, 4, 128, 1e9, 1e-5) == 0.0


def test_stage_states_split_the_model():
    for shape in (TINY, MODEL_PRESETS["llama3-8b"]):
        whole = ParameterCounts.of_shape(shape)
        for stages in (2, 4):
            parts = [stage_counts(shape, k, stages) for k in range(stages)]
            assert sum(c.total for c in parts) == whole.total and sum(c.autocast for c in parts) == whole.autocast
            assert sum(c.root for c in parts) == whole.root and {c.block for c in parts} == {whole.block}
    with pytest.raises(ValueError, match="cannot be cut into pipeline stages"):
        stage_counts(MODEL_PRESETS["dit-tiny"], 0, 2)
    with pytest.raises(ValueError, match="PP degree 3 does not divide model 'tiny''s 4 layers"):
        stage_counts(TINY, 0, 3)
    cluster = get_cluster("cpu", world_size=2)
    # Replicated fp32 (the cpu cluster's): 4 bytes a parameter, its gradient 4, AdamW's state 8.
    cost = analytic_cost(TINY, cluster, device_memory(TINY, cluster, Sharding.REPLICATED))
    assert [stage_states(cost, TINY, k, 2) for k in range(2)] == [16 * stage_counts(TINY, k, 2).total for k in range(2)]
    # ZeRO-1 over a pool of 2 shards AdamW's state: 4 + 4 + 8 / 2 bytes a parameter.
    cost = analytic_cost(TINY, cluster, device_memory(TINY, cluster, Sharding.ZERO1))
    assert stage_states(cost, TINY, 1, 2) == 12 * stage_counts(TINY, 1, 2).total
    # A TP rank's stages split its shard of the model (`tensor_parallel.parameter_counts`).
    shard = parameter_counts(TINY, 2)
    parts = [stage_counts(TINY, k, 2, tp=2) for k in range(2)]
    assert sum(c.total for c in parts) == shard.total and sum(c.root for c in parts) == shard.root
    assert {c.block for c in parts} == {shard.block}


def test_activations_in_flight_per_stage():
    # Stage 0 of 2 runs F0 F1 B0 F2 B1 B2: after F1 it holds micro-batches 0 and 1; stage 1 one at a time.
    assert in_flight_peak(0, 2, [5, 1, 3]) == 6 and in_flight_peak(1, 2, [5, 1, 3]) == 5
    # Equal micro-batches: stage k holds min(p - k, m) of them, the first stage the most.
    assert [in_flight_peak(k, 4, [2.0] * 6) for k in range(4)] == [8, 6, 4, 2]
    assert [in_flight_peak(k, 4, [2.0] * 2) for k in range(4)] == [4, 4, 4, 2]
    cluster = get_cluster("cpu", world_size=2)
    cost = analytic_cost(TINY, cluster)
    samples = [300, 17]
    whole = cost.activation_bytes(317.0, 2, 0.5, 1)
    parts = [stage_activation_bytes(cost, samples, 2, 0.5, 1, k, 4) for k in range(4)]
    assert sum(parts) == pytest.approx(whole)  # the layers split, the loss's bytes on the last stage only
    assert parts[0] == parts[1] == parts[2] and parts[3] - parts[0] == pytest.approx(cost.loss_per_token * 317 / 2)
    # A cost model of a mesh with PP prices its stages (`CostModel.stages`).
    staged = get_cost_model("analytic", TINY, get_cluster("cpu", world_size=4), mesh=JobMesh(4, 4, tp=2, pp=2))
    assert staged.stages.states == tuple(stage_states(staged, TINY, k, 2) for k in range(2))
    assert staged.stages.hidden == TINY.hidden and get_cost_model("analytic", TINY, cluster).stages is None
    acts = [stage_activation_bytes(staged, [n], 1, 0.0, 1, 0, 2) for n in (100, 400, 50)]
    assert stage_memory(staged.stages, 0, acts) == pytest.approx(staged.stages.states[0] + acts[0] + acts[1])
