"""What a step reports (`StepResult`, each wave's `WaveTiming` and each micro-batch's
`MicroBatchRecord`), and the clock, the step's statistics over the world and the optimizer step
every executor shares (`Executor`, `PipelineExecutor`, `StrategyExecutor`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.distributed as dist
from torch import Tensor


def device_clock(device: torch.device) -> float:
    """Seconds on a wall clock, read once `device` has run all the work queued so far: CUDA
    kernels and NCCL calls return to Python before they run, so an unsynchronised clock would
    time their launches and put the GPU's work into whichever timer reads next (a wave's busy
    time into its barrier wait). On a CPU the work is done when it returns."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def nonfinite_flags(shares: list[tuple[list[int], Tensor]], samples: int, device: torch.device) -> Tensor:
    """Per sample of `samples`: 1 (or more) where a micro-batch holding it had a non-finite loss
    share; `shares` are the (sample ids, loss share) of the micro-batches a rank ran, checked
    once at the end of the step, not per micro-batch (each check would wait for the device)."""
    flags = torch.zeros(samples, dtype=torch.float32, device=device)
    if shares:
        owners = torch.tensor([k for k, (ids, _) in enumerate(shares) for _ in ids], device=device)
        ids = torch.tensor([i for ids, _ in shares for i in ids], device=device)
        bad = (~torch.isfinite(torch.stack([share for _, share in shares]))).float()
        flags.index_add_(0, ids, bad[owners])
    return flags


def world_statistics(loss: Tensor, nonfinite: Tensor, grads: Iterable[Tensor], *, adds_loss: bool,
                     adds_grads: bool, group: dist.ProcessGroup) -> tuple[float, float, Tensor]:
    """The batch loss, the gradient norm and the per-sample non-finite flags summed over `group`
    in one all-reduce, from each rank's loss share and flags (where `adds_loss`: one rank of each
    set holding the same ones) and the squares of its gradients `grads` (where `adds_grads`:
    every entry counted once over the group). Squares are summed parameter by parameter:
    `torch.sum`'s cascade keeps them to float32 rounding, where one vector_norm over all
    gradients drifted by 5e-5 (tiny)."""
    squares = sum((g.pow(2).sum() for g in grads), torch.zeros((), device=loss.device))
    if not adds_grads:
        squares = torch.zeros_like(squares)
    stats = torch.cat([loss.reshape(1), nonfinite, squares.reshape(1)])
    if not adds_loss:
        stats[:-1] = 0.0
    dist.all_reduce(stats, group=group)
    return float(stats[0]), math.sqrt(float(stats[-1])), stats[1:-1]


def step_if_finite(result: StepResult, optimizer: torch.optim.Optimizer, device: torch.device) -> StepResult:
    """`result` with the optimizer stepped (and timed) unless its loss or gradient norm is not
    finite, which leaves the parameters as they were (`applied` False)."""
    result.applied = math.isfinite(result.loss) and math.isfinite(result.grad_norm)
    if result.applied:
        start = device_clock(device)
        optimizer.step()
        result.optimizer_seconds = device_clock(device) - start
    return result


@dataclass
class WaveTiming:
    busy: float
    """Seconds this rank spent in its micro-batches of the wave (its group's all-to-alls included)."""
    wait: float
    """Seconds it then waited for the wave's other groups to finish."""


@dataclass
class MicroBatchRecord:
    wave: int
    degree: int
    seq_ids: list[int]
    tokens: int
    """Tokens of the micro-batch this rank held (its shard; in a remap domain, its balanced share)."""
    recompute_layers: int
    seconds: float
    activation_bytes: int | None
    """Bytes saved for backward on this rank; None unless the executor measures them."""


@dataclass
class StepResult:
    """What one optimizer step did on this rank (`loss` and `tokens` are the same on all ranks)."""

    loss: float
    """Mean per-token loss of the whole batch."""
    tokens: int
    waves: list[WaveTiming]
    micro_batches: list[MicroBatchRecord] = field(default_factory=list)
    grad_norm: float = 0.0
    """L2 norm of the batch's whole gradient (the same on every rank)."""
    nonfinite_samples: list[int] = field(default_factory=list)
    """The plan's samples (indices) whose micro-batch had a non-finite loss on some rank."""
    applied: bool = True
    """False when the loss or the gradient norm was not finite: the optimizer did not step."""
    sync_seconds: float = 0.0
    """The gradient sync left after the waves: waiting for the buckets still in flight (their
    reduction overlaps this rank's last backward and later waves), the loss all-reduce."""
    optimizer_seconds: float = 0.0

    @property
    def idle_fraction(self) -> float:
        """Share of this rank's wave time spent waiting for other groups."""
        total = sum(w.busy + w.wait for w in self.waves)
        return sum(w.wait for w in self.waves) / total if total > 0 else 0.0
