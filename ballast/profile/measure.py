"""Measuring grid points with the real runtime, on every rank of the job (local gloo ranks, or
torchrun's: NCCL on GPUs, where timings are taken around device synchronisations).

Each point runs as a one-wave plan through `Executor.step`: every aligned block of `degree`
ranks runs the same micro-batch shape, so all ranks are busy as in a real step (a lone rank
would have the machine's memory bandwidth to itself and look faster than it is). The
executor reports the micro-batch's forward + backward seconds and, with `measure_activations`,
the bytes saved for backward; the all-to-alls are timed where they happen, by wrapping
`torch.distributed.all_to_all_single` for the duration of the measurement.

A video model's points run clips (`models.gaussian_clips.gaussian_clips`: Gaussian latents of the
point's (frames, height, width) grids, a random label or caption), and their plans carry the grids (`Plan.shapes`),
which the executor checks against the model's view of every clip.

Rounds, not back-to-back repeats: a warm-up round over every point, then `repeats` rounds,
every depth in every round, each round in a shuffled order. The repeats of a point are spread
over the whole run, so a burst of load from another job on this shared machine touches one of
them and the median drops it, and a slow drift of the load touches all depths alike (the
extrapolation compares depths).
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from ..vocabulary.cluster import get_cluster
from ..pricing.cost import CostModel
from ..pricing.device_memory import ParameterCounts
from ..models import build_model
from ..models.gaussian_clips import gaussian_clips
from ..plans.plan import Group, MicroBatch, Plan, Wave
from ..vocabulary.model_shape import ModelShape
from .grid import Measurement, Point

if TYPE_CHECKING:
    from ..runtime.executor import Executor, StepResult

LEARNING_RATE = 1e-5
"""Steps do update the weights (the executor always steps the optimizer); keep them small."""


@dataclass
class CallCounter:
    """All-to-all calls seen inside `timed_all_to_alls`, their seconds and send bytes; those over
    the CP group among them again in `context`."""

    calls: int = 0
    seconds: float = 0.0
    bytes: int = 0
    context: CallCounter | None = None

    def add(self, seconds: float, sent: int) -> None:
        self.seconds += seconds
        self.calls += 1
        self.bytes += sent


def rank_device() -> torch.device:
    """Where this rank computes: its GPU under NCCL (`init_distributed` selected it), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: GPU kernels and NCCL calls return before they run."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def timed_all_to_alls(device: torch.device, context_group=None) -> Iterator[CallCounter]:
    """Count and time every `torch.distributed.all_to_all_single` call made inside the block;
    those over `context_group` (this rank's CP group, whose K, V gather and dK, dV
    reduce-scatter the runtime runs as all-to-alls) also in the counter's `context`."""
    counter, real = CallCounter(context=CallCounter()), dist.all_to_all_single

    def timed(output, input, *args, **kwargs):
        synchronize(device)
        start = time.perf_counter()
        work = real(output, input, *args, **kwargs)
        synchronize(device)
        seconds, sent = time.perf_counter() - start, input.numel() * input.element_size()
        counter.add(seconds, sent)
        if context_group is not None and kwargs.get("group") is context_group:
            counter.context.add(seconds, sent)
        return work

    dist.all_to_all_single = timed
    try:
        yield counter
    finally:
        dist.all_to_all_single = real


def point_plan(point: Point, world_size: int) -> Plan:
    """One wave; every block of `degree` ranks runs the point's micro-batch on its own copy (a
    remap point's wave is one remap domain over the world)."""
    m, copies = len(point.lengths), world_size // point.degree
    groups = [Group(g * point.degree, point.degree, [MicroBatch(list(range(g * m, (g + 1) * m)), point.recompute)],
                    cp=point.cp) for g in range(copies)]
    shapes = None if point.shapes is None else list(point.shapes) * copies
    wave = Wave(groups, remap=[(0, world_size)] if point.remap else [])
    return Plan(list(point.lengths) * copies, [wave], planner="profile", shapes=shapes)


