"""The training loop of `ballast train`, run by every rank of an initialised job.

    data -> plan (one step ahead, rank 0) -> broadcast -> executor step -> metrics, checkpoint

Rank 0 owns the data stream and the planner (`Lookahead`); each step it broadcasts the plan
and the batch's tokens, every rank runs its part of the plan (`Executor.step`: waves, grad
all-reduce, AdamW), and rank 0 logs the step. The gradient of a step does not depend on the
plan (the executor's loss is summed per token over the global batch), so any planner trains
the same model from the same seed: planners change the speed, not the loss curve. The one
exception is by choice: wlb-llm, and ballast under a pipeline, hold outliers for later steps
(`planners/held.py`; --no-defer-outliers turns it off), which changes the batches themselves.
"""
from __future__ import annotations

import json
import math
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist
from rich.console import Console

from ..command_line.options import AUTO_STRATEGIES
from ..command_line.provenance import provenance
from ..dataset import BatchStream, ClipStream
from ..plans.plan import Plan
from ..plans.strategy_plan import StrategyPlan
from ..planners import Planner
from ..planners.held import DeferredSamples
from ..runtime import PeerFailed, StepResult, broadcast_plan, rank_device
from ..runtime.executor import Executor
from ..runtime.strategy import StrategyExecutor
from . import checkpoint, checkpoint_files
from .hf_folder import export_model, folder_loader
from .ahead import Lookahead, StepInput, load_data_state
from .config import OptimizerConfig, TrainConfig
from .nonfinite import nonfinite_step, nothing_trained
from .resume import checkpoint_to_resume, say_what_changed
from .metrics import MetricsLog, ProgressDisplay, StepRecord, final_history, plan_facts, summarise
from .plots import write_report
from .setup import Setup, make_executor, make_planner, open_data, with_proposed_strategies

FAULT_AT_STEP = "BALLAST_FAULT_AT_STEP"
"""Testing aid: on torchrun's first attempt rank 1 fails in the middle of this step."""
FAULT_KIND = "BALLAST_FAULT_KIND"
"""How it fails: `kill` (SIGKILL, the default) or `raise` (a RuntimeError)."""

SETUP_TIMEOUT = timedelta(hours=24)
"""How long the other ranks wait for rank 0 to prepare the data (`from_rank0`)."""

T = TypeVar("T")


