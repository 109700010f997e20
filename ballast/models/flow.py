"""The video models' objective: rectified flow on patch tokens.

A clip's latent x0 is carried to noise along a straight line, x_t = (1 - t) x0 + t noise, and
the model learns the line's velocity, noise - x0, at a point of it (Open-Sora 2's and SD3's
formulation). Every clip draws its own t and noise from a generator seeded by `Clip.key` alone,
so a clip's inputs and targets are the same on whichever rank, in whichever micro-batch and at
whichever position of a stream it lands: the sharded loss sums to the single-process loss.

t is logit-normal, sigmoid(n) with n ~ N(0, 1): it favours the middle of the path, where the
velocity is hardest to predict, over both ends (SD3, section 3.1; Open-Sora 2 samples it so).

Tokens are a clip's patches in the stream's order (frame-major, each frame row-major, see
`protocol`); a token's values are its patch's latent values ordered (channel, frame, row,
column), ModelShape.vocab of them.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..vocabulary.clip import Clip

TIMESTEP_SCALE = 1000.0
"""t in (0, 1) is embedded as t * 1000: the range Open-Sora's and Wan's timestep embeddings
(sinusoids of 10000 ** -i periods) were made for."""


def _generator(clip: Clip) -> torch.Generator:
    # A CPU generator: the same draws on every device type (CUDA generators draw differently).
    return torch.Generator().manual_seed(int(clip.key))


def clip_timestep(clip: Clip) -> float:
    """The clip's t in (0, 1): sigmoid of the generator's first standard normal draw."""
    return torch.sigmoid(torch.randn((), generator=_generator(clip), dtype=torch.float64)).item()


def clip_noise(clip: Clip) -> tuple[float, Tensor]:
    """(t, noise): the clip's timestep and its noise, float32 of the latent's shape, on the
    latent's device. Drawn from one generator in this order, so t equals `clip_timestep`."""
    generator = _generator(clip)
    t = torch.sigmoid(torch.randn((), generator=generator, dtype=torch.float64)).item()
    noise = torch.randn(tuple(clip.latent.shape), generator=generator, dtype=torch.float32)
    return t, noise.to(clip.latent.device)


def patchify(latent: Tensor, patch: Sequence[int]) -> Tensor:
    """[C, F, H, W] -> [F/pf * H/ph * W/pw, C * pf * ph * pw]: one row per token in stream
    order (frame-major, each frame row-major), a token's values ordered (C, pf, ph, pw)."""
    channels, frames, height, width = latent.shape
    pf, ph, pw = patch
    blocks = latent.reshape(channels, frames // pf, pf, height // ph, ph, width // pw, pw)
    # (C, F', pf, H', ph, W', pw) -> (F', H', W', C, pf, ph, pw)
    return blocks.permute(1, 3, 5, 0, 2, 4, 6).reshape(-1, channels * pf * ph * pw)


def unpatchify(tokens: Tensor, grid: Sequence[int], patch: Sequence[int]) -> Tensor:
    """`patchify`'s inverse: [F' H' W', C pf ph pw] tokens of a (F', H', W') grid -> [C, F, H, W]."""
    frames, height, width = grid
    pf, ph, pw = patch
    channels = tokens.shape[1] // (pf * ph * pw)
    blocks = tokens.reshape(frames, height, width, channels, pf, ph, pw)
    return blocks.permute(3, 0, 4, 1, 5, 2, 6).reshape(channels, frames * pf, height * ph, width * pw)


def _patch_index(shapes: Sequence[Sequence[int]], patch: Sequence[int]) -> Tensor:
    """[tokens, C pf ph pw]: where every value of `patchify`'s tokens of latents of these
    [C, F, H, W] shapes sits in their latents flattened and concatenated. One gather by it
    patchifies a whole stream of clips at once (a permutation per clip, vectorised)."""
    pf, ph, pw = patch
    shape = torch.tensor([tuple(s) for s in shapes], dtype=torch.long).view(-1, 4)
    channels, frames, height, width = shape.unbind(1)
    grid_f, grid_h, grid_w = frames // pf, height // ph, width // pw
    tokens = grid_f * grid_h * grid_w
    total = int(tokens.sum())
    clip = torch.repeat_interleave(torch.arange(len(shapes)), tokens, output_size=total)
    base = torch.cumsum(channels * frames * height * width, 0) - channels * frames * height * width
    token = torch.arange(total) - (torch.cumsum(tokens, 0) - tokens)[clip]  # frame-major, row-major
    per_frame = (grid_h * grid_w)[clip]
    f, h, w = token // per_frame, token % per_frame // grid_w[clip], token % grid_w[clip]
    plane, row = (height * width)[clip], width[clip]
    start = base[clip] + f * pf * plane + h * ph * row + w * pw
    # A token's values in (C, pf, ph, pw) order; C is the same for every clip of a stream.
    c, a, b, d = torch.meshgrid(*(torch.arange(n) for n in (int(channels[0]) if len(shapes) else 0, pf, ph, pw)),
                                indexing="ij")
    c, a, b, d = (x.reshape(1, -1) for x in (c, a, b, d))
    return start[:, None] + c * (frames[clip] * plane)[:, None] + a * plane[:, None] + b * row[:, None] + d


def _flow(clips: Sequence[Clip], patch: Sequence[int]) -> tuple[Tensor, Tensor, list[float]]:
    """(x_t tokens, target velocity tokens, t of every clip) of clips packed in stream order.
    Each clip draws from its own generator (`clip_noise`); the rest is one op over the stream."""
    draws = [clip_noise(clip) for clip in clips]
    latents = [clip.latent for clip in clips]
    x0 = torch.cat([latent.reshape(-1) for latent in latents]).to(torch.float32)
    noise = torch.cat([n.reshape(-1) for _, n in draws])
    ts = [t for t, _ in draws]
    # Per value: (1 - t) and t of its clip, rounded to float32 as a float32 tensor times a
    # Python float is.
    sizes = torch.tensor([latent.numel() for latent in latents], dtype=torch.long)
    t = torch.repeat_interleave(torch.tensor(ts, dtype=torch.float64), sizes, output_size=x0.numel())
    one_minus_t, t = (1.0 - t).to(torch.float32).to(x0.device), t.to(torch.float32).to(x0.device)
    x_t = one_minus_t * x0 + t * noise
    index = _patch_index([latent.shape for latent in latents], patch).to(x0.device)
    return x_t[index], (noise - x0)[index], ts


def flow_pair(clip: Clip, patch: Sequence[int]) -> tuple[Tensor, Tensor, float]:
    """(x_t tokens, target velocity tokens, t) of one clip, in float32."""
    x_t, target, (t,) = _flow([clip], patch)
    return x_t, target, t


def flow_targets(clips: Sequence[Clip], patch: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """(x_t tokens [tokens, values], target velocity tokens [tokens, values], t [clips]) of a
    whole stream of clips, packed in stream order."""
    if not clips:
        raise ValueError("flow_targets of no clips: a stream has at least one")
    x_t, target, ts = _flow(clips, patch)
    return x_t, target, torch.tensor(ts, dtype=torch.float32)


def token_loss(predicted: Tensor, target: Tensor) -> Tensor:
    """Per-token loss [tokens]: the mean over a token's patch values of the squared error."""
    return (predicted.float() - target.float()).pow(2).mean(dim=-1)
