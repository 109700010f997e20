"""The price of a pipeline of variable-length micro-batches: the 1F1B schedule simulated exactly,
what crosses a stage boundary, and what each stage holds (docs/design.md, section 4).

**Schedule.** `one_f_one_b_times` takes every micro-batch's forward and backward seconds on
every stage and the seconds its rows take across a boundary, and runs the passes in the order
the runtime runs them (`vocabulary/pipeline_schedule.one_f_one_b`) as the runtime's dataflow
does (`runtime/pipeline/p2p.py`: a stage waits for what it receives, never for its neighbour to
take what it sent): a pass starts when its stage's previous pass has ended and its input is
there, a forward's input being the previous stage's forward of the micro-batch (plus the
transfer), a backward's the next stage's backward (plus the transfer; on the last stage, its own
forward). The step ends with the last pass anywhere. Nothing about the bubble is assumed: with
equal micro-batches it comes out as the textbook (p - 1) / m of the work (`bubble_ratio`); with
a 64k-token micro-batch among 2k-token ones it is what that micro-batch's passes leave idle.

**Boundary.** A micro-batch's rows cross each boundary twice, forward (activations) and
backward (their gradients): the residual stream, `RESIDUAL_BYTES` a value (the runtime keeps it
in the parameters' fp32 under autocast), `hidden` values a token, each rank of the group its own
shard's rows to the same rank of the next stage.

**Memory per stage.** A stage holds its blocks' parameters, gradients and optimizer state (and
the embedding on the first stage, the final norm and output layer on the last), priced as the
cost model's `states` are for the whole model (`device_memory.DeviceMemory`), and the
activations of every micro-batch whose forward it has run and backward not yet: under 1F1B at
most min(p - k, m) of them on stage k, the first stage the most. A micro-batch's activations on a
stage are its share of the layers' (the cost model's per-token bytes, `CostModel.activation_bytes`,
without the loss's part, times the stage's layers / L), and on the last stage the loss's too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.pipeline_schedule import (check_pipeline_shape, check_stages, in_flight, one_f_one_b,
                                            stage_layers)
from ..vocabulary.samples import Sample, tokens as sample_tokens
from .cost import CostModel
from .device_memory import ParameterCounts

RESIDUAL_BYTES = 4
"""Bytes per value of what a stage sends: the fp32 residual stream."""


@dataclass(frozen=True)
class PipelineTimes:
    """One pipeline's step under 1F1B, simulated (`one_f_one_b_times`)."""

    step: float
    """Seconds from the first forward's start to the last pass's end."""
    work: tuple[float, ...]
    """Seconds each stage spends in its passes."""
    forward_ends: tuple[tuple[float, ...], ...]
    """forward_ends[m][k]: when micro-batch m's forward ends on stage k."""
    backward_ends: tuple[tuple[float, ...], ...]

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


def one_f_one_b_times(forward: Sequence[Sequence[float]], backward: Sequence[Sequence[float]],
                      transfer: Sequence[float] | None = None) -> PipelineTimes:
    """The 1F1B step of m micro-batches on p stages: forward[i][k] and backward[i][k] are micro-batch
    i's seconds on stage k (in the order the step runs them), transfer[i] the seconds its rows take
    across one boundary, either way (default 0)."""
    m = len(forward)
    p = len(forward[0]) if m else 1
    assert len(backward) == m and all(len(row) == p for row in (*forward, *backward)), "m x p times"
    transfer = list(transfer) if transfer is not None else [0.0] * m
    assert len(transfer) == m and all(t >= 0 for row in (transfer, *forward, *backward) for t in row), "seconds"
    f_end = [[-1.0] * p for _ in range(m)]
    b_end = [[-1.0] * p for _ in range(m)]
    orders = [one_f_one_b(k, p, m) for k in range(p)]
    done, free = [0] * p, [0.0] * p
    left = 2 * m * p
    while left:
        progressed = False
        for k in range(p):
            while done[k] < len(orders[k]):
                step = orders[k][done[k]]
                i = step.micro_batch
                if step.forward:
                    ready = 0.0 if k == 0 else f_end[i][k - 1] + transfer[i] if f_end[i][k - 1] >= 0 else None
                else:
                    ready = f_end[i][k] if k == p - 1 else \
                        b_end[i][k + 1] + transfer[i] if b_end[i][k + 1] >= 0 else None
                if ready is None:
                    break
                end = max(free[k], ready) + (forward if step.forward else backward)[i][k]
                (f_end if step.forward else b_end)[i][k] = free[k] = end
                done[k] += 1
                left -= 1
                progressed = True
        assert progressed, "1F1B's order always has a pass ready"
    work = tuple(sum(forward[i][k] + backward[i][k] for i in range(m)) for k in range(p))
    return PipelineTimes(max(free), work, tuple(map(tuple, f_end)), tuple(map(tuple, b_end)))


def boundary_bytes(tokens: float, hidden: int) -> float:
    """Bytes a micro-batch of `tokens` sends across one stage boundary one way (all its group's
    ranks together; as many come back as gradients)."""
    return RESIDUAL_BYTES * hidden * tokens


def transfer_seconds(tokens: float, degree: int, hidden: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds one way across a boundary for a micro-batch of `tokens` on a group of `degree`
    ranks, each sending its shard to its counterpart at `bandwidth` bytes/s, at once."""
    return boundary_bytes(tokens / degree, hidden) / bandwidth + latency if tokens else 0.0


def stage_counts(shape: ModelShape, stage: int, stages: int) -> ParameterCounts:
    """The parameters stage `stage` of `stages` holds of a text model: its blocks, the embedding on
    the first stage, the final norm and output layer on the last (`ParameterCounts.of_shape`'s
    terms, split)."""
    check_pipeline_shape(shape, stages)
    layers = len(stage_layers(stage, stages, shape.layers))
    block = shape.layer_matmul_params + 2 * shape.hidden
    first, last = stage == 0, stage == stages - 1
    matrix = shape.vocab * shape.hidden
    root = first * matrix + last * (matrix + shape.hidden)
    return ParameterCounts(total=layers * block + root, autocast=layers * shape.layer_matmul_params + last * matrix,
                           block=block, root=root)


def stage_states(cost: CostModel, shape: ModelShape, stage: int, stages: int) -> float:
    """What stage `stage` holds besides activations: `CostModel.states` for its parameters, in the
    cost model's sharding mode and precision over its pool (the cost model's world)."""
    if cost.device is None:
        raise ValueError(f"cost model {cost.source!r} was not priced from a model's parameters, so its states "
                         f"cannot be split over pipeline stages")
    return dataclasses.replace(cost.device, counts=stage_counts(shape, stage, stages)).states


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


def stage_memory(cost: CostModel, shape: ModelShape, stage: int, stages: int, activations: Sequence[float]) -> float:
    """Stage `stage`'s peak bytes per rank in a step whose micro-batches keep `activations` there
    (`stage_activation_bytes`): its states and the most it holds in flight."""
    return stage_states(cost, shape, stage, stages) + in_flight_peak(stage, stages, activations)
