"""How far a distributed run is from the single-process reference (see command.py for why
two checks with two tolerances)."""
from __future__ import annotations

from dataclasses import dataclass

from .reference import Trajectory

GRAD_TOLERANCE = 1e-5
PARAM_TOLERANCE = 1e-3


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


def param_drift(result: Trajectory, reference: Trajectory) -> float:
    """||p - p_ref|| / ||p_ref - p_0||: how far apart two trajectories ended, relative to how far
    the reference travelled."""
    moved = float((reference.params - reference.start_params[0]).norm())
    return float((result.params - reference.params).norm()) / moved
