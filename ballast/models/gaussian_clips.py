"""Gaussian clips (`ballast.vocabulary.clip.Clip`) for any video model, with the conditions it
takes: what verify and the profiler run."""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..vocabulary.clip import Clip
from .video_conditioning import LABELS

if TYPE_CHECKING:
    from ..vocabulary.model_shape import ModelShape

CAPTION_TOKENS = 8
"""Tokens of the random caption embeddings `gaussian_clips` gives a caption-conditioned model."""


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
