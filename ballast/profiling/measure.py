"""Measuring grid points with the real runtime, on every rank of a local gloo world.

Each point runs as a one-wave plan through `Executor.step`: every aligned block of `degree`
ranks runs the same micro-batch shape, so all ranks are busy as in a real step (a lone rank
would have the machine's memory bandwidth to itself and look faster than it is). The
executor reports the micro-batch's forward + backward seconds and, with `measure_activations`,
the bytes saved for backward; the all-to-alls are timed where they happen, by wrapping
`torch.distributed.all_to_all_single` for the duration of the measurement.

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
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from ..cluster import get_cluster
from ..models.gpt import build_gpt
from ..plan import Group, MicroBatch, Plan, Wave
from ..shapes import ModelShape
from .grid import Measurement, Point

LEARNING_RATE = 1e-5
"""Steps do update the weights (the executor always steps the optimizer); keep them small."""


@dataclass
class CallCounter:
    calls: int = 0
    seconds: float = 0.0
    bytes: int = 0


@contextlib.contextmanager
def timed_all_to_alls() -> Iterator[CallCounter]:
    """Count and time every `torch.distributed.all_to_all_single` call made inside the block."""
    counter, real = CallCounter(), dist.all_to_all_single

    def timed(output, input, *args, **kwargs):
        start = time.perf_counter()
        work = real(output, input, *args, **kwargs)
        counter.seconds += time.perf_counter() - start
        counter.calls += 1
        counter.bytes += input.numel() * input.element_size()
        return work

    dist.all_to_all_single = timed
    try:
        yield counter
    finally:
        dist.all_to_all_single = real


def point_plan(point: Point, world_size: int) -> Plan:
    """One wave; every block of `degree` ranks runs the point's micro-batch on its own copy."""
    m, copies = len(point.lengths), world_size // point.degree
    groups = [Group(g * point.degree, point.degree, [MicroBatch(list(range(g * m, (g + 1) * m)), point.checkpoint)])
              for g in range(copies)]
    return Plan(list(point.lengths) * copies, [Wave(groups)], planner="profile")


def random_samples(lengths: Sequence[int], vocab: int, seed: int) -> list[torch.Tensor]:
    """Token ids for sequences of these lengths (length + 1 each), the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (s + 1,), generator=generator) for s in lengths]


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds, in bytes."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [t for state in optimizer.state.values() for t in state.values()
                if isinstance(t, torch.Tensor) and t.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_on_ranks(shape: ModelShape, points: Sequence[Point], warmup: int, repeats: int, seed: int,
                     progress: bool) -> dict:
    """Run on every rank (see `run_local`): each point's raw records, rounds of `repeats` after
    `warmup` rounds, grouped by depth; plus step overheads and the states each depth holds."""
    from rich.progress import Progress

    from ..runtime import Executor, ProcessGroups, make_optimizer

    world, rank = dist.get_world_size(), dist.get_rank()
    cluster = get_cluster("cpu", world_size=world)
    groups = ProcessGroups()
    records: dict[int, list[dict]] = {i: [] for i in range(len(points))}
    overhead: dict[int, list[float]] = {}
    states: dict[int, int] = {}
    executors = {}
    for depth in sorted({p.layers for p in points}):
        model = build_gpt(dataclasses.replace(shape, layers=depth), seed)
        executors[depth] = Executor(model, make_optimizer(model, lr=LEARNING_RATE), cluster, groups,
                                    measure_activations=True)
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
                with timed_all_to_alls() as comm:
                    result = executor.step(plan, random_samples(plan.lengths, shape.vocab, seed + i))
                states.setdefault(point.layers, state_bytes(executor.model, executor.optimizer))
                if r < warmup:
                    continue
                (mb,) = result.micro_batches
                overhead.setdefault(point.layers, []).append(result.sync_seconds + result.optimizer_seconds)
                records[i].append(dict(seconds=mb.seconds, activation_bytes=mb.activation_bytes,
                                       tokens=mb.tokens, comm_seconds=comm.seconds,
                                       comm_calls=comm.calls, comm_bytes=comm.bytes))
    return dict(records=records, step_overhead={d: statistics.median(v) for d, v in overhead.items()},
                states=states)


def combine(points: Sequence[Point], per_rank: Sequence[dict]) -> list[Measurement]:
    """Medians over repeats of each point's mean over ranks (time, in-call seconds) or largest
    over ranks (bytes, shard)."""
    out = []
    for i, point in enumerate(points):
        rounds = list(zip(*(rank["records"][i] for rank in per_rank)))

        def median(key: str, over_ranks) -> float:
            return statistics.median(over_ranks(r[key] for r in ranks) for ranks in rounds)

        def mean(values) -> float:
            return statistics.fmean(list(values))

        out.append(Measurement(
            point=point, seconds=median("seconds", mean), comm_seconds=median("comm_seconds", mean),
            comm_calls=int(median("comm_calls", max)), comm_bytes=median("comm_bytes", max),
            activation_bytes=median("activation_bytes", max), shard_tokens=int(median("tokens", max)),
            samples=[mean(r["seconds"] for r in ranks) for ranks in rounds]))
    return out
