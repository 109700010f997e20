"""A video diffusion transformer over a packed stream of clips, behind the runtime's model
protocol: what `stdit.py` (spatial and temporal blocks in turn) and `dit.py` (full attention)
share; they differ only in their blocks' attention patterns.

    patch embedding -> blocks (each arranges the stream for its pattern first) -> arrange back
    to the INPUT layout -> final layer -> rectified-flow loss (`flow.py`) of the held tokens

The loss is a sum over held tokens of per-token terms, and a token's prediction depends on
other tokens only through self-attention, which never crosses a sample (nor, for spatial and
temporal blocks, a frame or a patch column): so the loss of a packed stream is the sum of its
clips' losses, whatever the packing and however the runtime shards it.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import Span
from ..vocabulary.clip import Clip
from .flow import clip_timestep, flow_targets, token_loss
from .protocol import INPUT, AttentionFn, Local, PackedStream, held_tokens, take
from .video_conditioning import ConditionEncoder, Conditioning, TimestepEmbedding, condition_tokens
from .video_layers import FinalLayer, VideoBlock

INIT_STD = 0.02


class VideoDiT(nn.Module):
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
        self.patch = geometry.patch
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

    def sample_shape(self, sample: Clip) -> tuple[int, int, int]:
        """(frames, height, width) in patches of a clip; ValueError naming what the model cannot take."""
        return self._grid(sample, "a clip")

    def _grid(self, sample: Clip, where: str) -> tuple[int, int, int]:
        latent = getattr(sample, "latent", None)
        if not isinstance(latent, Tensor):
            raise ValueError(f"{where}: a video sample is a Clip (latent, condition, key); got {type(sample).__name__}")
        if latent.dim() != 4 or not latent.is_floating_point():
            raise ValueError(f"{where}: the latent is a 4-D float tensor [channels, frames, height, width]; got "
                             f"{latent.dim()}-D {latent.dtype}")
        channels = self.shape.video_geometry.latent_channels
        if latent.shape[0] != channels:
            raise ValueError(f"{where}: the latent has {latent.shape[0]} channels; model {self.shape.name!r} takes "
                             f"{channels}")
        for name, size, patch in zip(("frames", "height", "width"), latent.shape[1:], self.patch):
            if size < 1 or size % patch:
                raise ValueError(f"{where}: latent {name} {size} is not a positive multiple of the patch's {patch} "
                                 f"(latent shape {tuple(latent.shape)}, patch {self.patch})")
        condition_tokens(sample.condition, self.shape.caption_dim, where)
        return tuple(size // patch for size, patch in zip(latent.shape[1:], self.patch))

    def dummy_sample(self) -> Clip:
        """One token: a patch of zeros, label 0 or a one-token caption of zeros, key 0."""
        latent = torch.zeros(self.shape.video_geometry.latent_channels, *self.patch)
        caption_dim = self.shape.caption_dim
        return Clip(latent, torch.zeros(1, caption_dim) if caption_dim else 0, 0)

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

    def loss(self, samples: Sequence[Clip], stream: PackedStream, local: Local, recompute_layers: int = 0) -> Tensor:
        """Summed rectified-flow loss of the held tokens (`protocol.ParallelModel.loss`): for each
        token, the mean over its patch values of (predicted - target velocity)^2."""
        bounds = stream.bounds
        if len(samples) != len(bounds) - 1:
            raise ValueError(f"{len(samples)} samples for a stream of {len(bounds) - 1}")
        for i, sample in enumerate(samples):
            grid = self._grid(sample, f"sample {i} of the micro-batch")
            if stream.grids is not None and grid != tuple(stream.grids[i]):
                raise ValueError(f"sample {i} of the micro-batch is {grid} patches; the stream has {stream.grids[i]}")
        if (held := held_tokens(local, bounds[-1])) != stream.positions.shape[0]:
            raise ValueError(f"local {local if isinstance(local, slice) else 'indices'} holds {held} tokens; "
                             f"the stream's positions describe {stream.positions.shape[0]}")
        # Noise and targets of the clips from the first to the last this process holds a token
        # of (all of them for a slice); the timestep of every clip, since an arrange may bring
        # tokens of any of them here.
        if isinstance(local, slice):
            start, stop, _ = local.indices(bounds[-1])
            first, last = (start, stop - 1) if stop > start else (0, -1)
        else:
            first, last = (int(local.min()), int(local.max())) if held else (0, -1)
        touched = [i for i in range(len(samples)) if bounds[i] <= last and bounds[i + 1] > first]
        drawn = {}
        if touched:
            # One pass over the touched clips (`flow_targets`: a generator per clip, the rest
            # batched); their t come with it, the others' from `clip_timestep`.
            noisy, target, ts = flow_targets([samples[i] for i in touched], self.patch)
            if isinstance(local, slice):
                offset = start - bounds[touched[0]]
                noisy, target = noisy[offset:offset + stop - start], target[offset:offset + stop - start]
            else:  # context parallelism's head and tail chunks: stream indices
                noisy, target = (take(x, local - bounds[touched[0]]) for x in (noisy, target))
            drawn = dict(zip(touched, ts.tolist()))
        else:
            noisy = target = torch.zeros(0, self.shape.vocab)
        timesteps = torch.tensor([drawn[i] if i in drawn else clip_timestep(s) for i, s in enumerate(samples)],
                                 dtype=torch.float32)
        predicted = self(noisy, timesteps, [s.condition for s in samples], stream, recompute_layers)
        # Summed, not averaged: the runtime divides by the step's tokens. An empty slice sums to
        # a zero still on the graph (its rank runs backward like the others).
        return token_loss(predicted, target.to(predicted.device)).sum()