def random_samples(lengths: Sequence[int], vocab: int, seed: int) -> list[torch.Tensor]:
    """Token ids for sequences of these lengths (length + 1 each), the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (s + 1,), generator=generator) for s in lengths]


def plan_samples(plan: Plan, shape: ModelShape, seed: int) -> list:
    """The samples a plan runs: token ids of its lengths (text), or clips of its shapes."""
    if plan.shapes is None:
        return random_samples(plan.lengths, shape.vocab, seed)
    return gaussian_clips(plan.shapes, shape, seed)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds, in bytes."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [t for state in optimizer.state.values() for t in state.values()
                if isinstance(t, torch.Tensor) and t.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def parameter_counts(model: torch.nn.Module) -> ParameterCounts:
    """The model's parameters as its memory depends on them (`ParameterCounts`), counted: the
    linear layers' weights and biases are what bf16 autocast copies; a model sharded with FSDP2
    counts its global sizes."""
    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    linear = sum(count(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
    blocks = [count(b) for b in model.blocks()]
    return ParameterCounts(total=count(model), autocast=linear, block=max(blocks), root=count(model) - sum(blocks))


def held_tensors(executor: Executor) -> list[torch.Tensor]:
    """What a rank holds between steps: parameters, buffers, gradients, optimizer state (ZeRO-1's
    local shard: `ZeroRedundancyOptimizer.optim`)."""
    model, optimizer = executor.model, getattr(executor.optimizer, "optim", executor.optimizer)
    tensors = [*model.parameters(), *model.buffers()] + [p.grad for p in model.parameters() if p.grad is not None]
    return tensors + [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


def step_peak(executor: Executor, plan: Plan, samples: Sequence) -> tuple[int, StepResult]:
    """The peak bytes of a whole step on this rank (forward, backward, gradient sync, optimizer
    step; what it held before included, `held_tensors`) and the step's result."""
    from ..runtime.memory import PeakMemoryMeter

    with PeakMemoryMeter(held_tensors(executor)) as meter:
        result = executor.step(plan, samples)
    return meter.peak, result


def idle_plan(world_size: int) -> Plan:
    """A step with no micro-batch: what a step costs besides them (barrier, all-reduce, AdamW)."""
    return Plan([], [Wave([Group(r, 1) for r in range(world_size)])], planner="profile")


