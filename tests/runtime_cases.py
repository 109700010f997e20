"""What the executor tests share: the model, the batch, the tolerances, the planners' plans.

Tolerances (fp32), as in `ballast.verify`: a step's gradient at given parameters must match the
single-process gradient of the whole batch to GRAD_RTOL relative to its largest entry, since
only summation order differs (measured ~5e-7). Trajectories of several AdamW steps drift apart
by ~3e-5 of the distance travelled (L2), exactly as much as one process and itself with another
thread count (AdamW divides by sqrt(v) + 1e-8 and so magnifies the rounding of small
gradients); PARAM_DRIFT leaves room for that (see `ballast.verify`).
"""
from __future__ import annotations

import pytest
import torch

from ballast import verify
from ballast.planners import PLANNERS, PlannerOptions, get_planner
from ballast.model_shape import MODEL_PRESETS

SHAPE = MODEL_PRESETS["tiny"]
GRAD_RTOL = verify.GRAD_TOLERANCE
PARAM_DRIFT = verify.PARAM_TOLERANCE
# 10 sequences, 218 tokens; most lengths are not divisible by 2 or 4, one has a single token.
LENGTHS = [37, 5, 12, 61, 3, 20, 9, 44, 1, 26]
STEPS = 5


def make_batches() -> list[verify.Batch]:
    """STEPS batches of LENGTHS with seeded random tokens."""
    generator = torch.Generator().manual_seed(0)
    return [verify.Batch(LENGTHS, [torch.randint(0, SHAPE.vocab, (s + 1,), generator=generator) for s in LENGTHS])
            for _ in range(STEPS)]


def planner_plans(world: int, batches: list[verify.Batch], lockstep: bool = False) -> dict[str, list[dict]]:
    """Every registered planner's plan of the first batch, at `ballast verify`'s default budget
    (the longest sequence needs SP degree 2 or more: plans run all-to-alls)."""
    cluster, cost = verify.budget(SHAPE, world, max(LENGTHS))
    options = PlannerOptions(time_limit=2.0, lockstep=lockstep)
    return {name: [get_planner(name, cluster, cost, options).plan(batches[0].lengths).to_dict()]
            for name in PLANNERS}


def assert_single_process_gradients(result: verify.Trajectory, batches: list[verify.Batch]) -> None:
    """Every step's loss and gradient equal one process's at the parameters the step started from."""
    expected = verify.reference_at(SHAPE, result, batches[:len(result.grads)])
    for got, want in zip(result.grads, expected.grads, strict=True):
        assert float((got - want).abs().max() / want.abs().max()) <= GRAD_RTOL
    for got, want in zip(result.losses, expected.losses, strict=True):
        assert got == pytest.approx(want, rel=GRAD_RTOL)