def learning_rate(step: int, steps: int, opt: OptimizerConfig) -> float:
    """Linear warm-up to `lr`, then cosine decay to `final_lr` at `decay_steps` (default: the
    run's last step), as nanoGPT does."""
    if step < opt.warmup_steps:
        return opt.lr * (step + 1) / opt.warmup_steps
    end = opt.decay_steps or steps
    progress = (step - opt.warmup_steps) / max(1, end - 1 - opt.warmup_steps)
    return opt.final_lr + 0.5 * (opt.lr - opt.final_lr) * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train(config: TrainConfig) -> dict | None:
    """Train as the config says on the current torch.distributed job; rank 0 returns the summary."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    console = Console(soft_wrap=True)
    out = Path(config.run.out_dir)
    origin = provenance() if rank == 0 else None
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    if config.planner.strategy == AUTO_STRATEGIES:  # proposed once, by rank 0, from the training data
        _, config = from_rank0(lambda: (None, with_proposed_strategies(config, world, gpu_name, console)))
    setup = Setup.of(config, world, gpu_name)

    # Data, planner and the checkpoint to resume from are rank 0's; the others learn only
    # whether that worked and where to resume.
    data, resume = from_rank0(lambda: _prepare_data(config, setup, world, console))

    opt = config.optimizer
    executor = make_executor(config, setup)
    optimizer = executor.optimizer
    start = 0
    if resume is not None:
        start = checkpoint.load(Path(resume), executor)["step"]
        if rank == 0:
            console.print(f"resumed from {resume} at step {start}", highlight=False)

    steps = config.run.steps
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(config.to_toml())
        lookahead = Lookahead(*data, steps, config.planner.plan_ahead)
        log = MetricsLog(out / "metrics.jsonl", fresh=start == 0)
        progress = ProgressDisplay(console, start, steps, config.run.log_interval)
        plans: dict[int, Plan | StrategyPlan] = {}
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    applied = 0  # steps whose optimizer step ran (every rank sees the same)
    try:
        for step in range(start, steps):
            _inject_fault(executor, step, rank, attempt)
            began = time.perf_counter()
            item, failure = _next_input(lookahead, step) if rank == 0 else (None, None)
            waited = time.perf_counter() - began
            plan, samples = broadcast_plan(failure or (item and item.plan), item and item.batch.samples)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, steps, opt)
            result = executor.step(plan, samples)
            applied += result.applied
            if not result.applied:
                nonfinite_step(step, steps, result, item, lookahead.stream if rank == 0 else None,
                               opt.skip_nonfinite, console)
            idle = _idle(result, device)
            seconds = time.perf_counter() - began
            if rank == 0:
                record = _record(step, attempt, item, result, idle, seconds, waited,
                                 optimizer.param_groups[0]["lr"], setup.mesh.pp)
                log.write(record)
                progress.update(record)
                plans[step] = plan
            interval = config.checkpoint.checkpoint_interval
            if step + 1 == steps or (interval and (step + 1) % interval == 0):
                meta = None if rank != 0 else {"data": item.data_state, "planner": item.planner_state,
                                               "model": checkpoint_files.model_record(setup.shape),
                                               "config": config.to_dict()}
                checkpoint.save(config.checkpoint_path, step + 1, executor, meta, config.checkpoint.keep_checkpoints)
    finally:
        if rank == 0:
            lookahead.close()
            progress.close()
    nothing_trained(start, steps, applied, rank)
    # Collective: the parameters are gathered to rank 0, which writes the folder.
    hf_model = export_model(executor, setup.shape, setup.tokenizer, out,
                            {"steps": steps, "data": config.data.source, "seed": config.run.seed})
    if rank != 0:
        return None
    history = final_history(out / "metrics.jsonl")
    summary = summarise(history)
    mesh = setup.mesh
    title = (f"{config.planner.planner} planner, {setup.shape.name}, {world} ranks"
             f"{f' ({mesh.describe()})' if mesh.tp * mesh.pp > 1 else ''}")
    paths = {}
    if config.run.report:
        paths = write_report(out / "report", history, {k: p for k, p in plans.items() if isinstance(p, Plan)},
                             setup.cost, mesh.pool, title)
    (out / "report").mkdir(parents=True, exist_ok=True)
    summary.update(planner=config.planner.planner, world=world, cost_model=setup.cost.source,
                   metrics=str(out / "metrics.jsonl"), report={k: str(v) for k, v in paths.items()},
                   checkpoint=str(checkpoint_files.latest(config.checkpoint_path)),
                   hf_model=None if hf_model is None else str(hf_model),
                   hf_model_loader=None if hf_model is None else folder_loader(setup.shape))
    (out / "report" / "summary.json").write_text(json.dumps({**summary, "provenance": origin}, indent=1))
    return summary


def from_rank0(prepare: Callable[[], tuple[T, Any]]) -> tuple[T | None, Any]:
    """Run `prepare` -> (private, shared) on rank 0 alone; rank 0 gets both, the other ranks
    (None, shared). An exception in `prepare` stops every rank: rank 0 raises it, the others
    `PeerFailed`, so a bad corpus stops the job instead of leaving the others waiting.

    The others wait in a broadcast over a gloo group of its own, bounded by SETUP_TIMEOUT and
    not by the collective timeout (--timeout): under torchrun rank 0 tokenises the corpus in
    `prepare` (local runs tokenise before spawning the ranks), which may take hours where a
    step's collective should take seconds. A rank 0 that dies instead of raising does not keep
    them waiting that long: torchrun's agent, or `run_local`, then stops every rank.
    """
    group = dist.new_group(backend="gloo", timeout=SETUP_TIMEOUT)
    private, shared, failure = None, None, None
    if dist.get_rank() == 0:
        try:
            private, shared = prepare()
        except Exception as e:
            failure = e
    payload = [(None if failure is None else PeerFailed.describe(0, failure), shared)]
    try:
        dist.broadcast_object_list(payload, src=0, group=group)
    finally:
        dist.destroy_process_group(group)
    reported, shared = payload[0]
    PeerFailed.raise_for(reported, failure)
    return private, shared


def _prepare_data(config: TrainConfig, setup: Setup, world: int, console: Console
                  ) -> tuple[tuple[BatchStream | ClipStream, Planner, DeferredSamples], str | None]:
    """Rank 0's ((stream, planner, samples held for later steps), checkpoint to resume from), all
    at the resumed position."""
    resume = checkpoint_to_resume(config, console)
    meta = None if resume is None else checkpoint_files.read_meta(Path(resume))
    if meta is not None:  # another model fails here, before anything of the checkpoint is used
        checkpoint_files.check_same_model(Path(resume), meta, setup.shape)
        say_what_changed(Path(resume), meta, config, world, console)
    stream, described = open_data(config, setup.shape, setup.tokenizer, progress=True)
    planner, held = make_planner(config, setup), DeferredSamples()
    if meta is not None:  # a position of other data or another seed fails here, on every rank
        load_data_state(stream, held, meta["data"])
        planner.load_state_dict(meta["planner"])
    console.print(described, highlight=False)
    console.print(setup.describe(), highlight=False)
    return (stream, planner, held), resume


def _next_input(lookahead: Lookahead, step: int) -> tuple[StepInput | None, Exception | None]:
    """Rank 0's input for `step`, or the error that kept it from drawing or planning the batch:
    the error is broadcast in the plan's place, so every rank stops with it (`broadcast_plan`)."""
    try:
        return lookahead.get(step), None
    except Exception as e:
        return None, e


