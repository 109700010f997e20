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
from ballast.vocabulary.model_shape import MODEL_PRESETS, ModelShape
from ballast.vocabulary.sharding import Sharding

SHAPE = MODEL_PRESETS["tiny"]
GRAD_RTOL = verify.GRAD_TOLERANCE
PARAM_DRIFT = verify.PARAM_TOLERANCE
# 10 sequences, 218 tokens; most lengths are not divisible by 2 or 4, one has a single token.
LENGTHS = [37, 5, 12, 61, 3, 20, 9, 44, 1, 26]
STEPS = 3


def make_batches() -> list[verify.VerifyBatch]:
    """STEPS batches of LENGTHS with seeded random tokens."""
    generator = torch.Generator().manual_seed(0)
    return [verify.VerifyBatch(LENGTHS, [torch.randint(0, SHAPE.vocab, (s + 1,), generator=generator) for s in LENGTHS])
            for _ in range(STEPS)]


def planner_plans(world: int, batches: list[verify.VerifyBatch], lockstep: bool = False) -> dict[str, list[dict]]:
    """Every registered planner's plan of the first batch, at `ballast verify`'s default budget
    priced as under FSDP2, for every sharding's plans: there the longest sequence needs SP degree
    2 or more, and plans run all-to-alls. (Replicated, a rank holds AdamW's temporaries after
    backward, which verify's budget does not go below, and that holds every sequence of this
    batch on one rank: every planner's plan was degree 1.) The executor tests check exactness,
    not memory: any sharding runs these plans."""
    cluster, cost = verify.budget(SHAPE, world, max(LENGTHS), sharding=Sharding.FSDP)
    options = PlannerOptions(time_limit=2.0, lockstep=lockstep)
    return {name: [get_planner(name, cluster, cost, options).plan(batches[0].lengths).to_dict()]
            for name in PLANNERS}


def assert_single_process_gradients(result: verify.Trajectory, batches: list[verify.VerifyBatch]) -> None:
    """Every step's loss and gradient equal one process's at the parameters the step started from."""
    expected = verify.reference_at(SHAPE, result, batches[:len(result.grads)])
    for got, want in zip(result.grads, expected.grads, strict=True):
        assert float((got - want).abs().max() / want.abs().max()) <= GRAD_RTOL
    for got, want in zip(result.losses, expected.losses, strict=True):
        assert got == pytest.approx(want, rel=GRAD_RTOL)


# --------------------------------------------------------------------------------------------
# video DiTs (`test_video_planners.py`)


def clip_batch(shape: ModelShape, grids: list[tuple[int, int, int]], seed: int = 0) -> verify.VerifyBatch:
    """Clips of exactly these (frames, height, width) patch grids for a video `shape`: seeded
    Gaussian latents, labels 0, 1, 2, ... (mod 16) and distinct keys (`random_clips` draws the
    grids at random; these tests need chosen ones)."""
    from ballast.vocabulary.clip import Clip

    geometry = shape.video_geometry
    generator = torch.Generator().manual_seed(seed)
    clips = [Clip(torch.randn(geometry.latent_channels, *(g * p for g, p in zip(grid, geometry.patch)),
                              generator=generator), i % 16, 1000 + 7 * i + seed)
             for i, grid in enumerate(grids)]
    return verify.VerifyBatch([f * h * w for f, h, w in grids], clips, [tuple(g) for g in grids])


def perturbed_params(shape: ModelShape, seed: int = 0, scale: float = 0.05) -> torch.Tensor:
    """`build_model(shape, seed)`'s parameters, each moved by `scale` x N(0, 1), flattened: a
    video DiT starts from adaLN-zero (zero gates, zero final layer), where most gradients are
    exactly zero and a comparison of them proves nothing."""
    from ballast.models import build_model

    model = build_model(shape, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    return verify.flatten(p.detach() + scale * torch.randn(p.shape, generator=generator) for p in model.parameters())


def load_params(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Set every parameter from `flat` (model order, as `verify.flatten`), replicated or sharded
    with FSDP2 (each rank copies its own shard: no collective)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = list(model.parameters())
    with torch.no_grad():
        for p, piece in zip(params, torch.split(flat, [p.numel() for p in params]), strict=True):
            full = piece.view(p.shape).to(p.dtype)
            if isinstance(p, DTensor):
                p.copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None))
            else:
                p.copy_(full)
