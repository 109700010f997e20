"""The whole step (pricing/whole_step.py): the data-parallel prices by hand, the reduction's end
against an event-by-event run of its buckets, and the simulator's step and bound with them."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings, strategies as st

from ballast.planners import PlannerOptions, get_planner
from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.plans.timeline import simulate, step_time
from ballast.pricing.bounds import uncapped_lower_bound
from ballast.pricing.cost_sources import get_cost_model
from ballast.pricing.device_memory import ParameterCounts
from ballast.pricing.pipeline import StagePart, one_f_one_b_parts
from ballast.pricing.pipeline_bound import pipeline_lower_bound, report_lower_bound
from ballast.pricing.stages import StagePrices
from ballast.pricing.whole_step import DataParallelPrices, data_parallel_prices
from ballast.vocabulary.cluster import Cluster, get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.sharding import Sharding

from exhaustive_instances import hand_cost

# The hand values are exact decimals a handful of float operations away.
EXACT = 1e-12

# 2 nodes of 4, a ring of 10 GB/s, 1 ms a collective, 1 TB/s of device memory; 1e9 parameters, 1e8
# in the root and nine blocks of 1e8.
CLUSTER = Cluster("hand", 2, 4, 1e10, 1e12, 1.0, {2: 1e10, 4: 1e10, 8: 1e10}, 0.0, 1e-3, ring_bandwidth=1e10,
                  memory_bandwidth=1e12)
COUNTS = ParameterCounts(total=10**9, autocast=9 * 10**8, block=10**8, root=10**8)


def test_replicated_prices_by_hand():
    prices = data_parallel_prices(COUNTS, Sharding.REPLICATED, True, 8, CLUSTER)
    buckets = math.ceil(4e9 / (25 * 2**20))  # 153 buckets of DDP's 25 MiB
    assert prices.buckets == buckets == 153
    # ring all-reduce: 2 x 7/8 of 4 GB at 10 GB/s, and 1 ms a bucket
    assert prices.reduction == pytest.approx(0.7 + 0.153, rel=EXACT)
    assert prices.optimizer == pytest.approx(32e9 / 1e12, rel=EXACT) and prices.after_optimizer == 0
    assert prices.passes(1.0, 2.0) == (1.0, 2.0)


def test_zero1_prices_by_hand():
    prices = data_parallel_prices(COUNTS, Sharding.ZERO1, True, 8, CLUSTER)
    # reduce-scatter: 7/8 of 4 GB; the owners' broadcasts after AdamW: 4 GB; AdamW on an eighth
    assert prices.reduction == pytest.approx(0.35 + 0.153, rel=EXACT)
    assert prices.after_optimizer == pytest.approx(0.4 + 0.153, rel=EXACT)
    assert prices.optimizer == pytest.approx(32e9 / 8 / 1e12, rel=EXACT)


def test_fsdp_prices_by_hand():
    prices = data_parallel_prices(COUNTS, Sharding.FSDP, True, 8, CLUSTER)
    # after the last backward only the root's reduce-scatter: 7/8 of 0.4 GB, one call
    assert (prices.buckets, prices.reduction) == (1, pytest.approx(0.035 + 1e-3, rel=EXACT))
    # forward: every parameter gathered in bf16 (7/8 of 2 GB), 10 units; backward: the blocks'
    # 1.8 GB again and every fp32 gradient reduce-scattered (4 GB), 19 calls; the first gathers,
    # root and one block in bf16 (0.4 GB), 2 calls
    assert prices.forward_gathers == pytest.approx(0.175 + 0.010, rel=EXACT)
    assert prices.backward_collectives == pytest.approx(7 / 8 * 5.8e9 / 1e10 + 0.019, rel=EXACT)
    assert prices.first_gathers == pytest.approx(0.035 + 0.002, rel=EXACT)
    # A pass shorter than its gathers waits for them; a longer one hides them (the first
    # gathers, which nothing hides, are in the cost model's g).
    assert prices.passes(0.1, 0.2) == (prices.forward_gathers, prices.backward_collectives)
    assert prices.passes(10.0, 20.0) == (10.0, 20.0)


def test_fsdp_first_gathers_are_part_of_every_micro_batchs_fixed_cost():
    cluster = get_cluster("h100-32", device_memory_gb=120.0)  # room for ZeRO-1's whole gradients
    costs = {mode: get_cost_model("analytic", get_model_shape("llama3-8b"), cluster, sharding=mode)
             for mode in (Sharding.ZERO1, Sharding.FSDP)}
    assert costs[Sharding.FSDP].g == pytest.approx(costs[Sharding.ZERO1].g
                                                   + costs[Sharding.FSDP].data_parallel.first_gathers, rel=EXACT)
    assert costs[Sharding.FSDP].data_parallel.first_gathers > 0 == costs[Sharding.ZERO1].data_parallel.first_gathers


def test_published_fsdp_prices_only_the_optimizer():
    """FlexSP's profile was measured under ZeRO-3: its passes hold their collectives already."""
    prices = data_parallel_prices(COUNTS, Sharding.FSDP, True, 8, CLUSTER, source="published")
    assert prices == DataParallelPrices(optimizer=32e9 / 8 / 1e12)


