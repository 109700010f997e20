"""What a cost model knows of its job's pipeline stages (PP degree p > 1), set where the model
meets its cluster (`cost_sources.get_cost_model`, priced by `pipeline.stage_prices`); the
timeline's 1F1B step and `Plan.validate`'s memory per stage read it (docs/design.md, section 4)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .whole_step import DataParallelPrices


@dataclass(frozen=True)
class StagePrices:
    """A pipeline's stages as the cost model prices them."""

    states: tuple[float, ...]
    """Bytes a rank of each stage holds besides activations: its stage's parameters,
    gradients and optimizer state in the job's sharding mode (`pipeline.stage_states`)."""
    hidden: int
    """Values a token's row carries across a boundary: the model's width."""
    bandwidth: float
    """Bytes/s a rank sends across a boundary while its whole stage sends
    (`pipeline.boundary_bandwidth`)."""
    latency: float
    """Seconds a transfer costs beyond its bytes: the cluster's collective latency."""
    data_parallel: tuple[DataParallelPrices, ...] = field(default=())
    """Each stage's data-parallel prices: its own parameters' sync over its pool, FSDP2's gathers
    and the optimizer step (`whole_step.data_parallel_prices`); empty: none priced."""

    @property
    def count(self) -> int:
        """p: the pipeline's stages."""
        return len(self.states)
