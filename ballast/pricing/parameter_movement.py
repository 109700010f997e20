"""What a strategy's step costs besides its pipelines' passes: moving the parameters from the
canonical layout to the step's compute layout, the gradients back, and the optimizer step on the
canonical shards (docs/design.md, section 4, *Parameter movement*; Hydraulis' "hot switching").

The canonical layout (`Sharding.CANONICAL`) splits every tensor of the model (M parameters) into
N flat shards, one per rank of the job. A rank of pipeline i at stage k needs P_ik of them: its TP
shard of its stage's tensors. Two ways to move them (`Movement`), at the job's ring bandwidth bw
per rank (`Cluster.ring_bandwidth`: across nodes a device's share of its node's NICs) plus the
collective latency l per call, one call per block and one for the tensors in no block (C calls),
v = (N - 1) / N:

    movement  gather (before the passes)            reduction (after the last backward)
    full      every rank all-gathers every whole    reduce-scatter of every whole tensor:
              tensor and keeps its slice:           v 4 M / bw + C l
              v 4 M / bw + C l
    sliced    each rank receives its slice from     the same pieces back, summed where they
              the shards' owners (all-to-all of     arrive: the same seconds
              pieces): max over ranks of
              max(v 4 P_ik, v 4 M / N sum_j pool_j) / bw + C l

(sliced: every canonical element goes to the pool_j ranks of each pipeline j that hold its slice,
one TP index of one stage each; a TP-replicated norm reaches the t_j ranks of a TP group too, a few
thousand values a layer that the formula leaves out). The optimizer steps the rank's M / N
parameters of record: OPTIMIZER_BYTES M / N / mem. No pass hides either collective: the
runtime gathers before the first forward and reduces after every pipeline's last backward,
so the step is G + max_i (pipeline i's schedule) + R + O.

A step that changes strategy costs what any step costs: every step gathers from and reduces into
the same canonical layout, whatever its pipelines.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..vocabulary.cluster import Cluster
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.strategy import Strategy
from .device_memory import FP32, ParameterCounts
from .pipeline import stage_counts
from .whole_step import optimizer_seconds


class Movement(enum.Enum):
    FULL = "full"
    """Whole tensors gathered and reduced over every rank, each keeping its slice: simple, and
    M / P_ik times the bytes a rank needs."""
    SLICED = "sliced"
    """Each rank receives only its slice, as pieces from the shards' owners."""


@dataclass(frozen=True)
class MovementPrices:
    """Seconds a strategy's step spends besides its pipelines' schedules (module docstring)."""

    gather: float
    """G: the compute parameters gathered from the canonical layout, before any pass."""
    reduction: float
    """R: the gradients reduced back into it, after every pipeline's last backward."""
    optimizer: float
    """O: AdamW's step on each rank's canonical shard."""
    bytes_per_rank: float
    """The most bytes one rank sends or receives in the gather (as many again in the reduction)."""

    @property
    def total(self) -> float:
        return self.gather + self.reduction + self.optimizer


def movement_prices(strategy: Strategy, shape: ModelShape, cluster: Cluster,
                    movement: Movement = Movement.FULL) -> MovementPrices:
    """The prices (module docstring) of a step under `strategy` on `cluster` for `shape`."""
    whole = ParameterCounts.of_shape(shape)
    n = cluster.world_size
    optimizer = optimizer_seconds(whole.total / n, cluster)
    if n == 1:
        return MovementPrices(0.0, 0.0, optimizer, 0.0)
    assert cluster.ring_bandwidth is not None, f"cluster {cluster.name!r} of {n} ranks has a ring bandwidth"
    share = (n - 1) / n
    if movement is Movement.FULL:
        moved = share * FP32 * whole.total
    else:
        needed = max(stage_counts(shape, k, p.pp, p.tp).total for p in strategy.pipelines for k in range(p.pp))
        owners_send = whole.total / n * sum(p.pool for p in strategy.pipelines)
        moved = share * FP32 * max(needed, owners_send)
    calls = shape.layers + 1
    seconds = moved / cluster.ring_bandwidth + calls * cluster.all_to_all_latency
    return MovementPrices(seconds, seconds, optimizer, moved)