def test_one_rank_has_nothing_to_reduce():
    assert data_parallel_prices(COUNTS, Sharding.REPLICATED, True, 1, CLUSTER) == DataParallelPrices(optimizer=0.032)


def test_a_cluster_derives_its_ring_from_its_nics_or_its_node():
    assert get_cluster("a100-64").ring_bandwidth == pytest.approx(25e9)  # one 200 Gb/s NIC a GPU
    assert get_cluster("h100-8").ring_bandwidth == get_cluster("h100-8").bandwidth[8]
    assert get_cluster("cpu", 1).ring_bandwidth is None
    with pytest.raises(ValueError, match="ring_bandwidth must be > 0"):
        dataclasses.replace(CLUSTER, ring_bandwidth=0.0)
    with pytest.raises(ValueError, match="memory_bandwidth must be > 0"):
        dataclasses.replace(CLUSTER, memory_bandwidth=-1.0)


def buckets_one_by_one(prices: DataParallelPrices, lasts, waves_end: float) -> float:
    """The reduction run bucket by bucket: bucket k starts once every rank has it final (a rank
    with no pass at the waves' end) and bucket k - 1 is done."""
    K, done = prices.buckets, 0.0
    for k in range(K):
        ready = max(waves_end if last is None else last[0] - last[1] * (K - 1 - k) / K for last in lasts)
        done = max(done, ready) + prices.reduction / K
    return max(done, waves_end)


@settings(max_examples=200, deadline=None)
@given(buckets=st.integers(1, 30), reduction=st.floats(0.0, 10.0),
       lasts=st.lists(st.one_of(st.none(), st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 10.0))), min_size=1,
                      max_size=6))
def test_the_reduction_ends_as_its_buckets_run_one_by_one(buckets, reduction, lasts):
    lasts = [None if last is None else (last[0], min(last)) for last in lasts]  # a backward within the step
    waves_end = max((last[0] for last in lasts if last is not None), default=0.0)
    prices = DataParallelPrices(buckets, reduction)
    assert prices.reduction_end(lasts, waves_end) == pytest.approx(buckets_one_by_one(prices, lasts, waves_end),
                                                                   rel=1e-9, abs=1e-12)
    assert prices.reduction_end(lasts, waves_end) >= prices.least_end(waves_end) - 1e-9


def two_wave_plan() -> Plan:
    """test_timeline's plan: wave 1 is [5] at degree 4 and recompute 0.5 on every rank, 22.515 s
    (18.014 s without recomputation), ending the waves at 34.538 s."""
    return Plan([1000, 1000, 3000, 4000, 2000, 8000], [
        Wave([Group(0, 2, [MicroBatch([3]), MicroBatch([0, 1])]), Group(2, 1, [MicroBatch([2])]),
              Group(3, 1, [MicroBatch([4])])]),
        Wave([Group(0, 4, [MicroBatch([5], 0.5)])]),
    ])


def test_the_whole_step_by_hand():
    prices = DataParallelPrices(buckets=4, reduction=8.0, after_optimizer=0.25, optimizer=0.5)
    cost = dataclasses.replace(hand_cost(), data_parallel=prices)
    m = simulate(two_wave_plan(), cost, 4)
    # Every rank's last backward is [5]'s: 22.515 - 18.014 / 3 s, ending at 34.538; its buckets
    # (2 s each) are final from 34.538 - 16.5103 x 3/4 on, so only the last one is left after it.
    assert m.sync_time == pytest.approx(2.0, rel=EXACT) and m.optimizer_time == 0.75
    assert m.step_time == pytest.approx(34.538 + 2.75, rel=EXACT) and m.waves_time == pytest.approx(34.538)
    # What planners compare is the waves alone.
    assert step_time(two_wave_plan(), cost) == pytest.approx(34.538, rel=EXACT)
    assert m.lower_bound == pytest.approx(prices.least_end(uncapped_lower_bound(cost, two_wave_plan().samples)))
    assert m.lower_bound <= m.step_time


def test_a_rank_without_a_pass_reduces_everything_after_the_waves():
    prices = DataParallelPrices(buckets=4, reduction=8.0)
    cost = dataclasses.replace(hand_cost(), data_parallel=prices)
    plan = Plan([1000, 1000], [Wave([Group(0, 2, [MicroBatch([0, 1])])])])
    m = simulate(plan, cost, 4)
    assert m.sync_time == pytest.approx(8.0, rel=EXACT)


