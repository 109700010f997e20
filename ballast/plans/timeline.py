"""Simulate a plan under a cost model: per-rank timeline, step time and the step's metrics.

Groups of a wave run independently and the wave ends with its slowest group. A lockstep plan
(FSDP/ZeRO-3) also synchronises every micro-batch index across the wave's groups, because
each forward all-gathers parameters with every rank: micro-batch i of the wave ends when the
slowest group's micro-batch i ends.

A remap domain of a wave (Zeppelin's remapping layer, `Wave.remap`) runs its groups slot by
slot with linear work spread evenly over its ranks; `remapping.slot_time` prices its slots,
and every group of the domain is busy for all of each one.

A plan priced under a cost model of p > 1 stages (`cost.stages`: made for them, or being made
by a planner under it, whose `Planner.plan` stamps p on it) runs as a pipeline
(`runtime/pipeline`): its micro-batches in the
slots' order (`Plan.slots`), each group's on every stage at the cost model's seconds / p split
into forward and backward (`pipeline.stage_passes`), its rows crossing each boundary at the
stages' bandwidth, through the 1F1B schedule simulated exactly (`pipeline.one_f_one_b_parts`):
waves are no barriers there, and the step is the schedule's. Its ranks' busy seconds are a
stage's, its Gantt segments every stage's passes, its bound the pipeline's
(`pipeline_bound.pipeline_lower_bound`: a stage's share of the work and the bubble no order
avoids).

Every step also runs what its data-parallel sharding costs besides the passes' work
(`cost.data_parallel`, `pricing/whole_step.py`): FSDP2's gathers lengthen a pass they outlast
(in the waves, so planners that compare `step_time` see them), and after the waves the gradient
reduction's part that the ranks' last backwards did not hide, then the optimizer step. So
`simulate`'s step is the whole step, its bound the whole step's (`report_lower_bound`);
`step_time`, what planners compare, is the waves' (or the pipeline's schedule): the reduction
and the optimizer after them are the same for every plan but for the overlap.
"""
from __future__ import annotations

import numpy as np

from ..pricing.cost import CostModel
from ..pricing.pipeline_bound import report_lower_bound
from .pass_times import backward_seconds, nic_bytes, wave_passes, wave_time
from .pipeline_timeline import pipeline_times, pipelined, simulate_pipeline
from .plan import Plan
from .step_metrics import Segment, StepMetrics

__all__ = ["Segment", "StepMetrics", "nic_bytes", "pipelined", "simulate", "step_time", "wave_time", "whole_step_time"]


def simulate(plan: Plan, cost: CostModel, world_size: int, timeline: bool = False) -> StepMetrics:
    """Run `plan` under `cost`; keep every micro-batch's Segment when `timeline` is set."""
    metrics = _run(plan, cost, world_size, timeline)
    metrics.lower_bound = report_lower_bound(cost, plan.samples)
    return metrics


def whole_step_time(plan: Plan, cost: CostModel) -> float:
    """`simulate`'s whole step alone, on the cost model's ranks (what `train` predicts a step at)."""
    return _run(plan, cost, cost.world_size, False).step_time


def _run(plan: Plan, cost: CostModel, world_size: int, timeline: bool) -> StepMetrics:
    """`simulate` but for the bound (0 here)."""
    if pipelined(plan, cost):
        return simulate_pipeline(plan, cost, world_size, timeline)
    busy = np.zeros(world_size)
    comm_time = np.zeros(world_size)
    segments: list[Segment] = []
    wave_times: list[float] = []
    lasts: list[tuple[float, float] | None] = [None] * world_size
    clock = 0.0
    for w, wave in enumerate(plan.waves):
        passes = wave_passes(plan, wave, cost)
        if plan.lockstep:
            depth = max((len(d) for d in passes), default=0)
            slot_ends = np.cumsum([max((sum(d[m]) for d in passes if m < len(d)), default=0.0)
                                   for m in range(depth)])
            slot_begins = np.concatenate([[0.0], slot_ends[:-1]]) if depth else np.zeros(0)
            wave_seconds = float(slot_ends[-1]) if depth else 0.0
        else:
            wave_seconds = max((sum(map(sum, d)) for d in passes), default=0.0)
        for g, (group, durs) in enumerate(zip(wave.groups, passes)):
            t = 0.0
            for m, (compute, comm) in enumerate(durs):
                begin = float(slot_begins[m]) if plan.lockstep else t
                if timeline:
                    segments.append(Segment(w, group.start, group.degree, m, clock + begin, compute, comm))
                t = begin + compute + comm
                busy[group.start:group.start + group.degree] += compute + comm
                comm_time[group.start:group.start + group.degree] += comm
            if durs:
                last = (clock + t, backward_seconds(plan, wave, g, cost, sum(durs[-1])))
                lasts[group.start:group.start + group.degree] = [last] * group.degree
        wave_times.append(wave_seconds)
        clock += wave_seconds
    dp = cost.data_parallel
    synced = dp.reduction_end(lasts, clock)
    return StepMetrics(synced + dp.after_reduction, plan.tokens, 0.0, busy,
                       comm_time, wave_times, segments, nic_bytes(plan, cost), sync_time=synced - clock,
                       optimizer_time=dp.after_reduction)


def step_time(plan: Plan, cost: CostModel) -> float:
    """The plan's waves (a pipeline's 1F1B schedule) under `cost`: what planners compare (the
    module docstring says why not the whole step)."""
    if pipelined(plan, cost):
        return pipeline_times(plan, cost).step
    return sum(wave_time(plan, wave, cost) for wave in plan.waves)
