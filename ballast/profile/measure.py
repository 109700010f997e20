"""Measuring grid points with the real runtime, on every rank of the job (local gloo ranks, or
torchrun's: NCCL on GPUs, where a point's timings are taken between device synchronisations
at its ends, as a training step's are: none inside it).

Each point runs as a one-wave plan through `Executor.step`: every aligned block of `degree`
ranks runs the same micro-batch shape, so all ranks are busy as in a real step (a lone rank
would have the machine's memory bandwidth to itself and look faster than it is). The
executor reports the micro-batch's forward + backward seconds and, with `measure_activations`,
the bytes saved for backward; the all-to-alls are timed where they happen, by wrapping
`torch.distributed.all_to_all_single` for the duration of the measurement (on a GPU with CUDA
events, read after the point: `Stopwatch`).

A video model's points run clips (`models.gaussian_clips.gaussian_clips`: Gaussian latents of the
point's (frames, height, width) grids, a random label or caption), and their plans carry the grids (`Plan.shapes`),
which the executor checks against the model's view of every clip.

Rounds, not back-to-back repeats: a warm-up round over every point, then `repeats` rounds,
each round in a shuffled order. The repeats of a point are spread over the whole run, so a
burst of load from another job on this shared machine touches one of them and the median drops
it. On a CPU every depth runs in every round, so a slow drift of the load touches all depths
alike (the extrapolation compares depths); on a GPU, whose memory must hold the full depth's
model, the depths run one after the other, each model freed before the next is built
(`depth_phases`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from ..vocabulary.cluster import get_cluster
from ..pricing.cost import CostModel
from ..pricing.device_memory import ParameterCounts
from ..models import build_model
from ..models.gaussian_clips import gaussian_clips
from ..plans.plan import Group, MicroBatch, Plan, Wave
from ..vocabulary.model_shape import ModelShape
from ..runtime import Executor, ProcessGroups, parallelize, rank_device
from ..runtime.step_result import StepResult
from .exchange import check_exchanged_values
from ..vocabulary.precision import Precision
from .grid import Measurement, Point

LEARNING_RATE = 1e-5
"""Steps do update the weights (the executor always steps the optimizer); keep them small."""


class Stopwatch:
    """Marks on a device's timeline, read once its work is done: CUDA events recorded on the
    current stream (no host synchronisation, so the ranks run as in training), or the wall
    clock on a CPU, whose work is done when a call returns."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> torch.cuda.Event | float:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start: torch.cuda.Event | float, end: torch.cuda.Event | float) -> float:
        """Seconds between two marks; CUDA ones once the device has run past `end`."""
        return end - start if isinstance(start, float) else start.elapsed_time(end) / 1e3


@dataclass
class CallCounter:
    """All-to-all calls seen inside `timed_all_to_alls`, their send bytes and values and the
    marks around each; those over the CP group among them again in `context`."""

    calls: int = 0
    bytes: int = 0
    values: int = 0
    spans: list[tuple] = field(default_factory=list)
    context: CallCounter | None = None

    def add(self, span: tuple, sent: torch.Tensor) -> None:
        self.spans.append(span)
        self.calls += 1
        self.bytes += sent.numel() * sent.element_size()
        self.values += sent.numel()

    @property
    def seconds(self) -> float:
        """Seconds inside the calls; read after the point's synchronisation (CUDA marks)."""
        return sum(Stopwatch.seconds(*span) for span in self.spans)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: GPU kernels and NCCL calls return before they run."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def timed_all_to_alls(device: torch.device, context_group=None) -> Iterator[CallCounter]:
    """Count and time every `torch.distributed.all_to_all_single` call made inside the block;
    those over `context_group` (this rank's CP group, whose K, V gather and dK, dV
    reduce-scatter the runtime runs as all-to-alls) also in the counter's `context`.

    No host synchronisation around a call: training has none there, and one would idle the
    GPU between every exchange and the kernels queued behind it. The marks are read once the
    point's step has synchronised (`CallCounter.seconds`)."""
    counter, real, clock = CallCounter(context=CallCounter()), dist.all_to_all_single, Stopwatch(device)

    def timed(output, input, *args, **kwargs):
        start = clock.mark()
        work = real(output, input, *args, **kwargs)
        span = (start, clock.mark())
        counter.add(span, input)
        if context_group is not None and kwargs.get("group") is context_group:
            counter.context.add(span, input)
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


def depth_phases(depths: Iterable[int], one_at_a_time: bool) -> list[tuple[int, ...]]:
    """The depths whose models are resident together, phase after phase. One at a time (on a
    GPU): each depth's model is built, measured and freed before the next, so the device holds
    one model's states and activations, as in training. Otherwise (on a CPU, whose host memory
    holds the small reduced copies beside the full one) one phase of every depth, measured in
    the same rounds, so a drift of a shared host's load touches all depths alike."""
    depths = sorted(set(depths))
    return [(d,) for d in depths] if one_at_a_time else [tuple(depths)]


