"""Simulate a plan under a cost model: per-rank timeline, step time and the step's metrics.

Groups of a wave run independently and the wave ends with its slowest group. A lockstep plan
(FSDP/ZeRO-3) also synchronises every micro-batch index across the wave's groups, because
each forward all-gathers parameters with every rank: micro-batch i of the wave ends when the
slowest group's micro-batch i ends.

A remap domain of a wave (Zeppelin's remapping layer, `Wave.remap`) runs its groups slot by
slot with linear work spread evenly over its ranks; `remapping.slot_time` prices its slots,
and every group of the domain is busy for all of each one.

A plan of PP degree p > 1 runs as a pipeline (`runtime/pipeline`): its micro-batches in the
slots' order (`Plan.slots`), each group's on every stage at the cost model's seconds / p split
into forward and backward (`pipeline.stage_passes`), its rows crossing each boundary at the
stages' bandwidth, through the 1F1B schedule simulated exactly (`pipeline.one_f_one_b_parts`):
waves are no barriers there, and the step is the schedule's. Its ranks' busy seconds are a
stage's, its Gantt segments the first stage's passes, its bound the plain one / p (no bubble
term).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..pricing.bounds import uncapped_lower_bound
from ..pricing.cost import CostModel
from ..pricing.pipeline import PipelineTimes, StagePart, one_f_one_b_parts, stage_passes, transfer_seconds
from ..pricing.stages import StagePrices
from .plan import Group, MicroBatch, Plan, Wave
from ..pricing.nics import crosses_nodes, exchange_surcharge, group_nic_bytes, move_load
from ..pricing.remapping import slot_time, slot_tokens


@dataclass
class Segment:
    """One micro-batch on one group's ranks in the timeline."""

    wave: int
    start_rank: int
    degree: int
    micro_batch: int
    begin: float
    compute: float
    """Seconds of computation (including the fixed per-micro-batch overhead)."""
    comm: float
    """Seconds of all-to-all communication."""

    @property
    def end(self) -> float:
        return self.begin + self.compute + self.comm


@dataclass
class StepMetrics:
    step_time: float
    tokens: int
    lower_bound: float
    busy: np.ndarray
    """Seconds each rank spends computing or communicating."""
    comm: np.ndarray
    """Seconds each rank spends in all-to-alls."""
    wave_times: list[float]
    segments: list[Segment] = field(default_factory=list)
    nic_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Bytes each NIC of the cluster sends in the step (`nic_bytes`; none on one node)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time if self.step_time > 0 else 0.0

    @property
    def idle_fraction(self) -> float:
        if self.step_time <= 0:
            return 0.0
        return max(0.0, 1.0 - float(self.busy.sum()) / (len(self.busy) * self.step_time))

    @property
    def vs_lower_bound(self) -> float:
        return self.step_time / self.lower_bound if self.lower_bound > 0 else 1.0


def simulate(plan: Plan, cost: CostModel, world_size: int, timeline: bool = False) -> StepMetrics:
    """Run `plan` under `cost`; keep every micro-batch's Segment when `timeline` is set."""
    if plan.pp > 1:
        return _simulate_pipeline(plan, cost, world_size, timeline)
    busy = np.zeros(world_size)
    comm_time = np.zeros(world_size)
    segments: list[Segment] = []
    wave_times: list[float] = []
    clock = 0.0
    for w, wave in enumerate(plan.waves):
        durations = _durations(plan, wave, cost)
        if plan.lockstep:
            depth = max((len(d) for d in durations), default=0)
            slot_ends = np.cumsum([max((sum(d[m]) for d in durations if m < len(d)), default=0.0)
                                   for m in range(depth)])
            slot_begins = np.concatenate([[0.0], slot_ends[:-1]]) if depth else np.zeros(0)
            wave_time = float(slot_ends[-1]) if depth else 0.0
        else:
            wave_time = max((sum(map(sum, d)) for d in durations), default=0.0)
        for group, durs in zip(wave.groups, durations):
            t = 0.0
            for m, (compute, comm) in enumerate(durs):
                begin = float(slot_begins[m]) if plan.lockstep else t
                if timeline:
                    segments.append(Segment(w, group.start, group.degree, m, clock + begin, compute, comm))
                t = begin + compute + comm
                busy[group.start:group.start + group.degree] += compute + comm
                comm_time[group.start:group.start + group.degree] += comm
        wave_times.append(wave_time)
        clock += wave_time
    lower = uncapped_lower_bound(cost, plan.samples)
    return StepMetrics(clock, plan.tokens, lower, busy, comm_time, wave_times, segments, nic_bytes(plan, cost))


