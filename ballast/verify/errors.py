"""How far a distributed run is from the single-process reference (see command.py for why
two checks with two tolerances)."""
from __future__ import annotations

from dataclasses import dataclass

from .reference import Trajectory

GRAD_TOLERANCE = 1e-5
PARAM_TOLERANCE = 1e-3
BF16_GAP_MULTIPLE = 4.0
"""Under bf16 a distributed run may differ from the fp32 reference by this multiple of what the
single-process model itself differs by in bf16 (`bf16_tolerances`).

Why a measured gap, not a fixed number: bf16 keeps 8 significant bits, so every product,
activation and softmax rounds by up to 2^-9 relative, and how those roundings add up through a
model's depth, norms and loss depends on the model: at the same parameters the single-process
bf16 gradient is 8e-3 of its largest entry from fp32 on `tiny`, 1.2e-2 on a tiny HF Llama,
4.5e-3 on the tiny DiTs (verify's 1 step of 8 sequences up to 64 tokens). A distributed run
rounds the same operations, on shards and in another order, so its error is of the same size:
measured 1.0-1.2x the gap for those models on 2 and 4 ranks (Ulysses and CP groups), while a
lost, doubled or misplaced micro-batch, shard or head moves the gradient by O(1) of its largest
entry. 4x leaves room for the order and stays far below that O(1) while the gap is under ~0.1.
The parameters' drift after AdamW steps is a weak check in bf16: AdamW turns the rounding of
small gradient entries into update differences of the order of the move itself (the single-
process gap is 0.07-0.13 there, 1.0x of it measured distributed), so the gradient check at the
same parameters is the one that catches a wrong plan."""


@dataclass
class Errors:
    loss: float
    """Largest relative error of a step's loss (at the same parameters)."""
    grad_abs: float
    grad_rel: float
    """Largest error of a step's gradient (at the same parameters), relative to max |gradient|."""
    param_abs: float
    param_drift: float
    """L2 error of the final parameters (independent trajectories), relative to the reference's
    L2 distance from the initial parameters."""

    def within(self, grad_tolerance: float, param_tolerance: float) -> bool:
        return max(self.loss, self.grad_rel) <= grad_tolerance and self.param_drift <= param_tolerance


def errors_against(result: Trajectory, at_same_params: Trajectory, reference: Trajectory) -> Errors:
    """`result`'s steps against `at_same_params` (see `reference_at`), its end against `reference`'s."""
    pairs = list(zip(result.grads, at_same_params.grads, strict=True))
    loss = max(abs(a - b) / abs(b) for a, b in zip(result.losses, at_same_params.losses, strict=True))
    grad_abs = max(float((g - r).abs().max()) for g, r in pairs)
    grad_rel = max(float((g - r).abs().max() / r.abs().max()) for g, r in pairs)
    param_abs = float((result.params - reference.params).abs().max())
    return Errors(loss, grad_abs, grad_rel, param_abs, param_drift(result, reference))


def bf16_tolerances(fp32_at: Trajectory, bf16_at: Trajectory, fp32_reference: Trajectory,
                    bf16_reference: Trajectory) -> tuple[float, float]:
    """(grad tolerance, param tolerance) of a bf16 run: BF16_GAP_MULTIPLE times the single-process
    model's bf16-vs-fp32 gap (its loss and gradient at the run's parameters, `fp32_at` against
    `bf16_at`; its parameters after the steps, `bf16_reference` against `fp32_reference`), at
    least the fp32 tolerances."""
    gap = errors_against(Trajectory(bf16_at.losses, bf16_at.grads, bf16_at.start_params, bf16_reference.params),
                         fp32_at, fp32_reference)
    return (max(GRAD_TOLERANCE, BF16_GAP_MULTIPLE * max(gap.loss, gap.grad_rel)),
            max(PARAM_TOLERANCE, BF16_GAP_MULTIPLE * gap.param_drift))


def param_drift(result: Trajectory, reference: Trajectory) -> float:
    """||p - p_ref|| / ||p_ref - p_0||: how far apart two trajectories ended, relative to how far
    the reference travelled."""
    moved = float((reference.params - reference.start_params[0]).norm())
    return float((result.params - reference.params).norm()) / moved
