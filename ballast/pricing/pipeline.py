"""The price of a pipeline of variable-length micro-batches: the 1F1B schedule simulated exactly,
what crosses a stage boundary, and what each stage holds (docs/design.md, section 4).

**Schedule.** `one_f_one_b_parts` takes every slot's micro-batches (one per group of the pool
that has one there, `Plan.slots`), each with its forward and backward seconds on every stage,
the seconds its rows take across a boundary and its group's ranks, and runs the passes in the
order the runtime runs them (`vocabulary/pipeline_schedule.one_f_one_b`, every rank of a stage
walking the same slots) as the runtime's dataflow does (`runtime/pipeline/p2p.py`: a stage
waits for what it receives, never for its neighbour to take what it sent): a group's pass starts
when all its ranks have ended their previous pass on the stage (its collectives meet) and its
input is there, a forward's input being the previous stage's forward of the micro-batch (plus
the transfer), a backward's the next stage's backward (plus the transfer; on the last stage, its
own forward); a rank with nothing in a slot runs nothing there. The step ends with the last pass
anywhere. `one_f_one_b_times` is one rank's pipeline. Nothing about the bubble is assumed: with
equal micro-batches it comes out as the textbook (p - 1) / m of the work (`bubble_ratio`); with
a 64k-token micro-batch among 2k-token ones it is what that micro-batch's passes leave idle.

**A stage's passes.** The stages are equal runs of blocks, so a stage runs 1 / p of a
micro-batch's seconds as the cost model prices them for the whole model, its forward
`FORWARD_SHARE` of them without recomputation and its backward the rest (`stage_passes`).

**Boundary.** A micro-batch's rows cross each boundary twice, forward (activations) and
backward (their gradients): the residual stream, `RESIDUAL_BYTES` a value (the runtime keeps it
in the parameters' fp32 under autocast), `hidden` values a token, each rank of the group its own
shard's rows to the same rank of the next stage (under TP each TP rank its own copy), at
`boundary_bandwidth`.

**Memory per stage.** A stage holds its blocks' parameters, gradients and optimizer state (and
the embedding on the first stage, the final norm and output layer on the last; a TP shard of
them under TP), priced as the cost model's `states` are for the whole model
(`device_memory.DeviceMemory`), and the activations of every micro-batch whose forward it has
run and backward not yet: under 1F1B at most min(p - k, m) of them on stage k, the first stage
the most. A micro-batch's activations on a stage are its share of the layers' (the cost model's
per-token bytes, `CostModel.activation_bytes`, without the loss's part, times the stage's
layers / L), and on the last stage the loss's too. The cost model's own `states` are the fullest
stage's (`planning_counts`), which planners fit micro-batches against. `stage_prices` gives a cost model its
stages' states and boundary (`CostModel.stages`), which the timeline and `Plan.validate` read.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from ..vocabulary.cluster import Cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.pipeline_schedule import (check_pipeline_shape, check_stages, in_flight, one_f_one_b,
                                            stage_layers)
from ..vocabulary.samples import Sample, tokens as sample_tokens
from .cost import CostModel
from .device_memory import ParameterCounts
from .stages import StagePrices
from .whole_step import data_parallel_prices

RESIDUAL_BYTES = 4
"""Bytes per value of what a stage sends: the fp32 residual stream."""
FORWARD_SHARE = 1 / 3
"""A micro-batch's forward share of its seconds without recomputation: the cost model prices
forward and backward together, and backward runs two matmuls for each of the forward's (the
inputs' and the weights' gradients), Megatron's and the pipeline literature's 1 : 2."""


@dataclass(frozen=True)
class StagePart:
    """One group's micro-batch in one slot of a pipeline's schedule (`one_f_one_b_parts`)."""

    lanes: tuple[int, ...]
    """The pool ranks of its group: they run its passes together (their collectives meet)."""
    forward: tuple[float, ...]
    """Seconds of its forward on each stage."""
    backward: tuple[float, ...]
    """Seconds of its backward on each stage (a recomputed forward included)."""
    transfer: float = 0.0
    """Seconds its rows take across one boundary, either way."""


@dataclass(frozen=True)
class PipelineTimes:
    """One pipeline's step under 1F1B, simulated (`one_f_one_b_parts`)."""

    step: float
    """Seconds from the first forward's start to the last pass's end."""
    work: tuple[float, ...]
    """Seconds each stage's busiest rank spends in its passes."""
    forward_ends: tuple[tuple[tuple[float, ...], ...], ...]
    """forward_ends[i][j][k]: when part j of slot i ends its forward on stage k."""
    backward_ends: tuple[tuple[tuple[float, ...], ...], ...]

    @property
    def bubble(self) -> float:
        """Seconds the busiest stage is idle during the step: what the pipeline adds to its work."""
        return self.step - max(self.work)

    @property
    def bubble_ratio(self) -> float:
        """The bubble over the busiest stage's work: (p - 1) / m for m equal micro-batches on p
        equal stages."""
        return self.bubble / max(self.work) if max(self.work) > 0 else 0.0

    @property
    def idle_fraction(self) -> float:
        """The share of all stages' step time spent idle."""
        total = len(self.work) * self.step
        return 1.0 - sum(self.work) / total if total > 0 else 0.0