def nic_bytes(plan: Plan, cost: CostModel) -> np.ndarray:
    """Bytes each NIC of `cost.network` sends in the plan's step (global NIC order,
    `Cluster.nic_of`): the exchanges of every group wider than a node and the token moves of
    every remap domain wider than a node, routed where their wave is. Empty without NICs to load."""
    network = cost.network
    if network is None or network.nodes == 1:
        return np.zeros(0)
    sent = np.zeros(network.nics)
    for wave in plan.waves:
        for group in wave.groups:
            if crosses_nodes(cost, group.degree):
                for mb in group.micro_batches:
                    sent += group_nic_bytes(cost, group.start, group.degree, group.cp, sum(plan.mb_lengths(mb)),
                                            wave.routed)
        for start, size in wave.remap:
            if crosses_nodes(cost, size):
                for parts in plan.slot_parts(wave, start, size):
                    sent += move_load(cost, slot_tokens(parts, start, size), start, wave.routed).sent
    return sent


def step_time(plan: Plan, cost: CostModel) -> float:
    """The simulated step time alone (what planners compare)."""
    if plan.pp > 1:
        return pipeline_times(plan, cost).step
    return sum(wave_time(plan, wave, cost) for wave in plan.waves)


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


def pipeline_times(plan: Plan, cost: CostModel) -> PipelineTimes:
    """The 1F1B step of a plan of PP degree p > 1 over the cost model's pool (module docstring)."""
    return one_f_one_b_parts([[s.part for s in slot] for slot in _staged(plan, cost)], plan.pp, cost.world_size)


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
            compute, comm = _mb_time(plan, mb, group, cost, routed)
            plain = sum(_mb_time(plan, dataclasses.replace(mb, recompute=0.0), group, cost, routed))
            forward, backward = stage_passes(compute + comm, plain, stages.count)
            moved = transfer_seconds(sum(plan.mb_lengths(mb)), group.degree, stages.hidden, stages.bandwidth,
                                     stages.latency)
            part = StagePart(tuple(group.ranks), (forward,) * stages.count, (backward,) * stages.count, moved)
            slot.append(StagedMicroBatch(w, i, group, comm / (compute + comm) if compute + comm > 0 else 0.0, part))
        out.append(slot)
    return out


def _stages(plan: Plan, cost: CostModel) -> StagePrices:
    if cost.stages is None or cost.stages.count != plan.pp:
        priced = cost.stages.count if cost.stages is not None else 1
        raise ValueError(f"plan {plan.planner!r} runs {plan.pp} pipeline stages, but the cost model prices {priced}")
    return cost.stages


def _simulate_pipeline(plan: Plan, cost: CostModel, world_size: int, timeline: bool) -> StepMetrics:
    """`simulate` of a plan of PP degree p > 1 (module docstring)."""
    staged = _staged(plan, cost)
    times = one_f_one_b_parts([[s.part for s in slot] for slot in staged], plan.pp, world_size)
    busy, comm_time = np.zeros(world_size), np.zeros(world_size)
    segments: list[Segment] = []
    for i, slot in enumerate(staged):
        for j, s in enumerate(slot):
            ranks = slice(s.group.start, s.group.start + s.group.degree)
            seconds = s.part.forward[0] + s.part.backward[0]
            busy[ranks] += seconds
            comm_time[ranks] += s.comm_share * seconds
            for end, length in ((times.forward_ends[i][j][0], s.part.forward[0]),
                                (times.backward_ends[i][j][0], s.part.backward[0])) if timeline else ():
                segments.append(Segment(s.wave, s.group.start, s.group.degree, s.position, end - length,
                                        (1 - s.comm_share) * length, s.comm_share * length))
    lower = uncapped_lower_bound(cost, plan.samples) / plan.pp
    return StepMetrics(times.step, plan.tokens, lower, busy, comm_time, [times.step], segments,
                       nic_bytes(plan, cost) / plan.pp)


def wave_time(plan: Plan, wave: Wave, cost: CostModel) -> float:
    durations = [[sum(d) for d in group] for group in _durations(plan, wave, cost)]
    if plan.lockstep:
        depth = max((len(d) for d in durations), default=0)
        return sum(max(d[m] for d in durations if m < len(d)) for m in range(depth))
    return max((sum(d) for d in durations), default=0.0)


def _durations(plan: Plan, wave: Wave, cost: CostModel) -> list[list[tuple[float, float]]]:
    """[g][m] = (compute, comm) of group g's micro-batch m (in a remap domain: of slot m)."""
    durations = [[_mb_time(plan, mb, g, cost, wave.routed) for mb in g.micro_batches] for g in wave.groups]
    for start, size in wave.remap:
        slots = [slot_time(cost, parts, start, size, wave.routed) for parts in plan.slot_parts(wave, start, size)]
        for i in (i for i, g in enumerate(wave.groups) if start <= g.start < start + size):
            durations[i] = slots
    return durations


def _mb_time(plan: Plan, mb: MicroBatch, group: Group, cost: CostModel, routed: bool) -> tuple[float, float]:
    if not mb.seq_ids:
        # A lockstep filler: no tokens, but the forward still joins the parameter gathers.
        return cost.g, 0.0
    compute, comm = cost.split_time(plan.mb_samples(mb), group.degree, mb.recompute, group.cp)
    if crosses_nodes(cost, group.degree):
        comm += exchange_surcharge(cost, group.degree, group.cp, sum(plan.mb_lengths(mb)), routed, mb.recompute)
    return compute, comm
