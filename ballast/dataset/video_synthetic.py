"""`video-synthetic[:SEED[:PATH]]`: procedural clips in a model's latent space.

Content is a function of (SEED, sample id) alone (numpy's PCG64 seeded with [SEED, 1, id]):
1 to 3 shapes of one kind move (a sinusoidal path), pulse in size and spin over a background
(a per-channel colour, a linear ramp and a drifting sinusoidal plaid). The kind is the
condition label (`KINDS`, 0..7): it fixes the outline, the fill texture (stripes and checker)
and the base colour (a fixed palette per kind, jittered per shape), so a conditioned model can
learn what a label looks like and an unconditioned one still learns smooth moving structure.
A model conditioned on caption embeddings (caption_dim D > 0, a Wan's text_dim) reads instead
the kind's caption (`kind_caption`): 2 + kind tokens of width D, N(0, 1), fixed per (kind, D),
standing in for a text encoder's embedding of the kind's name (captions of several lengths).
Edges are anti-aliased over about one latent pixel. Values are O(1), like scaled VAE latents.

Shapes. By default the clips have DCP's any-size bucket shapes (`clips.video_source`: Open-Sora's
resolutions x frame counts under the model's geometry, Zipf weights), every one scaled by the
same factor per side (frames, height, width in patches; at least 1 patch each), the largest
factor under which the largest bucket holds at most max_len tokens: aspect ratios, relative
sizes and durations are kept. An epoch is `EPOCH_CLIPS` ids, id i's bucket drawn from SEED.
With PATH (a `videos:` clip list, pixels per line) the shapes are the list's, not scaled, one
id per line.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from ..vocabulary.model_shape import VideoGeometry
from .clip_sources import clip_list_source, scale_shapes, video_source
from .length_source import numbered_lines

SYNTHETIC_PREFIX = "video-synthetic"
EPOCH_CLIPS = 100_000
KINDS = ("disc", "square", "ring", "stripes", "cross", "triangle", "bar", "checker")


def _palette(kind: int, channels: int) -> np.ndarray:
    return np.random.default_rng([0x5EED, kind, channels]).normal(0.0, 1.0, channels)


def _outline(kind: int, lx: np.ndarray, ly: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(signed distance to the outline in the shape's own units, negative inside; fill texture
    in [-1, 1]) at local coordinates (lx, ly)."""
    radius = np.sqrt(lx * lx + ly * ly)
    box = np.maximum(np.abs(lx), np.abs(ly))
    texture = np.zeros_like(lx)
    if kind == 0:  # disc
        d = radius - 1
    elif kind == 1:  # square
        d = box - 0.85
    elif kind == 2:  # ring
        d = np.abs(radius - 0.7) - 0.25
    elif kind == 3:  # stripes: a square of bars
        d, texture = box - 0.85, np.tanh(3 * np.sin(3 * np.pi * lx))
    elif kind == 4:  # cross
        d = np.minimum(np.maximum(np.abs(lx), np.abs(ly) / 0.3), np.maximum(np.abs(lx) / 0.3, np.abs(ly))) - 1
    elif kind == 5:  # triangle (equilateral, pointing up in its own frame)
        d = np.maximum(np.abs(lx) * 0.866 + ly * 0.5, -ly) - 0.5
    elif kind == 6:  # bar, 3:1
        d = np.maximum(np.abs(lx), 3 * np.abs(ly)) - 1
    else:  # checker: a disc of checks
        d, texture = radius - 1, np.tanh(3 * np.sin(2.5 * np.pi * lx) * np.sin(2.5 * np.pi * ly))
    return d, texture


def kind_caption(kind: int, dim: int) -> np.ndarray:
    """The caption embedding [2 + kind, dim] (float32) of a kind, the same for every clip of it."""
    return np.random.default_rng([0xCA9, kind, dim]).normal(0.0, 1.0, (2 + kind, dim)).astype(np.float32)


