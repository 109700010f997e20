"""The simulator (ballast/timeline.py) by hand, the lower bound by brute force, Gantt charts."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from ballast.plans import gantt as report
from ballast.plans.exhaustive import brute_force, cluster_for, layouts, optimum
from ballast.planners import PlannerOptions, get_planner
from ballast.plans.plan import Group, MicroBatch, Plan, PlanError, Wave
from ballast.plans.timeline import simulate, step_time
from ballast.pricing.bounds import lower_bound, uncapped_lower_bound
from ballast.pricing.cost import CostModel
from ballast.pricing.cost_sources import get_cost_model
from ballast.pricing.pipeline import StagePart, one_f_one_b_parts, stage_activation_bytes
from ballast.pricing.stages import StagePrices
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import get_model_shape

from exhaustive_instances import hand_cost, tiny_instances, tiny_shaped_instances

# 1e-12 relative: simulate() adds a handful of float terms; the hand values are exact decimals.
EXACT = 1e-12


#           0     1     2     3     4     5
LENGTHS = [1000, 1000, 3000, 4000, 2000, 8000]
# Micro-batch times by hand (seconds):
#   [3] at d=2:    (16 + 4) / 2 + 1000 * 4000 / (2 * 1e9) + 0.01   = 10 + 0.002 + 0.01  = 10.012
#   [0, 1] at d=2: (2 + 2) / 2 + 1000 * 2000 / 2e9 + 0.01          = 2 + 0.001 + 0.01   = 2.011
#   [2] at d=1:    9 + 3 + 0.01                                                         = 12.01
#   [4] at d=1:    4 + 2 + 0.01                                                         = 6.01
#   [4] at d=2:    (4 + 2) / 2 + 0.001 + 0.01                                           = 3.011
#   [2] at d=2:    (9 + 3) / 2 + 1000 * 3000 / 2e9 + 0.01          = 6 + 0.0015 + 0.01  = 6.0115
#   [5] at d=4, c=0.5: (64 + 8)(1.25) / 4 + 1000 * 8000 / (4 * 5e8) (1 + 0.5 / 2) + 0.01
#                      = 22.5 + 0.005 + 0.01 = 22.515  (recomputed layers repeat their forward all-to-alls)


def two_wave_plan() -> Plan:
    return Plan(LENGTHS, [
        Wave([Group(0, 2, [MicroBatch([3]), MicroBatch([0, 1])]),
              Group(2, 1, [MicroBatch([2])]),
              Group(3, 1, [MicroBatch([4])])]),
        Wave([Group(0, 4, [MicroBatch([5], 0.5)])]),
    ])


def test_two_wave_plan_by_hand():
    cost = hand_cost()
    plan = two_wave_plan()
    plan.validate(cluster_for(cost), cost)
    m = simulate(plan, cost, 4, timeline=True)
    # wave 0 ends with its slowest group: ranks 0-1 take 10.012 + 2.011 = 12.023 > 12.01 > 6.01
    assert m.wave_times == pytest.approx([12.023, 22.515], rel=EXACT)
    assert m.step_time == pytest.approx(34.538, rel=EXACT)
    assert step_time(plan, cost) == pytest.approx(m.step_time, rel=EXACT)
    assert m.busy == pytest.approx([34.538, 34.538, 12.01 + 22.515, 6.01 + 22.515], rel=EXACT)
    assert m.comm == pytest.approx([0.003 + 0.005, 0.008, 0.005, 0.005], rel=EXACT)
    # the timeline: group 0's second micro-batch follows its first; wave 1 starts at 12.023
    seg = {(s.wave, s.start_rank, s.micro_batch): s for s in m.segments}
    assert len(seg) == 5
    assert seg[0, 0, 1].begin == pytest.approx(10.012, rel=EXACT)
    assert (seg[0, 0, 1].compute, seg[0, 0, 1].comm) == pytest.approx((2.01, 0.001), rel=EXACT)
    assert seg[1, 0, 0].begin == pytest.approx(12.023, rel=EXACT)
    assert seg[1, 0, 0].end == pytest.approx(34.538, rel=EXACT)


def test_metric_definitions():
    cost = hand_cost()
    plan = two_wave_plan()
    plan.tokens = 15_000          # a loss normaliser other than the sum of lengths
    m = simulate(plan, cost, 4)
    t = 34.538
    assert m.tokens_per_s == pytest.approx(15_000 / t, rel=EXACT)
    # idle: the share of rank-seconds not spent computing or communicating
    busy = 2 * t + 34.525 + 28.525
    assert m.idle_fraction == pytest.approx(1 - busy / (4 * t), rel=EXACT)
    assert m.idle_fraction == pytest.approx((0.013 + 6.013) / (4 * t), rel=1e-9)
    assert m.lower_bound == uncapped_lower_bound(cost, LENGTHS)
    assert m.vs_lower_bound == pytest.approx(t / uncapped_lower_bound(cost, LENGTHS), rel=EXACT)
    assert m.vs_lower_bound >= 1.0


def test_lockstep_synchronises_every_micro_batch():
    cost = hand_cost()
    waves = [Wave([Group(0, 2, [MicroBatch([3]), MicroBatch([0, 1])]),     # 10.012, then 2.011
                   Group(2, 2, [MicroBatch([4]), MicroBatch([2])])])]     # 3.011, then 6.0115
    free = simulate(Plan(LENGTHS[:5], waves), cost, 4, timeline=True)
    lock = simulate(Plan(LENGTHS[:5], waves, lockstep=True), cost, 4, timeline=True)
    # independent groups: the wave is the slower group's sum, max(12.023, 9.0225)
    assert free.step_time == pytest.approx(12.023, rel=EXACT)
    # lockstep: micro-batch i ends when every group's micro-batch i has: 10.012 + 6.0115
    assert lock.step_time == pytest.approx(16.0235, rel=EXACT)
    assert step_time(Plan(LENGTHS[:5], waves, lockstep=True), cost) == pytest.approx(16.0235, rel=EXACT)
    second = next(s for s in lock.segments if s.start_rank == 2 and s.micro_batch == 1)
    assert second.begin == pytest.approx(10.012, rel=EXACT)      # waits for group 0
    second = next(s for s in free.segments if s.start_rank == 2 and s.micro_batch == 1)
    assert second.begin == pytest.approx(3.011, rel=EXACT)
    # waiting is idle time, not busy time
    assert lock.busy == pytest.approx(free.busy, rel=EXACT)
    assert lock.idle_fraction > free.idle_fraction


def test_lockstep_filler_costs_the_fixed_overhead():
    cost = hand_cost()
    plan = Plan(LENGTHS[:5], [Wave([Group(0, 2, [MicroBatch([3]), MicroBatch([0, 1])]),
                                     Group(2, 2, [MicroBatch([2, 4]), MicroBatch([])])])], lockstep=True)
    # [2, 4] at d=2: (9 + 4 + 5) / 2 + 1000 * 5000 / 2e9 + 0.01 = 9 + 0.0025 + 0.01 = 9.0125
    m = simulate(plan, cost, 4)
    assert m.step_time == pytest.approx(10.012 + 2.011, rel=EXACT)
    assert m.busy[2] == pytest.approx(9.0125 + 0.01, rel=EXACT)    # the filler joins with g
    assert m.comm[2] == pytest.approx(0.0025, rel=EXACT)


def test_empty_plan_and_idle_wave():
    cost = hand_cost()
    m = simulate(Plan([], []), cost, 4)
    assert (m.step_time, m.tokens_per_s, m.idle_fraction, m.vs_lower_bound) == (0.0, 0.0, 0.0, 1.0)
    plan = Plan([1000], [Wave([Group(0, 4)]), Wave([Group(0, 1, [MicroBatch([0])]), Group(1, 1),
                                                    Group(2, 2)])])
    assert simulate(plan, cost, 4).wave_times == pytest.approx([0.0, 1.0 + 1.0 + 0.01], rel=EXACT)


# --- the lower bound by brute force ------------------------------------------------------------
@settings(max_examples=40)
@given(tiny_instances())
def test_brute_force_never_beats_lower_bound(instance):
    check_bound_below_optimum(instance)


@settings(max_examples=40)
@given(tiny_shaped_instances())
def test_brute_force_never_beats_lower_bound_on_shaped_samples(instance):
    # The bound prices each clip by its attention units under the pattern, as the simulator
    # does, so the exhaustive optimum of batches with clips never beats it either.
    check_bound_below_optimum(instance)


def check_bound_below_optimum(instance) -> None:
    cost, lengths = instance
    best, plan = brute_force(cost, lengths)
    # the exhaustive optimum is a real plan, and the simulator agrees with the search's sum
    plan.validate(cluster_for(cost), cost)
    assert simulate(plan, cost, cost.world_size).step_time == pytest.approx(best, rel=EXACT)
    # relative 1e-9: the bound and the search add the same terms in different orders
    assert lower_bound(cost, lengths) <= best * (1 + 1e-9)
    # and plans of several waves, which can be much faster (up to 4x measured), never beat it either
    multi = optimum(cost, lengths)
    assert multi <= best * (1 + 1e-12)
    assert lower_bound(cost, lengths) <= multi * (1 + 1e-9)


def test_brute_force_search_is_exhaustive():
    # Guard the search itself: 4 ranks tile 5 ways, and on a batch where the answer is known
    # (four equal sequences, four ranks, no memory pressure) it finds one sequence per rank.
    assert sorted(map(tuple, layouts(4))) == sorted([((0, 1), (1, 1), (2, 1), (3, 1)), ((0, 1), (1, 1), (2, 2)),
                                                     ((0, 2), (2, 1), (3, 1)), ((0, 2), (2, 2)), ((0, 4),)])
    cost = hand_cost(bandwidth={2: 1e6, 4: 1e6})      # slow all-to-all: degree 1 wins
    best, plan = brute_force(cost, [1000] * 4)
    assert best == pytest.approx(cost.time([1000], 1, 0.0), rel=EXACT)
    assert [g.degree for g in plan.waves[0].groups] == [1, 1, 1, 1]
    assert optimum(cost, [1000] * 4) == pytest.approx(best, rel=EXACT)   # a second wave cannot help


def test_optimum_splits_into_waves_when_that_pays():
    # A 5000-token sequence fits only at degree 2 (3000 tokens per rank without recomputation,
    # 3333 with it); one wave must then be a degree-2 group, and the short ones pay its slow
    # all-to-all. Two waves run them at degree 1 afterwards: one second less.
    cost = hand_cost(world_size=2, device_memory=3000 * 1e5, states=0.0, kept=0.9, bandwidth={2: 1e6})
    lengths = [5000, 1000, 1000]
    one_wave, _ = brute_force(cost, lengths)
    two_waves = cost.time([5000], 2, 0.0) + cost.time([1000], 1, 0.0)
    assert two_waves < one_wave - 0.9
    assert optimum(cost, lengths) == pytest.approx(two_waves, rel=EXACT)


# --- Gantt charts ------------------------------------------------------------------------------
def test_gantt_writes_png(tmp_path, cpu4, tiny4):
    import matplotlib.image

    lengths = [60_000, 30_000, 9_000, 4_000, 2_000, 800, 500, 100, 40_000]
    plans = {name: get_planner(name, cpu4, tiny4, PlannerOptions()).plan(lengths)
             for name in ("static", "megatron-dynamic-cp", "batch-adaptive")}
    plans["hand"] = Plan([100, 200], [Wave([Group(0, 2, [MicroBatch([0]), MicroBatch([])]),
                                            Group(2, 2, [MicroBatch([1]), MicroBatch([])])]),
                                      Wave([Group(0, 4)])], lockstep=True)
    path = tmp_path / "gantt.png"
    report.gantt(plans, tiny4, 4, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # figure size 12 x (1 + 2.4 per plan) inches at 110 dpi: one panel per plan
    height, width = matplotlib.image.imread(path).shape[:2]
    assert (width, height) == (1320, round((1 + 2.4 * 4) * 110))
    one = tmp_path / "one.png"
    report.gantt({"static": plans["static"]}, tiny4, 4, one)
    assert matplotlib.image.imread(one).shape[:2] == (round(3.4 * 110), 1320)


# --- pipelines (PP degree p > 1) ----------------------------------------------------------------
def staged_hand_cost(stages: int = 2) -> CostModel:
    """`hand_cost` with p stages of 250-wide rows (1000 bytes a token across a boundary) at 1 GB/s."""
    return dataclasses.replace(hand_cost(), stages=StagePrices((0.0,) * stages, 250, 1e9, 0.0))


def test_a_pipeline_plan_is_timed_as_its_1f1b_step():
    cost = staged_hand_cost()
    plan = dataclasses.replace(two_wave_plan(), pp=2)
    # By hand: each busy micro-batch's seconds above (all but [5] at recompute 0; [5] at 0 is
    # 18 + 0.004 + 0.01), a stage's forward a sixth of its plain seconds and its backward the
    # rest of half; its rows 1000 bytes a token / degree at 1 GB/s; the slots of `Plan.slots`:
    # wave 0's first micro-batches, then group 0's second alone, then wave 1's.
    def part(lanes, seconds, plain, tokens, degree):
        forward = plain / 6
        return StagePart(lanes, (forward,) * 2, (seconds / 2 - forward,) * 2, 1000 * tokens / degree / 1e9)

    slots = [[part((0, 1), 10.012, 10.012, 4000, 2), part((2,), 12.01, 12.01, 3000, 1),
              part((3,), 6.01, 6.01, 2000, 1)],
             [part((0, 1), 2.011, 2.011, 2000, 2)],
             [part((0, 1, 2, 3), 22.515, 18.014, 8000, 4)]]
    expected = one_f_one_b_parts(slots, 2, 4)
    assert step_time(plan, cost) == pytest.approx(expected.step, rel=EXACT)
    m = simulate(plan, cost, 4, timeline=True)
    assert m.step_time == pytest.approx(expected.step, rel=EXACT) and m.wave_times == [m.step_time]
    # A rank's busy seconds are one stage's: half its micro-batches'.
    assert m.busy == pytest.approx([34.538 / 2] * 2 + [(12.01 + 22.515) / 2, (6.01 + 22.515) / 2], rel=EXACT)
    assert m.lower_bound == pytest.approx(uncapped_lower_bound(cost, LENGTHS) / 2, rel=EXACT)
    # The Gantt's segments are the first stage's passes: a forward and a backward of each of the
    # 5 busy micro-batches, never two at once on a rank, the last ending with the step or before.
    assert len(m.segments) == 10
    for rank in range(4):
        mine = sorted((s for s in m.segments if s.start_rank <= rank < s.start_rank + s.degree), key=lambda s: s.begin)
        assert all(a.end <= b.begin + 1e-12 for a, b in zip(mine, mine[1:]))
    assert max(s.end for s in m.segments) <= m.step_time + 1e-12
    # Without its stages' prices a cost model cannot time a pipeline plan.
    with pytest.raises(ValueError, match="runs 2 pipeline stages, but the cost model prices 1"):
        step_time(plan, hand_cost())


def test_a_pipeline_plan_fits_memory_per_stage():
    tiny = get_model_shape("tiny")
    cluster = get_cluster("cpu", world_size=2)
    mesh = JobMesh.of(cluster, pp=2)
    cost = get_cost_model("analytic", tiny, cluster, mesh=mesh)
    act = stage_activation_bytes(cost, [2000], 1, 0.0, 1, 0, 2)
    # Room on stage 0 for its states and 1.5 micro-batches' activations of 2000 tokens: one fits
    # (the whole model's check would refuse it: all 4 layers' activations and states), two in
    # flight at once (1F1B's warm-up on the first of 2 stages) do not.
    cost = dataclasses.replace(cost, device_memory=cost.stages.states[0] + 1.5 * act)
    assert cost.memory([2000], 1, 0.0) > cost.device_memory
    pool = mesh.pool_cluster(cluster)
    Plan([2000], [Wave([Group(0, 1, [MicroBatch([0])])])], pp=2).validate(pool, cost)
    two = Plan([2000, 2000], [Wave([Group(0, 1, [MicroBatch([0]), MicroBatch([1])])])], pp=2)
    with pytest.raises(PlanError, match=r"pipeline stage 0, pool rank 0: needs .* GB per device at its peak"):
        two.validate(pool, cost)