def _inject_fault(executor: Executor | StrategyExecutor, step: int, rank: int, attempt: int) -> None:
    """FAULT_AT_STEP: rank 1 fails right after its first forward pass of the step, so mid-step,
    holding activations and with its peers in (or on their way into) collectives with it.
    `kill`: by SIGKILL, without any Python clean-up, the way a process is lost to the OOM killer
    or a failing node (a cooperative exit at a step boundary would not test that). `raise`: by
    an exception, the way a defect surfaces; the job must end with that rank's error."""
    if os.environ.get(FAULT_AT_STEP) != str(step) or rank != 1 or attempt != 0:
        return
    if not isinstance(executor, Executor):
        raise ValueError(f"{FAULT_AT_STEP}: a strategy run builds its model each step; faults are injected into "
                         f"runs of one mesh only")
    kind = os.environ.get(FAULT_KIND, "kill")

    def fail(*_: object) -> None:
        if kind == "raise":
            raise RuntimeError(f"{FAULT_AT_STEP}={step}: rank 1 raised after its first forward pass of the step")
        print(f"rank 1: {FAULT_AT_STEP}={step}: SIGKILL after its first forward pass of the step", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    executor.model.register_forward_hook(fail)


def _idle(result: StepResult, device: torch.device) -> tuple[float, list[float]]:
    """Idle share of all ranks' wave time, and of each rank's: every rank's (busy, wait) over
    the step's waves, gathered by one all-reduce (each rank fills its own row)."""
    times = torch.zeros(dist.get_world_size(), 2, dtype=torch.float64, device=device)
    times[dist.get_rank()] = torch.tensor([sum(w.busy for w in result.waves),
                                           sum(w.wait for w in result.waves)], dtype=torch.float64)
    dist.all_reduce(times)
    times = times.cpu()
    overall = float(times[:, 1].sum() / times.sum().clamp_min(1e-12))
    return overall, (times[:, 1] / times.sum(dim=1).clamp_min(1e-12)).tolist()


def _record(step: int, attempt: int, item: StepInput, result: StepResult,
            idle: tuple[float, list[float]], seconds: float, waited: float, lr: float, stages: int) -> StepRecord:
    plan = item.plan
    return StepRecord(
        step=step, attempt=attempt, planner=plan.planner, loss=result.loss, grad_norm=result.grad_norm, skipped=not result.applied,
        lr=lr, tokens=plan.tokens,
        sample_ids=item.batch.sample_ids, lengths=item.batch.lengths, epoch=item.batch.epoch, held=item.held,
        step_time=seconds, tokens_per_s=plan.tokens / seconds, predicted_step_time=item.predicted_seconds,
        idle_fraction=idle[0], rank_idle=idle[1], plan_ms=1e3 * item.plan_seconds, plan_wait_ms=1e3 * waited,
        **plan_facts(plan, stages))
