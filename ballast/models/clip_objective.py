"""The video models' protocol members around their forward: what a clip is to the planner, the
one-token clip of an idle FSDP pass, and the rectified-flow loss of the held tokens (`flow.py`).
ballast's DiTs (`video_dit.py`) and diffusers' Wan (`diffusers_wan.py`) share it; they differ
only in the forward that predicts the velocity of the held tokens (`Forward`).

The loss is a sum over held tokens of per-token terms, and a token's prediction depends on
other tokens only through self-attention, which never crosses a sample: so the loss of a packed
stream is the sum of its clips' losses, whatever the packing and however the runtime shards it.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..vocabulary.clip import Clip
from ..vocabulary.model_shape import ModelShape
from .flow import clip_timestep, flow_targets, token_loss
from .protocol import Local, PackedStream, held_tokens, take
from .video_conditioning import condition_tokens


class ClipFlowObjective:
    """The protocol's sample and loss members of a video model with `shape` (its geometry: latent
    channels, patch; its caption_dim and max_axis_patches) and a forward
    (noisy patch tokens held, timesteps [samples], conditions, stream, recompute_layers) ->
    predicted velocity [tokens held, patch values]."""

    shape: ModelShape

    @property
    def patch(self) -> tuple[int, int, int]:
        return self.shape.video_geometry.patch

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
        grid = tuple(size // patch for size, patch in zip(latent.shape[1:], self.patch))
        longest = self.shape.max_axis_patches
        if longest is not None and max(grid) > longest:
            raise ValueError(f"{where}: {grid[0]} x {grid[1]} x {grid[2]} patches; model {self.shape.name!r}'s "
                             f"positions cover at most {longest} patches per axis (its RoPE table)")
        return grid

    def dummy_sample(self) -> Clip:
        """One token: a patch of zeros, label 0 or a one-token caption of zeros, key 0."""
        latent = torch.zeros(self.shape.video_geometry.latent_channels, *self.patch)
        caption_dim = self.shape.caption_dim
        return Clip(latent, torch.zeros(1, caption_dim) if caption_dim else 0, 0)

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
