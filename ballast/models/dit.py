"""A Wan 2.1-style video DiT: every block attends over its whole clip.

Full bidirectional self-attention inside each clip with 3-D RoPE over (frame, row, column)
(Wan's split of a head: of its head_dim / 2 rotation pairs, row and column take a third each,
frame the rest), cross-attention to the clip's condition and adaLN modulation by its timestep
(a shared projection plus a table per block, `video_layers`). All blocks share one pattern, so
only the first arranges the stream (the runtime runs full attention under Ulysses).
"""
from __future__ import annotations

import torch

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import FULL_DIT
from .video_dit import VideoDiT


class DiT(VideoDiT):
    """`shape.layers` full-attention blocks."""

    PATTERN = FULL_DIT

    def __init__(self, shape: ModelShape):
        super().__init__(shape, self.PATTERN.block_spans(shape.layers))


def build_dit(shape: ModelShape, seed: int = 0) -> DiT:
    """A DiT with weights that depend only on `seed` (every rank builds the same model)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DiT(shape)
