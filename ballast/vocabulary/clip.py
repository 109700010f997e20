"""A video sample as the video models train on it: a latent clip, its condition and its key.

The value the data pipeline (`dataset/video.py`) hands the runtime and the video models
(`models/flow.py`, `models/video_dit.py`); `samples.py` has its shape, what planners see."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


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
    """Seeds the clip's noise and timestep (`models/flow.py`): depends on the draw, never on the plan,
    so a clip's loss is the same on whichever rank and in whichever micro-batch it lands."""
