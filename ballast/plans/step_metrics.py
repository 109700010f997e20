"""What simulating a plan gives: its segments on the ranks and the step's metrics
(`timeline.simulate`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Segment:
    """One micro-batch on one group's ranks in the timeline."""

    wave: int
    start_rank: int
    degree: int
    micro_batch: int
    begin: float
    compute: float
    """Seconds of computation (including the fixed per-micro-batch overhead)."""
    comm: float
    """Seconds of communication: all-to-alls, and FSDP2's gathers where they outlast the compute."""
    stage: int = 0
    """Under PP, the pipeline stage the pass runs on (0 without a pipeline)."""
    forward: bool | None = None
    """Under PP, whether the pass is the micro-batch's forward (else its backward); None: both."""

    @property
    def end(self) -> float:
        return self.begin + self.compute + self.comm


@dataclass
class StepMetrics:
    step_time: float
    """The whole step: the waves (or the pipeline's schedule), the gradient reduction left after
    them, the optimizer step."""
    tokens: int
    lower_bound: float
    """The whole step's (`report_lower_bound`)."""
    busy: np.ndarray
    """Seconds each rank spends computing or communicating."""
    comm: np.ndarray
    """Seconds each rank spends in all-to-alls."""
    wave_times: list[float]
    segments: list[Segment] = field(default_factory=list)
    nic_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Bytes each NIC of the cluster sends in the step (`nic_bytes`; none on one node)."""
    bubble: float = 0.0
    """Under PP, seconds of the step the pipeline's busiest rank of a stage idles
    (`PipelineTimes.bubble`: the step less its work); 0 without a pipeline."""
    sync_time: float = 0.0
    """Seconds of the gradient reduction after the waves end: what the last backwards left."""
    optimizer_time: float = 0.0
    """Seconds of the optimizer step and what follows it (ZeRO-1's parameter broadcasts)."""

    @property
    def waves_time(self) -> float:
        """The waves' seconds (the pipeline's schedule under PP): the step less its tail."""
        return self.step_time - self.sync_time - self.optimizer_time

    @property
    def bubble_fraction(self) -> float:
        """The pipeline's bubble as a share of the step."""
        return self.bubble / self.step_time if self.step_time > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_time if self.step_time > 0 else 0.0

    @property
    def idle_fraction(self) -> float:
        if self.step_time <= 0:
            return 0.0
        return max(0.0, 1.0 - float(self.busy.sum()) / (len(self.busy) * self.step_time))

    @property
    def vs_lower_bound(self) -> float:
        return self.step_time / self.lower_bound if self.lower_bound > 0 else 1.0