def measure_on_ranks(shape: ModelShape, points: Sequence[Point], warmup: int, repeats: int, seed: int,
                     progress: bool) -> dict:
    """Run on every rank (see `run_local`): each point's raw records, rounds of `repeats` after
    `warmup` rounds; plus each depth's step overhead and the states it holds. A micro-batch's
    seconds are the executor's own, which synchronise the device (a GPU's too)."""
    from rich.progress import Progress

    from ..runtime import Executor, ProcessGroups, parallelize

    world, rank, device = dist.get_world_size(), dist.get_rank(), rank_device()
    cluster = get_cluster("cpu", world_size=world)
    groups = ProcessGroups()
    records: dict[int, list[dict]] = {i: [] for i in range(len(points))}
    states: dict[int, int] = {}
    executors = {}
    for depth in sorted({p.layers for p in points}):
        model = build_model(dataclasses.replace(shape, layers=depth), seed).to(device)
        executors[depth] = parallelize(model, cluster, groups=groups, measure_activations=True, lr=LEARNING_RATE)

    def timed_step(executor: Executor, plan: Plan, samples: list[torch.Tensor]):
        synchronize(device)
        start, cpu = time.perf_counter(), time.thread_time()
        result = executor.step(plan, samples)
        synchronize(device)
        return result, time.perf_counter() - start, time.thread_time() - cpu

    overhead = {depth: statistics.median(timed_step(executor, idle_plan(world), [])[1]
                                         for _ in range(warmup + repeats))
                for depth, executor in executors.items()}
    with Progress(disable=not (progress and rank == 0), transient=True) as bar:
        task = bar.add_task("profiling", total=len(points) * (warmup + repeats))
        for r in range(warmup + repeats):
            # Every depth in every round, in an order of its own (the same on every rank): slow
            # drifts of the machine's load spread over all points instead of biasing some.
            order = list(range(len(points)))
            random.Random(seed + r).shuffle(order)
            for i in order:
                point, executor = points[i], executors[points[i].layers]
                bar.update(task, advance=1, description=f"profiling: {point.label()}")
                plan = point_plan(point, world)
                samples = plan_samples(plan, shape, seed + i)
                context = (None if point.cp == 1 else
                           groups.get(rank // point.degree * point.degree, point.degree, point.cp).context)
                with timed_all_to_alls(device, context) as comm:
                    result, wall, cpu = timed_step(executor, plan, samples)
                states.setdefault(point.layers, state_bytes(executor.model, executor.optimizer))
                if r < warmup:
                    continue
                (mb,) = result.micro_batches
                records[i].append(dict(seconds=mb.seconds, activation_bytes=mb.activation_bytes, tokens=mb.tokens,
                                       comm_seconds=comm.seconds, comm_calls=comm.calls, comm_bytes=comm.bytes,
                                       context_seconds=comm.context.seconds, context_calls=comm.context.calls,
                                       context_bytes=comm.context.bytes,
                                       step_seconds=wall, step_cpu_seconds=cpu))
    return dict(records=records, step_overhead=overhead, states=states)


def core_share(records: Sequence[dict]) -> float:
    """Median over steps of CPU time / wall time of a rank's main thread: 1 when it had a core
    to itself all along (less when other jobs took it, or it waited in a collective)."""
    return statistics.median(r["step_cpu_seconds"] / r["step_seconds"] for r in records)


STATISTICS = {"median": statistics.median, "min": min}
"""How repeats become one number. The median resists bursts of load; the minimum estimates
what the device does when no other job takes its cores (interference only ever adds time, so
on a shared, oversubscribed host the minimum is the stable estimate -- timeit's advice)."""


def checked_statistic(name: str, what: str = "statistic") -> str:
    """`name` if it is one of STATISTICS, else a ValueError naming `what` and the choices."""
    if name not in STATISTICS:
        raise ValueError(f"{what} must be one of {sorted(STATISTICS)}, got {name!r}")
    return name


def fitted_statistic(cost: CostModel) -> str:
    """How the profile behind `cost` reduced its repeats (`median` or `min`), which is how a
    measurement held against its predictions must reduce its own; `median` for a model no profile
    measured (analytic or published figures)."""
    return checked_statistic(cost.fit.get("settings", {}).get("statistic", "median"),
                             f"cost model {cost.model!r}: its profile's statistic")


def slowest_rank(seconds: Iterable[float]) -> float:
    """One round of a one-wave point from its ranks' micro-batch seconds: the slowest rank's.

    A wave ends with its slowest rank, and the check (like a real step) measures it so; a
    profile of the mean over ranks under-predicts every balanced wave by the ranks' spread. On
    the 2-CPU development host, two ranks running the same 4,000-token video micro-batch, or
    each its own, had their slowest 3-5% above their mean at the median of 20 rounds."""
    return max(seconds)


def combine(points: Sequence[Point], per_rank: Sequence[dict], statistic: str = "median") -> list[Measurement]:
    """Each point's seconds (the slowest rank's, `slowest_rank`) and collective seconds (the
    mean over ranks: they price the link, whose time the ranks share) reduced over repeats by
    `statistic`; bytes and shard sizes are the largest over ranks (they do not vary between
    repeats)."""
    reduce = STATISTICS[statistic]
    out = []
    for i, point in enumerate(points):
        rounds = list(zip(*(rank["records"][i] for rank in per_rank)))

        def over_rounds(key: str, across_ranks=statistics.fmean) -> list[float]:
            return [across_ranks(r[key] for r in ranks) for ranks in rounds]

        def largest(key: str) -> float:
            return max(r[key] for ranks in rounds for r in ranks)

        seconds, comm = over_rounds("seconds", slowest_rank), over_rounds("comm_seconds")
        out.append(Measurement(
            point=point, seconds=reduce(seconds), comm_seconds=reduce(comm), comm_calls=int(largest("comm_calls")),
            comm_bytes=largest("comm_bytes"), activation_bytes=largest("activation_bytes"),
            shard_tokens=int(largest("tokens")), samples=seconds, comm_samples=comm,
            context_seconds=reduce(over_rounds("context_seconds")), context_calls=int(largest("context_calls")),
            context_bytes=largest("context_bytes")))
    return out
