"""A video sample as the video models train on it: a latent clip, its condition and its key."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:
    from ..model_shape import ModelShape

LABELS = 16
"""Class labels a label-conditioned clip carries (0..15): the video models' label table, and
what the synthetic data draws."""
CAPTION_TOKENS = 8
"""Tokens of the random caption embeddings `gaussian_clips` gives a caption-conditioned model."""


@dataclass(frozen=True)
class Clip:
    """One training clip in the VAE's latent space (VAE encoding happens offline, as users
    precompute it; ballast trains the diffusion transformer on latents)."""

    latent: Tensor
    """[channels, frames, height, width] float32 latents; height and width in latent pixels
    (the model's patch size divides them)."""
    condition: int | Tensor
    """What the clip is conditioned on: a class label, or a caption embedding [tokens, dim]."""
    key: int
    """Seeds the clip's noise and timestep (`flow.py`): depends on the draw, never on the plan,
    so a clip's loss is the same on whichever rank and in whichever micro-batch it lands."""


def gaussian_clips(grids: Sequence[tuple[int, int, int]], shape: ModelShape, seed: int) -> list[Clip]:
    """Clips of these (frames, height, width) latent-patch grids for `shape`'s model, the same
    for the same seed (on every rank): Gaussian latents [channels, F pf, H ph, W pw]
    (`shape.video_geometry`), the condition the model takes (a class label, or a caption
    embedding of `shape.caption_dim`), and a key. What verify and the profiler run."""
    geometry = shape.video_geometry
    pf, ph, pw = geometry.patch
    generator = torch.Generator().manual_seed(seed)
    clips = []
    for frames, height, width in grids:
        latent = torch.randn((geometry.latent_channels, frames * pf, height * ph, width * pw), generator=generator)
        condition = (torch.randn((CAPTION_TOKENS, shape.caption_dim), generator=generator) if shape.caption_dim
                     else int(torch.randint(0, LABELS, (), generator=generator)))
        clips.append(Clip(latent, condition, int(torch.randint(0, 2 ** 62, (), generator=generator))))
    return clips
