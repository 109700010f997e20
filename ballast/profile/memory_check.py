"""The memory model against the real peak: a step's peak per rank, measured on local gloo ranks
(`measure.step_peak`) and predicted by `pricing/device_memory.py` from the model's parameter
counts, its sharding mode and precision, plus the activations the profiler's meter measures.

What the prediction takes from the measurement is what a profile measures (the activations a
micro-batch saves, without autocast's weight copies and the loss's log-probabilities); the
states, FSDP's gathered units, the reduction buffer, the copies and the loss's logits are
priced. `bench/memory_fit.py` runs it for the three model families in every mode.
"""
from __future__ import annotations

import dataclasses

import torch.distributed as dist

from ..plans.plan import Group, MicroBatch, Plan, Wave
from ..pricing.cost_sources import device_memory
from ..pricing.device_memory import DeviceMemory, ParameterCounts
from ..vocabulary.cluster import get_cluster
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.precision import Precision
from ..vocabulary.sharding import Sharding

TOLERANCE = 0.10
"""The largest |predicted / measured - 1| the memory model is held to (issue #52)."""


def one_group_plan(shape: ModelShape, world_size: int, micro_batches: list[list]) -> Plan:
    """One wave, one group of the whole world running `micro_batches` in turn (lockstep, as FSDP
    needs): text samples are lengths, video ones (frames, height, width) shapes."""
    ids = iter(range(sum(map(len, micro_batches))))
    wave = Wave([Group(0, world_size, [MicroBatch([next(ids) for _ in mb], 0.0) for mb in micro_batches])])
    samples = [x for mb in micro_batches for x in mb]
    if shape.attention == "causal":
        return Plan(list(samples), [wave], lockstep=True, planner="memory")
    return Plan([f * h * w for f, h, w in samples], [wave], lockstep=True, planner="memory",
                shapes=list(samples))


def measure_on_rank(shape: ModelShape, micro_batches: list[list], runs: list[tuple[Sharding, str]],
                    seed: int) -> list[dict]:
    """On every rank: for each (mode, precision) of `runs`, a fresh model, a warm-up step (AdamW
    makes its state in the first) and a measured one of `micro_batches` (`one_group_plan`);
    this rank's peak, each micro-batch's activations and tokens held, and the model's parameter
    counts."""
    from ..models import build_model
    from ..runtime import ProcessGroups, parallelize
    from .measure import parameter_counts, plan_samples, step_peak

    world = dist.get_world_size()
    cluster, groups = get_cluster("cpu", world_size=world), ProcessGroups()
    plan = one_group_plan(shape, world, micro_batches)
    batch = plan_samples(plan, shape, seed)
    out = []
    for sharding, precision in runs:
        model = build_model(shape, seed)
        counts = parameter_counts(model)
        executor = parallelize(model, cluster, groups=groups, fsdp=sharding is Sharding.FSDP,
                               zero1=sharding is Sharding.ZERO1, precision=Precision(precision), measure_activations=True,
                               lr=1e-5)
        executor.step(plan, batch)
        peak, result = step_peak(executor, plan, batch)
        out.append(dict(sharding=sharding.value, precision=precision, peak=peak,
                        tokens=[mb.tokens for mb in result.micro_batches],
                        activations=[mb.activation_bytes for mb in result.micro_batches],
                        parameters=dataclasses.asdict(counts)))
    return out


def predicted_peak(memory: DeviceMemory, activations: list[float], tokens: list[int]) -> float:
    """A step's peak on a rank holding tokens[i] of micro-batch i, which saves activations[i]: the
    largest start of a backward (states, activations, the loss's logits), or after backward."""
    return max(max(memory.states + a + memory.loss_per_token * n for a, n in zip(activations, tokens)),
               memory.after_backward)


def compare(shape: ModelShape, world_size: int, record: dict) -> dict:
    """A rank's record with the prediction (and the old model's: 16 bytes per parameter over the
    world, plus activations) beside its measured peak."""
    cluster = get_cluster("cpu", world_size=world_size)
    memory = device_memory(shape, cluster, Sharding(record["sharding"]), record["precision"],
                           ParameterCounts(**record["parameters"]))
    predicted = predicted_peak(memory, record["activations"], record["tokens"])
    old = 16 * record["parameters"]["total"] / world_size + max(record["activations"])
    return dict(record, predicted=predicted, ratio=predicted / record["peak"], old_predicted=old,
                old_ratio=old / record["peak"], states=memory.states, after_backward=memory.after_backward,
                loss=[memory.loss_per_token * n for n in record["tokens"]])