def one_f_one_b_parts(slots: Sequence[Sequence[StagePart]], stages: int, lanes: int) -> PipelineTimes:
    """The 1F1B step of a pool of `lanes` ranks on `stages` stages: slots[i] holds the groups'
    micro-batches of the schedule's slot i (`Plan.slots`), their lanes disjoint; a lane in no part
    of a slot has nothing to run in it. Every lane walks the same 1F1B order of the slots; a part's
    pass starts when all its lanes are free on the stage and its input is there."""
    p = stages
    assert all(len(part.forward) == p == len(part.backward) and part.transfer >= 0 and
               min(part.forward + part.backward, default=0.0) >= 0 for slot in slots for part in slot), "seconds"
    f_end = [[[-1.0] * p for _ in slot] for slot in slots]
    b_end = [[[-1.0] * p for _ in slot] for slot in slots]
    # A stage runs a slot's pass for all its parts at once, so a pass's input is there when the
    # neighbouring stage has run the slot's pass (`ran`): one flag per slot, not a check per part.
    # Planners price thousands of parts per plan through this loop, hence its plain Python.
    ran = {True: [[False] * len(slots) for _ in range(p)], False: [[False] * len(slots) for _ in range(p)]}
    orders = [[(step.forward, step.micro_batch) for step in one_f_one_b(k, p, len(slots))] for k in range(p)]
    done, free = [0] * p, [[0.0] * lanes for _ in range(p)]
    left = sum(map(len, orders))
    while left:
        progressed = False
        for k in range(p):
            order, lane_free = orders[k], free[k]
            while done[k] < len(order):
                forward, i = order[done[k]]
                neighbour = k - 1 if forward else k + 1
                if 0 <= neighbour < p and not ran[forward][neighbour][i]:
                    break
                ends = f_end[i] if forward else b_end[i]
                for j, part in enumerate(slots[i]):
                    if forward:
                        at = 0.0 if k == 0 else f_end[i][j][k - 1] + part.transfer
                    else:  # the last stage's backward follows its own forward, which 1F1B ran before it
                        at = f_end[i][j][k] if k == p - 1 else b_end[i][j][k + 1] + part.transfer
                    for lane in part.lanes:
                        if lane_free[lane] > at:
                            at = lane_free[lane]
                    end = at + (part.forward if forward else part.backward)[k]
                    ends[j][k] = end
                    for lane in part.lanes:
                        lane_free[lane] = end
                ran[forward][k][i] = True
                done[k] += 1
                left -= 1
                progressed = True
        assert progressed, "1F1B's order always has a pass ready"
    # Each lane's seconds summed in slot and part order, as a sum over its parts would add them.
    busy = [[0] * lanes for _ in range(p)]
    for slot in slots:
        for part in slot:
            for k in range(p):
                seconds, row = part.forward[k] + part.backward[k], busy[k]
                for lane in part.lanes:
                    row[lane] += seconds
    step = max(max(row) for row in free)
    return PipelineTimes(step, tuple(max(row) for row in busy), tuple(tuple(map(tuple, slot)) for slot in f_end),
                         tuple(tuple(map(tuple, slot)) for slot in b_end))


