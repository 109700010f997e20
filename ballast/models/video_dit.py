"""A video diffusion transformer over a packed stream of clips, behind the runtime's model
protocol: what `stdit.py` (spatial and temporal blocks in turn) and `dit.py` (full attention)
share; they differ only in their blocks' attention patterns.

    patch embedding -> blocks (each arranges the stream for its pattern first) -> arrange back
    to the INPUT layout -> final layer -> rectified-flow loss (`clip_objective.py`) of the held
    tokens (spatial and temporal blocks attend inside a frame or a patch column, never across
    a sample)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import Span
from .clip_objective import ClipFlowObjective
from .protocol import INPUT, AttentionFn, PackedStream
from .video_conditioning import ConditionEncoder, Conditioning, TimestepEmbedding
from .video_layers import FinalLayer, VideoBlock

INIT_STD = 0.02


class VideoDiT(ClipFlowObjective, nn.Module):
    """Patch embedding, one `VideoBlock` per entry of `patterns`, final layer; conditioned on
    each clip's timestep (adaLN-zero) and condition (cross-attention)."""

    def __init__(self, shape: ModelShape, patterns: Sequence[Span]):
        super().__init__()
        geometry = shape.video_geometry
        if not shape.cross_attention:
            raise ValueError(f"model {shape.name!r}: a video DiT is conditioned through cross-attention "
                             f"(cross_attention must be true)")
        if shape.vocab != geometry.latent_channels * math.prod(geometry.patch):
            raise ValueError(f"model {shape.name!r}: vocab {shape.vocab} must be a token's patch values, latent "
                             f"channels {geometry.latent_channels} x patch {geometry.patch}")
        self.shape = shape
        self.patch_embedding = nn.Linear(shape.vocab, shape.hidden)
        self.timestep = TimestepEmbedding(shape.hidden)
        # adaLN's projection shared by all blocks (STDiT3's t_block, Wan's time_projection).
        self.time_modulation = nn.Sequential(nn.SiLU(), nn.Linear(shape.hidden, 6 * shape.hidden))
        self.condition = ConditionEncoder(shape)
        # A block arranges the stream only when its pattern differs from the block before's.
        self.layers = nn.ModuleList(VideoBlock(shape, pattern, arranges=i == 0 or pattern != patterns[i - 1])
                                    for i, pattern in enumerate(patterns))
        self.final = FinalLayer(shape)
        self._initialise()

    def _initialise(self) -> None:
        # Xavier linears with zero biases (DiT, Wan); embeddings N(0, 0.02) (Wan's text and time
        # embeddings). Zero: the shared adaLN projection (with the zero tables, every gate is 0,
        # every block the identity), cross-attention's output (it has no gate; STDiT3) and the
        # final linear (DiT, Wan).
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:  # the MLP's (gpt.MLP) and cross-attention's keys have none
                    nn.init.zeros_(module.bias)
        for module in [*self.timestep.modules(), *self.condition.modules()]:
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
        zeroed = [self.time_modulation[1], self.final.linear, *(block.cross_attention.o for block in self.layers)]
        for module in zeroed:
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)

    def blocks(self) -> nn.ModuleList:
        return self.layers

    def install_attention(self, attend: AttentionFn) -> None:
        for block in self.layers:
            block.attention.attend = attend

    def conditioning(self, timesteps: Tensor, conditions: Sequence[Any], device: torch.device) -> Conditioning:
        """Every sample's adaLN modulation, time embedding and condition tokens."""
        time = self.timestep(timesteps.to(device))
        tokens, bounds, rows = self.condition(conditions, device)
        return Conditioning(self.time_modulation(time).unflatten(1, (6, self.shape.hidden)), time, tokens, bounds,
                            rows)

    def forward(self, tokens: Tensor, timesteps: Tensor, conditions: Sequence[Any], stream: PackedStream,
                recompute_layers: int = 0) -> Tensor:
        """Predicted velocity [tokens held, patch values] of the noisy patch tokens this process
        holds (`tokens`, one row per row of `stream.positions`, in its layout), given every
        sample's timestep [samples] and condition. The first `recompute_layers` blocks keep only
        their input and recompute the rest in backward (non-reentrant `torch.utils.checkpoint`;
        a block's arrange is recomputed too, alike on every rank)."""
        if tokens.dim() != 2 or tokens.shape != (stream.positions.shape[0], self.shape.vocab):
            raise ValueError(f"tokens of shape {tuple(tokens.shape)} do not match the stream's "
                             f"{stream.positions.shape[0]} positions x {self.shape.vocab} patch values")
        if not 0 <= recompute_layers <= len(self.layers):
            raise ValueError(f"recompute_layers {recompute_layers} is outside 0..{len(self.layers)}")
        device = stream.positions.device
        condition = self.conditioning(timesteps, conditions, device)
        x = self.patch_embedding(tokens.to(device, self.patch_embedding.weight.dtype))
        for i, block in enumerate(self.layers):
            if i < recompute_layers:
                x, stream = checkpoint(block, x, stream, condition, use_reentrant=False)
            else:
                x, stream = block(x, stream, condition)
        x, stream = stream.arrange(x, INPUT)
        return self.final(x, stream, condition)
