"""An STDiT3-style video DiT (Open-Sora 1.2): blocks that attend within a frame and blocks that
attend along time, in turn.

A spatial block attends over the tokens of one frame, with 2-D RoPE over (row, column); a
temporal block over one patch column (the same row and column in every frame), with 1-D RoPE
over the frame. Every block also cross-attends to its clip's condition and is adaLN-modulated by
its clip's timestep (`video_layers`). Open-Sora's STDiT3 keeps absolute 2-D sin-cos embeddings
for space and RoPE for time only; rotary positions on both keep every token's computation
independent of where its clip sits in a packed stream, and of the clip's size.

Each block first calls `stream.arrange(x, pattern)`: the runtime's 2D sequence parallelism
moves whole frames to a rank for a spatial block and whole patch columns for a temporal one.
"""
from __future__ import annotations

import torch

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import SPATIAL_TEMPORAL
from .video_dit import VideoDiT


class STDiT(VideoDiT):
    """`shape.layers` blocks: spatial, temporal, spatial, temporal, ... (layers must be even)."""

    PATTERN = SPATIAL_TEMPORAL

    def __init__(self, shape: ModelShape):
        if shape.layers % self.PATTERN.depth_step:
            raise ValueError(f"model {shape.name!r}: an STDiT alternates spatial and temporal blocks, so its "
                             f"layers must be even, got {shape.layers}")
        super().__init__(shape, self.PATTERN.block_spans(shape.layers))


def build_stdit(shape: ModelShape, seed: int = 0) -> STDiT:
    """An STDiT with weights that depend only on `seed` (every rank builds the same model)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return STDiT(shape)