def one_f_one_b_times(forward: Sequence[Sequence[float]], backward: Sequence[Sequence[float]],
                      transfer: Sequence[float] | None = None) -> PipelineTimes:
    """The 1F1B step of m micro-batches on p stages of one rank: forward[i][k] and backward[i][k]
    are micro-batch i's seconds on stage k (in the order the step runs them), transfer[i] the
    seconds its rows take across one boundary, either way (default 0)."""
    m = len(forward)
    p = len(forward[0]) if m else 1
    assert len(backward) == m and all(len(row) == p for row in (*forward, *backward)), "m x p times"
    transfer = list(transfer) if transfer is not None else [0.0] * m
    assert len(transfer) == m, "a transfer per micro-batch"
    return one_f_one_b_parts([[StagePart((0,), tuple(f), tuple(b), t)] for f, b, t in zip(forward, backward, transfer)],
                             p, 1)


def boundary_bytes(tokens: float, hidden: int) -> float:
    """Bytes a micro-batch of `tokens` sends across one stage boundary one way (all its group's
    ranks together; as many come back as gradients)."""
    return RESIDUAL_BYTES * hidden * tokens


def transfer_seconds(tokens: float, degree: int, hidden: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds one way across a boundary for a micro-batch of `tokens` on a group of `degree`
    ranks, each sending its shard to its counterpart at `bandwidth` bytes/s, at once."""
    return boundary_bytes(tokens / degree, hidden) / bandwidth + latency if tokens else 0.0


def stage_passes(seconds: float, plain: float, stages: int) -> tuple[float, float]:
    """(forward, backward) seconds on each of `stages` equal stages of a micro-batch the cost
    model prices at `seconds` for the whole model (`plain` without recomputation): each stage
    runs 1 / stages of it, its forward `FORWARD_SHARE` of the plain seconds, its backward the
    rest (the recomputed forward included)."""
    forward = FORWARD_SHARE * plain / stages
    return forward, seconds / stages - forward


def boundary_bandwidth(cluster: Cluster, mesh: JobMesh) -> float:
    """Bytes/s a rank sends across a stage boundary while every rank of its stage sends (each TP
    rank its own copy): inside a node, where a stage is a share of one, at the all-to-all rate of
    the 2 t devices of a TP group and its counterpart; across nodes, where a stage holds whole
    ones, at its node's NIC bandwidth shared by the node's devices."""
    if mesh.stage_size < cluster.devices_per_node:
        return cluster.bandwidth[2 * mesh.tp]
    return cluster.nic_bandwidth * cluster.nics_per_node / cluster.devices_per_node


def stage_counts(shape: ModelShape, stage: int, stages: int, tp: int = 1) -> ParameterCounts:
    """The parameters a rank of stage `stage` of `stages` holds of a text model under TP degree
    `tp`: its shard of its blocks, the embedding on the first stage, the final norm and output
    layer on the last (`tensor_parallel.parameter_counts`' terms, split)."""
    check_pipeline_shape(shape, stages)
    layers = len(stage_layers(stage, stages, shape.layers))
    block = shape.layer_matmul_params // tp + 2 * shape.hidden
    first, last = stage == 0, stage == stages - 1
    matrix = shape.vocab * shape.hidden // tp
    root = first * matrix + last * (matrix + shape.hidden)
    return ParameterCounts(total=layers * block + root,
                           autocast=layers * shape.layer_matmul_params // tp + last * matrix, block=block, root=root)


def planning_counts(shape: ModelShape, mesh: JobMesh) -> ParameterCounts | None:
    """The parameters a cost model under `mesh` prices its states from: under PP the last
    stage's, the fullest (its blocks, and the output layer and final norm beside the first
    stage's embedding); None without PP (the whole model's, `parameter_counts`).

    A micro-batch whose whole activations fit beside them fits every stage under 1F1B: stage k
    holds at most p - k micro-batches in flight, each a 1 / p share of its layers' activations
    (and the loss on the last stage, which holds one at a time), at most the largest one's whole.
    So a planner fitting micro-batches against the cost model's `states` makes plans that pass
    `Plan.validate`'s exact check per stage."""
    return stage_counts(shape, mesh.pp - 1, mesh.pp, mesh.tp) if mesh.pp > 1 else None


def stage_states(cost: CostModel, shape: ModelShape, stage: int, stages: int) -> float:
    """What a rank of stage `stage` holds besides activations: `CostModel.states` for its
    parameters (a TP shard's under the cost model's mesh), in the cost model's sharding mode and
    precision over its pool (the cost model's world)."""
    if cost.device is None:
        raise ValueError(f"cost model {cost.source!r} was not priced from a model's parameters, so its states "
                         f"cannot be split over pipeline stages")
    tp = cost.mesh.tp if cost.mesh is not None else 1
    return dataclasses.replace(cost.device, counts=stage_counts(shape, stage, stages, tp)).states


def stage_prices(cost: CostModel, shape: ModelShape, cluster: Cluster, mesh: JobMesh) -> StagePrices:
    """The mesh's stages as `cost` (a rank's of `mesh` on the job's `cluster`) prices them."""
    device, pool = cost.device, mesh.pool_cluster(cluster)
    data_parallel = () if device is None else tuple(
        data_parallel_prices(stage_counts(shape, k, mesh.pp, mesh.tp), device.sharding, device.bf16, mesh.pool, pool,
                             cost.source)
        for k in range(mesh.pp))
    return StagePrices(tuple(stage_states(cost, shape, k, mesh.pp) for k in range(mesh.pp)), shape.hidden,
                       boundary_bandwidth(cluster, mesh), cluster.all_to_all_latency, data_parallel)


def stage_activation_bytes(cost: CostModel, samples: Sequence[Sample], degree: int, recompute: float,
                           cp: int | None, stage: int, stages: int) -> float:
    """Bytes a micro-batch of `samples` keeps for backward on each rank of its group on stage
    `stage` (of `stages` equal stages), at SP degree `degree`, split `cp` and level `recompute`:
    the stage's share of the layers' bytes, and on the last stage the loss's."""
    check_stages(stages, cost.layers)
    tokens = float(sum(map(sample_tokens, samples)))
    loss = cost.loss_per_token * tokens / degree
    layers = (cost.activation_bytes(tokens, degree, recompute, cp) - loss) / stages
    return layers + (loss if stage == stages - 1 else 0.0)


def in_flight_peak(stage: int, stages: int, activations: Sequence[float]) -> float:
    """The most activation bytes stage `stage` holds at once under 1F1B, activations[i] being
    micro-batch i's there (the step's order)."""
    return max((sum(activations[i] for i in held) for held in in_flight(stage, stages, len(activations))),
               default=0.0)


def stage_memory(stages: StagePrices, stage: int, activations: Sequence[float]) -> float:
    """Stage `stage`'s peak bytes per rank in a step whose micro-batches keep `activations` there
    (`stage_activation_bytes`): its states and the most it holds in flight."""
    return stages.states[stage] + in_flight_peak(stage, stages.count, activations)