def synthetic_clip(seed: int, sample_id: int, channels: int, frames: int, height: int,
                   width: int) -> tuple[np.ndarray, int]:
    """(float32 latent [channels, frames, height, width] in latent pixels, label) of clip
    `sample_id`: a function of (seed, sample_id) and the size only."""
    rng = np.random.default_rng([seed, 1, sample_id])
    kind = int(rng.integers(len(KINDS)))
    side = min(height, width)  # coordinates: the short side spans [-1, 1], pixels are square
    y = ((np.arange(height) + 0.5 - height / 2) * 2 / side)[None, :, None]
    x = ((np.arange(width) + 0.5 - width / 2) * 2 / side)[None, None, :]
    t = np.arange(frames, dtype=np.float64)[:, None, None]

    direction, plaid_dir = rng.uniform(0, 2 * np.pi, 2)
    ramp = np.cos(direction) * x + np.sin(direction) * y
    freq, drift = rng.uniform(1.0, 3.0), rng.uniform(-0.3, 0.3)
    plaid = np.sin(freq * np.pi * (np.cos(plaid_dir) * x + np.sin(plaid_dir) * y) + drift * t)
    base, slope, weave = (rng.normal(0.0, s, channels)[:, None, None, None] for s in (0.5, 0.3, 0.25))
    out = base + slope * ramp[None] + weave * plaid[None]  # [C, F, H, W] by broadcasting
    out = np.broadcast_to(out, (channels, frames, height, width)).copy()

    palette = _palette(kind, channels)
    for _ in range(int(rng.integers(1, 4))):
        colour = (palette + rng.normal(0.0, 0.3, channels))[:, None, None, None]
        accent = rng.normal(0.0, 0.6, channels)[:, None, None, None]
        centre = rng.uniform(-0.5, 0.5, 2) * np.array([height / side, width / side])  # (y, x)
        swing, omega, phase = rng.uniform(0, 0.4, 2), rng.uniform(0.1, 0.5), rng.uniform(0, 2 * np.pi, 2)
        size, pulse, pulse_rate = rng.uniform(0.25, 0.55), rng.uniform(0, 0.3), rng.uniform(0.1, 0.6)
        angle, spin = rng.uniform(0, 2 * np.pi), rng.uniform(-0.3, 0.3)
        cy = centre[0] + swing[0] * np.sin(omega * t + phase[0])
        cx = centre[1] + swing[1] * np.cos(omega * t + phase[1])
        r = size * (1 + pulse * np.sin(pulse_rate * t))
        theta = angle + spin * t
        dx, dy = x - cx, y - cy
        lx = (np.cos(theta) * dx + np.sin(theta) * dy) / r
        ly = (np.cos(theta) * dy - np.sin(theta) * dx) / r
        d, texture = _outline(kind, lx, ly)
        alpha = np.clip(0.5 - d * r * side / 2, 0.0, 1.0)[None]  # one latent pixel of anti-aliasing
        out += alpha * (colour + accent * texture[None] - out)
    return out.astype(np.float32), kind


class SyntheticClips:
    """The clip dataset of `video-synthetic[:SEED[:PATH]]` (module docstring)."""

    def __init__(self, seed: int, geometry: VideoGeometry, max_len: int, clip_list: str | None = None,
                 caption_dim: int = 0) -> None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"{SYNTHETIC_PREFIX}: max_len must be a positive integer, got {max_len!r}")
        self.seed, self.geometry, self.clip_list, self.caption_dim = seed, geometry, clip_list, caption_dim
        if clip_list is None:
            self.name = f"{SYNTHETIC_PREFIX}:{seed}"
            source = video_source(geometry)
            self.buckets, self.factor = scale_shapes(source.shapes, max_len)
            self._bucket = np.random.default_rng([seed, 2]).choice(len(self.buckets), EPOCH_CLIPS, p=source.p)
            self.shapes = self.buckets[self._bucket]
            content = "buckets"
        else:
            self.name = f"{SYNTHETIC_PREFIX}:{seed}:{clip_list}"
            self.shapes = clip_list_source(clip_list, geometry).shapes  # over max_len: ClipStream's error
            self._lines = [n for n, _ in numbered_lines(f"videos:{clip_list}", "clip list")]
            content = hashlib.sha256(Path(clip_list).read_bytes()).hexdigest()[:16]
        self.fingerprint = f"{self.name}|{geometry}|{content}" + (f"|captions {caption_dim}" if caption_dim else "")

    def clip_name(self, sample_id: int) -> str:
        if self.clip_list is None:
            return f"{self.name} bucket {int(self._bucket[sample_id])}"
        return f"videos:{self.clip_list} line {self._lines[sample_id]}"

    def content(self, sample_id: int) -> tuple[torch.Tensor, int | torch.Tensor]:
        pf, ph, pw = self.geometry.patch
        f, h, w = self.shapes[sample_id].tolist()
        latent, label = synthetic_clip(self.seed, sample_id, self.geometry.latent_channels,
                                       f * pf, h * ph, w * pw)
        if self.caption_dim:
            return torch.from_numpy(latent), torch.from_numpy(kind_caption(label, self.caption_dim))
        return torch.from_numpy(latent), label

    def describe(self) -> str:
        tokens = self.shapes.prod(axis=1)
        condition = (f"captions of width {self.caption_dim} per kind" if self.caption_dim else
                     f"labels 0-{len(KINDS) - 1}")
        what = f"{condition} ({', '.join(KINDS)}), {self.geometry.latent_channels} latent channels"
        if self.clip_list is not None:
            return (f"{self.name}: {len(self.shapes)} procedural clips per epoch, shapes from the clip list "
                    f"({tokens.min()}..{tokens.max()} patches), {what}")
        f, h, w = self.buckets[np.argmax(self.buckets.prod(axis=1))].tolist()
        return (f"{self.name}: {EPOCH_CLIPS} procedural clips per epoch, DCP's {len(self.buckets)} any-size "
                f"buckets scaled x{self.factor:.4g} per side (largest {f}x{h}x{w} = {f * h * w} patches, "
                f"smallest {self.buckets.prod(axis=1).min()}), {what}")