def measure_on_ranks(shape: ModelShape, points: Sequence[Point], warmup: int, repeats: int, seed: int,
                     progress: bool, precision: Precision = Precision.AUTO,
                     one_depth_at_a_time: bool | None = None) -> dict:
    """Run on every rank (see `run_local`): each point's raw records, rounds of `repeats` after
    `warmup` rounds; plus each depth's step overhead and the states it holds. A micro-batch's
    seconds are the executor's own, which synchronise the device (a GPU's too) at the point's
    ends only. `one_depth_at_a_time` (`depth_phases`): unset, on a GPU only. A text point's
    exchanged values are checked in its first round (`exchange.check_exchanged_values`)."""
    from rich.progress import Progress

    world, rank, device = dist.get_world_size(), dist.get_rank(), rank_device()
    one_at_a_time = device.type == "cuda" if one_depth_at_a_time is None else one_depth_at_a_time
    groups = ProcessGroups()
    records: dict[int, list[dict]] = {i: [] for i in range(len(points))}
    states: dict[int, int] = {}
    overhead: dict[int, float] = {}
    with Progress(disable=not (progress and rank == 0), transient=True) as bar:
        task = bar.add_task("profiling", total=len(points) * (warmup + repeats))

        def advance(point: Point) -> None:
            bar.update(task, advance=1, description=f"profiling: {point.label()}")

        for depths in depth_phases((p.layers for p in points), one_at_a_time):
            _measure_phase(depths, shape, points, warmup, repeats, seed, precision, groups, advance,
                           records, states, overhead)
            gc.collect()  # the phase's models sit in reference cycles: free them before the next's
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return dict(records=records, step_overhead=overhead, states=states)


def _measure_phase(depths: tuple[int, ...], shape: ModelShape, points: Sequence[Point], warmup: int, repeats: int,
                   seed: int, precision: Precision, groups: ProcessGroups, advance: Callable[[Point], None],
                   records: dict[int, list[dict]], states: dict[int, int], overhead: dict[int, float]) -> None:
    """Build the models of `depths`, measure their points into `records`, `states` and
    `overhead`; the models go with this call's frame."""
    world, device = dist.get_world_size(), rank_device()
    cluster = get_cluster("cpu", world_size=world)
    executors = {depth: parallelize(build_model(dataclasses.replace(shape, layers=depth), seed),
                                    cluster, groups=groups, measure_activations=True, lr=LEARNING_RATE,
                                    precision=precision)
                 for depth in depths}
    for depth, executor in executors.items():
        overhead[depth] = statistics.median(_timed_step(executor, idle_plan(world), [], device)[1]
                                            for _ in range(warmup + repeats))
    phase = [i for i, p in enumerate(points) if p.layers in executors]
    for r in range(warmup + repeats):
        # Every depth of the phase in every round, in an order of its own (the same on every
        # rank): slow drifts of the machine's load spread over all points instead of biasing some.
        order = list(phase)
        random.Random(seed + r).shuffle(order)
        for i in order:
            point, executor = points[i], executors[points[i].layers]
            advance(point)
            record = _measure_point(executor, point, shape, groups, seed + i, device)
            if r == 0 and not shape.pattern.clips:
                check_exchanged_values(point, shape, record["tokens"], record["comm_values"])
            states.setdefault(point.layers, state_bytes(executor.model, executor.optimizer))
            if r >= warmup:
                records[i].append(record)


def _timed_step(executor: Executor, plan: Plan, samples: list, device: torch.device) -> tuple:
    """The step's result, wall and CPU seconds, its device work done at both ends."""
    synchronize(device)
    start, cpu = time.perf_counter(), time.thread_time()
    result = executor.step(plan, samples)
    synchronize(device)
    return result, time.perf_counter() - start, time.thread_time() - cpu


def _measure_point(executor: Executor, point: Point, shape: ModelShape, groups: ProcessGroups, seed: int,
                   device: torch.device) -> dict:
    """One run of a point's plan on this rank: its micro-batch's record."""
    world, rank = dist.get_world_size(), dist.get_rank()
    plan = point_plan(point, world)
    samples = plan_samples(plan, shape, seed)
    context = None if point.cp == 1 else groups.get(rank // point.degree * point.degree, point.degree, point.cp).context
    with timed_all_to_alls(device, context) as comm:
        result, wall, cpu = _timed_step(executor, plan, samples, device)
    (mb,) = result.micro_batches
    return dict(seconds=mb.seconds, activation_bytes=mb.activation_bytes, tokens=mb.tokens,
                comm_seconds=comm.seconds, comm_calls=comm.calls, comm_bytes=comm.bytes, comm_values=comm.values,
                context_seconds=comm.context.seconds, context_calls=comm.context.calls,
                context_bytes=comm.context.bytes, context_values=comm.context.values,
                step_seconds=wall, step_cpu_seconds=cpu)


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
            context_bytes=largest("context_bytes"), comm_values=largest("comm_values"),
            context_values=largest("context_values")))
    return out
