"""The benchmark's rank loop: one job in which every rank runs every planner's steps, each rank
on its device (`runtime.rank_device`: under NCCL the GPU LOCAL_RANK names).

The ranks are spawned once for the whole benchmark (spawning per planner would put the start-up
of the job, and a colder machine, into some planners' numbers and not others'). Each planner
trains its own copy of the model, from the same seed, on the same batches: planners change
the speed of a step, not its gradient, so the copies stay equal up to float rounding and every
planner's steps cost what they would cost in that planner's own run.

For every slot of the schedule, rank 0 plans the batch (timed: that is the planning time) and
broadcasts the plan; a barrier lines the ranks up; every rank times `Executor.step` and its
own CPU time; one all-reduce then brings every rank's timings to rank 0, and one all-gather
every rank's micro-batch seconds, which rank 0 keeps in the record.
A batch is planned once per planner: later rounds rerun the same plan, so their spread is the
machine's noise, not a randomised planner's.

The profile's reference points (`BenchInputs.references`) run on a model copy of their own,
once before the schedule (their first run pays the allocator's first touch) and then each
once per round after its step (`setting.reference_steps`); one all-gather brings every rank's
micro-batch seconds to rank 0.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..vocabulary.clip import Clip
from ..dataset import GlobalBatch
from ..models import build_model
from ..plans.plan import Plan, degree_splits
from ..planners import Planner, get_planner
from ..profile.measure import plan_samples, point_plan
from ..profile.rounds import RankWave, micro_batch_seconds, rank_waves
from ..runtime import Executor, ProcessGroups, StepResult, broadcast_plan, parallelize, rank_device
from ..plans.timeline import step_time
from .setting import BenchInputs, BenchSetting, Slot, reference_steps, schedule

LEARNING_RATE = 1e-3
TIMINGS = ("wall", "busy", "wait", "sync", "optimizer", "cpu", "digest")
"""Per rank and slot: the step's wall seconds, the waves' busy and wait seconds, gradient sync,
optimizer, the process's CPU seconds during the step, and a checksum of the tokens it trained on."""


def batch_digest(samples: list) -> float:
    """A checksum of a batch's samples and their order: token ids (exact in float64 for any real
    batch), or a clip's latent values and key."""
    return float(sum((i + 1) * _sample_sum(s) for i, s in enumerate(samples)))


def _sample_sum(sample: torch.Tensor | Clip) -> float:
    if isinstance(sample, Clip):
        return float(sample.latent.double().sum()) + sample.key % 2 ** 20
    return int(sample.sum())


def run_on_rank(inputs: BenchInputs, setting: BenchSetting) -> tuple[list[dict], list[list[list[float]]]] | None:
    """Run the whole schedule on this rank. Rank 0 returns one record per slot, and per reference
    point its micro-batch seconds per measured round and rank (`drift.machine_drift`'s input);
    the others None."""
    rank = dist.get_rank()
    groups = ProcessGroups()
    executors = {name: _executor(inputs, groups, setting) for name in setting.planners}
    planners = make_planners(inputs, setting) if rank == 0 else {}
    references = References(inputs, groups, setting)
    plans: dict[tuple[str, int], Plan] = {}
    records = []
    for slot in schedule(setting.planners, setting.steps, setting.warmup, setting.repeats):
        plan, plan_seconds, failure = None, None, None
        if rank == 0:
            try:
                plan, plan_seconds = _plan(planners[slot.planner], plans, slot, inputs.batches[slot.batch])
            except Exception as e:  # sent in the plan's place: every rank stops with it
                failure = e
        plan, _ = broadcast_plan(failure or plan)
        samples = inputs.batches[slot.batch].samples
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        result = executors[slot.planner].step(plan, samples)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        timings = _gather(result, wall, cpu, batch_digest(samples))
        per_rank: list = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, rank_waves(result))
        if rank == 0:
            records.append(_record(slot, plan, plan_seconds, step_time(plan, inputs.cost), result, timings, per_rank))
        if slot.measured and slot.position == len(setting.planners) - 1:  # the step's last planner ran
            references.after_step(slot.step)
    return (records, references.seconds) if rank == 0 else None