def test_fsdp_gathers_lengthen_a_pass_they_outlast():
    # [4] alone at degree 1: 6.01 s, forward 6.01 / 3; gathers of 5 s forward and 7 s backward.
    prices = DataParallelPrices(forward_gathers=5.0, backward_collectives=7.0)
    cost = dataclasses.replace(hand_cost(), data_parallel=prices)
    plan = Plan([2000], [Wave([Group(0, 1, [MicroBatch([0])])])])
    assert step_time(plan, cost) == pytest.approx(5.0 + 7.0, rel=EXACT)
    m = simulate(plan, cost, 4, timeline=True)
    assert m.segments[0].comm == pytest.approx(12.0 - 6.01, rel=EXACT)
    # Gathers shorter than the pass hide behind it.
    cheap = dataclasses.replace(cost, data_parallel=DataParallelPrices(forward_gathers=1.0, backward_collectives=1.0))
    assert step_time(plan, cheap) == pytest.approx(6.01, rel=EXACT)
    # The bound charges the one pass the busiest rank runs at least.
    assert report_lower_bound(cost, plan.samples) >= 12.0


def test_each_stage_reduces_its_own_gradients_and_the_last_one_ends_the_step():
    first = DataParallelPrices(buckets=2, reduction=3.0, optimizer=0.5)
    last = DataParallelPrices(buckets=1, reduction=1.0, optimizer=0.25)
    cost = dataclasses.replace(hand_cost(), stages=StagePrices((0.0, 0.0), 250, 1e9, 0.0, (first, last)))
    plan = Plan([2000], [Wave([Group(0, 1, [MicroBatch([0])])])], pp=2)
    # [4] at degree 1: 6.01 s, a stage's forward 6.01 / 6, its backward the rest of half; rows of
    # 2000 tokens x 1000 bytes at 1 GB/s across the boundary.
    forward = 6.01 / 6
    times = one_f_one_b_parts([[StagePart((0,), (forward,) * 2, (6.01 / 2 - forward,) * 2, 2e-3)]], 2, 4)
    stage_ends = [times.backward_ends[0][0][k] for k in range(2)]
    backward = 6.01 / 2 - forward
    # Rank 0 on each stage: its buckets final over its last backward; ranks 1-3 have no pass.
    ends = [max(end + p.last_bucket, end - backward * (p.buckets - 1) / p.buckets + p.reduction, times.step + p.reduction)
            + p.after_reduction for end, p in zip(stage_ends, (first, last))]
    m = simulate(plan, cost, 4)
    assert m.step_time == pytest.approx(max(ends), rel=EXACT)
    assert m.waves_time == pytest.approx(times.step, rel=EXACT)
    waves = pipeline_lower_bound(cost, plan.samples)
    assert report_lower_bound(cost, plan.samples) == pytest.approx(max(waves + min(3.5 / 2 + 0.5 / 1, 1.25), 3.5, 1.25))
    assert m.lower_bound <= m.step_time


@pytest.mark.parametrize("sharding", Sharding.flagged())
def test_every_planner_steps_no_faster_than_the_whole_step_bound(sharding):
    cluster = get_cluster("cpu", 4)
    cost = get_cost_model("analytic", get_model_shape("tiny"), cluster, sharding=sharding,
                          mesh=JobMesh.of(cluster))
    assert cost.data_parallel.optimizer > 0 and (cost.data_parallel.reduction > 0) == (sharding is not Sharding.FSDP
                                                                                       or cost.data_parallel.buckets == 1)
    batch = [3000, 1500, 700, 300, 120, 60, 40, 9]
    for name in ("static", "ballast", "dcp", "zeppelin", "flexsp"):
        plan = get_planner(name, cluster, cost, PlannerOptions(max_len=4096, time_limit=2.0)).plan(batch)
        m = simulate(plan, cost, cluster.world_size)
        assert m.step_time == pytest.approx(m.waves_time + m.sync_time + m.optimizer_time, rel=EXACT)
        assert m.sync_time >= cost.data_parallel.last_bucket - 1e-12
        assert m.step_time >= m.lower_bound * (1 - 1e-9), name


def test_no_planner_beats_the_fsdp_bound_where_the_gathers_outlast_the_passes():
    # llama3-8b under FSDP2 on 32 H100s: a pass's gathers (0.31 s forward, 0.91 s backward) are
    # longer than short sequences' passes, so the plans pay for them and the bound charges them.
    cluster = get_cluster("h100-32")
    cost = get_cost_model("analytic", get_model_shape("llama3-8b"), cluster)
    assert cost.device.sharding is Sharding.FSDP and cost.data_parallel.backward_collectives > 0.5
    batch = [65_536, 20_000, 9_000, 4_000, 2_000, 1_000, 500, 300] * 4
    for name in ("static", "batch-adaptive", "bucket", "megatron-dynamic-cp", "dcp", "hydraulis", "zeppelin",
                 "wlb-llm", "ballast"):
        plan = get_planner(name, cluster, cost, PlannerOptions(max_len=65_536)).plan(batch)
        m = simulate(plan, cost, cluster.world_size)
        assert m.step_time >= m.lower_bound * (1 - 1e-9), name
