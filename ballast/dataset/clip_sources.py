"""Sources of video clips: draws of (frames, height, width) in a model's latent patches.

Clips are described in pixels (frames x height x width, as a dataset's metadata lists them) and
converted to latent patches by the model's `VideoGeometry` (VAE compression, then patchify),
so the same clip list prices differently under Open-Sora's and Wan's VAEs.

  video         DCP's any-size video: Open-Sora's resolution x frames buckets, Zipf weights
  videos:PATH   a clip list, one clip per line: `frames height width` in pixels
"""
from __future__ import annotations

import numpy as np

from ..vocabulary.model_shape import OPEN_SORA_VIDEO, VideoGeometry
from .length_source import LengthSource, numbered_lines

# DCP's any-size video workload (Open-Sora's 16:9 buckets). Buckets are ranked by tokens and
# weighted 1/rank (Zipf exponent 1, our choice): short low-resolution clips are the most
# common, long high-resolution ones a heavy tail (up to 489600 tokens at 1080p x 204 frames
# under Open-Sora 1.2's VAE).
VIDEO_RESOLUTIONS = {"144p": (144, 256), "240p": (240, 426), "360p": (360, 640),
                     "480p": (480, 854), "720p": (720, 1280), "1080p": (1080, 1920)}
VIDEO_FRAMES = (16, 34, 51, 68, 102, 136, 204)


def scale_shapes(shapes: np.ndarray, max_len: int) -> tuple[np.ndarray, float]:
    """(shapes scaled by one factor per side, the factor): the largest factor <= 1 under which
    every scaled shape, max(1, round(side * factor)), holds at most max_len tokens."""
    shapes = np.asarray(shapes, dtype=np.int64)

    def scaled(factor: float) -> np.ndarray:
        return np.maximum(1, np.round(shapes * factor)).astype(np.int64)

    if scaled(1.0).prod(axis=1).max() <= max_len:
        return scaled(1.0), 1.0
    lo, hi = 0.0, 1.0  # tokens never fall as the factor grows: bisect for the largest that fits
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if scaled(mid).prod(axis=1).max() <= max_len else (lo, mid)
    return scaled(lo), lo


class ClipSource(LengthSource):
    """Draws clips from a finite list, uniformly or with weights, as latent-patch shapes:
    `sample` returns an int64 array [n, 3] of (frames, height, width)."""

    def __init__(self, name: str, shapes: np.ndarray, weights: np.ndarray | None = None) -> None:
        self.name = name
        self.shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        self.p = None if weights is None else np.asarray(weights, float) / np.sum(weights)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.shapes[rng.choice(len(self.shapes), size=n, p=self.p)]


def video_source(geometry: VideoGeometry = OPEN_SORA_VIDEO) -> ClipSource:
    clips = [geometry.latent_patches(f, h, w) for h, w in VIDEO_RESOLUTIONS.values() for f in VIDEO_FRAMES]
    # By tokens, stably: the rank (and so the weight) of a bucket is its place in token order.
    order = sorted(range(len(clips)), key=lambda i: int(np.prod(clips[i])))
    shapes = np.array([clips[i] for i in order])
    return ClipSource("video", shapes, 1.0 / np.arange(1, len(shapes) + 1))


def clip_list_source(path: str, geometry: VideoGeometry = OPEN_SORA_VIDEO) -> ClipSource:
    """Clips from a text file, one per line: `frames height width` in pixels (integers >= 1).

    Blank lines and `#` comments are skipped (`numbered_lines`); anything else malformed is a
    ValueError naming the file and the line."""
    clips = []
    for number, text in numbered_lines(f"videos:{path}", "clip list"):
        fields = text.split()
        if len(fields) != 3 or not all(f.isascii() and f.isdigit() and int(f) >= 1 for f in fields):
            raise ValueError(f"videos:{path} line {number}: expected `frames height width` in pixels "
                             f"(three integers >= 1), got {text[:60]!r}")
        clips.append(geometry.latent_patches(*map(int, fields)))
    if not clips:
        raise ValueError(f"videos:{path}: no clips in file (expected one `frames height width` per line)")
    return ClipSource(f"videos:{path}", np.array(clips))