class References:
    """The profile's reference points on this rank: their plans, samples and model copy, and what
    they measured (on rank 0: `seconds[i][r][k]`, point i's micro-batch seconds in round r on rank k)."""

    def __init__(self, inputs: BenchInputs, groups: ProcessGroups, setting: BenchSetting):
        world = dist.get_world_size()
        self.plans = [point_plan(m.point, world) for m in inputs.references]
        self.samples = [plan_samples(p, inputs.shape, setting.seed + i) for i, p in enumerate(self.plans)]
        self.after = reference_steps(setting.steps, len(self.plans))
        self.seconds: list[list[list[float]]] = [[] for _ in self.plans]
        self.executor = _executor(inputs, groups, setting) if self.plans else None
        for i in range(len(self.plans)):
            self._run(i)

    def after_step(self, step: int) -> None:
        """Run (and on rank 0 keep) the reference points that follow this measured step."""
        for i, after in enumerate(self.after):
            if after == step:
                seconds = self._run(i)
                if dist.get_rank() == 0:
                    self.seconds[i].append(seconds)

    def _run(self, i: int) -> list[float]:
        """Every rank's micro-batch seconds of one run of reference point i."""
        dist.barrier()
        result = self.executor.step(self.plans[i], self.samples[i])
        per_rank: list = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, micro_batch_seconds(result))
        return per_rank


def _executor(inputs: BenchInputs, groups: ProcessGroups, setting: BenchSetting) -> Executor:
    model = build_model(inputs.shape, setting.seed).to(rank_device())
    return parallelize(model, inputs.cluster, groups=groups, precision=setting.precision, lr=LEARNING_RATE)


def make_planners(inputs: BenchInputs, setting: BenchSetting) -> dict[str, Planner]:
    return {name: get_planner(name, inputs.cluster, inputs.cost, setting.planner) for name in setting.planners}


def _plan(planner: Planner, plans: dict[tuple[str, int], Plan], slot: Slot, batch: GlobalBatch
          ) -> tuple[Plan, float | None]:
    """The slot's plan, and the seconds it took when it was made now (None: made in an earlier round)."""
    key = (slot.planner, slot.batch)
    if key in plans:
        return plans[key], None
    start = time.perf_counter()
    plan = planner.plan(batch.planned)
    seconds = time.perf_counter() - start
    plan.validate(planner.cluster, planner.cost)
    plans[key] = plan
    return plan, seconds


def _gather(result: StepResult, wall: float, cpu: float, digest: float) -> torch.Tensor:
    """Every rank's TIMINGS as rows of one [world, len(TIMINGS)] tensor on the CPU, by one
    all-reduce on the rank's device (NCCL's must be its GPU)."""
    rows = torch.zeros(dist.get_world_size(), len(TIMINGS), dtype=torch.float64)
    rows[dist.get_rank()] = torch.tensor([
        wall, sum(w.busy for w in result.waves), sum(w.wait for w in result.waves), result.sync_seconds,
        result.optimizer_seconds, cpu, digest], dtype=torch.float64)
    rows = rows.to(rank_device())
    dist.all_reduce(rows)
    return rows.cpu()


def _record(slot: Slot, plan: Plan, plan_seconds: float | None, predicted: float, result: StepResult,
            rows: torch.Tensor, per_rank: list[list[RankWave]]) -> dict:
    """What the summary needs of one slot; per-rank lists where ranks differ (`rank_waves`: every
    rank's micro-batch seconds per wave, which the summary reduces one by one, `profile.rounds`)."""
    t = {name: rows[:, i].tolist() for i, name in enumerate(TIMINGS)}
    waves = [b + w for b, w in zip(t["busy"], t["wait"])]
    return dict(
        round=slot.round, step=slot.step, batch=slot.batch, planner=slot.planner, position=slot.position,
        tokens=plan.tokens, loss=result.loss,
        step_s=max(t["wall"]), waves_s=max(waves), predicted_s=predicted,
        idle=sum(t["wait"]) / max(1e-12, sum(waves)),
        sync_s=max(t["sync"]), optimizer_s=max(t["optimizer"]),
        cpu_share=sum(t["cpu"]) / max(1e-12, sum(t["wall"])),
        plan_ms=None if plan_seconds is None else 1e3 * plan_seconds,
        waves=len(plan.waves), micro_batches=plan.busy_micro_batches(), degrees=plan.degrees_used(),
        degree_splits=degree_splits([plan]),
        recomputed=plan.recomputed_fraction(),
        rank_busy_s=t["busy"], rank_wait_s=t["wait"], digests=t["digest"], rank_waves=per_rank)
