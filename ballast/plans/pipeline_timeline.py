"""A plan priced as a pipeline (`timeline.py`'s module docstring): its micro-batches in the
slots' order (`Plan.slots`), each group's on every stage at the cost model's seconds / p split
into forward and backward (`pipeline.stage_passes`), with each stage's FSDP2 gathers around
them, its rows crossing each boundary at the stages' bandwidth, through the 1F1B schedule
simulated exactly (`pipeline.one_f_one_b_parts`); then each stage's gradient sync over its own
pool and optimizer step (`pricing/whole_step.py`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..pricing.cost import CostModel
from ..pricing.pipeline import PipelineTimes, StagePart, one_f_one_b_parts, stage_passes, transfer_seconds
from ..pricing.stages import StagePrices
from ..pricing.whole_step import NOTHING, DataParallelPrices
from .pass_times import nic_bytes, work_time
from .plan import Group, Plan
from .step_metrics import Segment, StepMetrics


@dataclass(frozen=True)
class StagedMicroBatch:
    """A group's micro-batch in a pipeline slot, as the 1F1B schedule prices it."""

    wave: int
    position: int
    """Its index among its group's micro-batches."""
    group: Group
    comm_share: float
    """The share of its seconds spent in exchanges."""
    part: StagePart


def pipelined(plan: Plan, cost: CostModel) -> bool:
    """Whether `plan` runs as a pipeline under `cost`: made for p > 1 stages, or priced under a
    cost model of them (a planner's plan in the making has p = 1 until `Planner.plan` stamps it)."""
    return plan.pp > 1 or cost.stages is not None


def pipeline_times(plan: Plan, cost: CostModel) -> PipelineTimes:
    """The 1F1B step of a plan over the cost model's pipeline and pool (module docstring)."""
    stages = _stages(plan, cost)
    return one_f_one_b_parts([[s.part for s in slot] for slot in _staged(plan, cost)], stages.count, cost.world_size)


def _staged(plan: Plan, cost: CostModel) -> list[list[StagedMicroBatch]]:
    """Every slot's micro-batches that hold tokens, priced per stage."""
    stages = _stages(plan, cost)
    out = []
    for w, i, parts in plan.slots():
        routed = plan.waves[w].routed
        slot = []
        for group, mb in parts:
            if not mb.seq_ids:
                continue
            compute, comm = work_time(plan, mb, group, cost, routed)
            plain = (sum(work_time(plan, dataclasses.replace(mb, recompute=0.0), group, cost, routed))
                     if mb.recompute else compute + comm)
            passes = [price.passes(*stage_passes(compute + comm, plain, stages.count)) for price in _stage_prices(stages)]
            moved = transfer_seconds(sum(plan.mb_lengths(mb)), group.degree, stages.hidden, stages.bandwidth,
                                     stages.latency)
            part = StagePart(tuple(group.ranks), tuple(f for f, _ in passes), tuple(b for _, b in passes), moved)
            slot.append(StagedMicroBatch(w, i, group, comm / (compute + comm) if compute + comm > 0 else 0.0, part))
        out.append(slot)
    return out


def _stage_prices(stages: StagePrices) -> tuple[DataParallelPrices, ...]:
    """Each stage's data-parallel prices (none priced: NOTHING on every stage)."""
    return stages.data_parallel or (NOTHING,) * stages.count


def _stages(plan: Plan, cost: CostModel) -> StagePrices:
    if cost.stages is None or plan.pp not in (1, cost.stages.count):
        priced = cost.stages.count if cost.stages is not None else 1
        raise ValueError(f"plan {plan.planner!r} runs {plan.pp} pipeline stages, but the cost model prices {priced}")
    return cost.stages


def simulate_pipeline(plan: Plan, cost: CostModel, world_size: int, timeline: bool) -> StepMetrics:
    """`simulate` of a plan of PP degree p > 1 (module docstring)."""
    staged = _staged(plan, cost)
    stages = _stages(plan, cost)
    p = stages.count
    times = one_f_one_b_parts([[s.part for s in slot] for slot in staged], p, world_size)
    busy, comm_time = np.zeros(world_size), np.zeros(world_size)
    segments: list[Segment] = []
    last_backward: list[list[tuple[float, float] | None]] = [[None] * world_size for _ in range(p)]
    for i, slot in enumerate(staged):
        for j, s in enumerate(slot):
            ranks = slice(s.group.start, s.group.start + s.group.degree)
            seconds = s.part.forward[0] + s.part.backward[0]
            busy[ranks] += seconds
            comm_time[ranks] += s.comm_share * seconds
            for k in range(p):
                last = (times.backward_ends[i][j][k], s.part.backward[k])
                for r in s.part.lanes:
                    if last_backward[k][r] is None or last_backward[k][r][0] < last[0]:
                        last_backward[k][r] = last
            for k in range(p) if timeline else ():
                for forward, end, length in ((True, times.forward_ends[i][j][k], s.part.forward[k]),
                                             (False, times.backward_ends[i][j][k], s.part.backward[k])):
                    segments.append(Segment(s.wave, s.group.start, s.group.degree, s.position, end - length,
                                            (1 - s.comm_share) * length, s.comm_share * length, k, forward))
    prices = _stage_prices(stages)
    synced = [price.reduction_end(lasts, times.step) for price, lasts in zip(prices, last_backward)]
    step = max(end + price.after_reduction for end, price in zip(synced, prices))
    sync = max(synced) - times.step
    return StepMetrics(step, plan.tokens, 0.0, busy, comm_time,
                       [times.step], segments, nic_bytes(plan, cost) / p, times.bubble, sync_time=sync,
                       optimizer_time=step - times.step - sync)
