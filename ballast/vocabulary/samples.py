"""Samples of a global batch: text sequences and video clips, and the attention work of each.

A sample is an `int` (a text sequence of that many tokens) or a `(frames, height, width)` tuple
(a video clip in latent patches: frames x height x width tokens). Plain length lists are
batches of text samples, so everything that took lengths takes samples unchanged.

What a sample costs in attention depends on the model's attention pattern, not on its token
count alone: `attention_units` is the one formula every planner and the lower bound read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence, Union

import numpy as np

from .patterns import CAUSAL_LM, AttentionPattern, attention_pattern

Sample = Union[int, tuple[int, int, int]]

def check_sample(sample, index: int) -> Sample:
    """`sample` as a Sample (a 1-tuple is a text length); ValueError naming sample `index`."""
    if isinstance(sample, (tuple, list, np.ndarray)):
        dims = tuple(sample)
        if len(dims) == 1:
            return check_sample(dims[0], index)
        if len(dims) == 3 and all(_is_int(d) and d >= 1 for d in dims):
            return tuple(int(d) for d in dims)
        raise ValueError(f"sample {index} has shape {dims!r}: expected a token count or "
                         f"(frames, height, width) in latent patches, each >= 1")
    if not _is_int(sample):
        raise ValueError(f"sample {index} is {sample!r}: expected a token count or (frames, height, width)")
    if sample < 1:
        raise ValueError(f"sequence {index} has length {sample} < 1")
    return int(sample)


def check_samples(samples: Sequence) -> list[Sample]:
    return [check_sample(x, i) for i, x in enumerate(samples)]


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_shape(sample) -> bool:
    return isinstance(sample, (tuple, list, np.ndarray)) and np.ndim(sample) == 1


def tokens(sample: Sample) -> int:
    return math.prod(sample) if _is_shape(sample) else int(sample)


def is_shaped(samples: Sequence[Sample]) -> bool:
    """Whether any sample is a clip (the batch needs its shapes, not only its token counts)."""
    return any(map(_is_shape, samples))


def attention_units(samples: Sequence[Sample], pattern: AttentionPattern | str = CAUSAL_LM,
                    spatial_share: float = 0.5) -> np.ndarray:
    """Attention work of each sample under `pattern` (a value or its name), in units of one
    causal s x s attention (`patterns.AttentionPattern.units`: a text sequence of s tokens under
    a causal decoder costs s^2 units, exactly as the text-only cost model priced it).
    `spatial_share`: the share of a spatial-temporal model's blocks that attend within a frame."""
    if isinstance(pattern, str):
        pattern = attention_pattern(pattern)
    return pattern.units(*sample_grid(samples), spatial_share)


def sample_grid(samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Frames F and patches per frame S of every sample (float64); a text sequence is one frame of s."""
    whole = _uniform(samples)
    if whole is not None:  # every planner prices its batch's samples many times: one C loop, not one per sample
        if whole.ndim == 1:
            return np.ones(len(whole)), whole
        return whole[:, 0].copy(), whole[:, 1] * whole[:, 2]
    frames = np.array([x[0] if _is_shape(x) else 1 for x in samples], dtype=np.float64)
    per_frame = np.array([x[1] * x[2] if _is_shape(x) else x for x in samples], dtype=np.float64)
    return frames, per_frame


def tokens_array(samples: Sequence[Sample]) -> np.ndarray:
    """The samples' token counts as float64."""
    whole = _uniform(samples)
    if whole is not None:
        return whole if whole.ndim == 1 else whole.prod(axis=1)
    return np.fromiter(map(tokens, samples), dtype=np.float64, count=len(samples))


def _uniform(samples: Sequence[Sample]) -> np.ndarray | None:
    """The samples as one float64 array where they are all text lengths ([n]) or all clip shapes
    ([n, 3]); None for a mix."""
    try:
        whole = np.array(samples, dtype=np.float64)
    except (ValueError, TypeError):  # text and clips mixed: rows of different lengths
        return None
    return whole if whole.ndim == 1 or (whole.ndim == 2 and whole.shape[1] == 3) else None


def split_sample(sample: Sample, max_len: int) -> list[Sample]:
    """`sample` cut into pieces of at most `max_len` tokens: a text sequence into max_len chunks
    and the remainder; a clip into runs of whole frames (a frame is never cut, so a clip whose
    single frame is over max_len is a ValueError naming both)."""
    if isinstance(sample, int):
        full, rest = divmod(sample, max_len)
        return [max_len] * full + ([rest] if rest else [])
    frames, height, width = sample
    per_frame = height * width
    if per_frame > max_len:
        raise ValueError(f"a clip of {height} x {width} patches per frame ({per_frame} tokens) cannot be "
                         f"split under max_len={max_len}: raise max_len to at least {per_frame}")
    step = max_len // per_frame
    return [(min(step, frames - f), height, width) for f in range(0, frames, step)]


class UnitsPricer(Protocol):
    """What prices samples' attention units (`CostModel.units`)."""

    def units(self, samples: Sequence[Sample]) -> np.ndarray: ...


@dataclass(frozen=True)
class SampleBatch:
    """One step's samples as a planner sees them. Sequence ids index all three."""

    samples: list[Sample]
    """Token counts (text) or (frames, height, width) shapes (video clips)."""
    lengths: list[int]
    """Tokens of each sample: what memory, packing and all-to-alls follow."""
    units: np.ndarray
    """Attention units of each sample (`CostModel.units`): what attention time follows. A
    planner never squares a length itself."""

    @classmethod
    def of(cls, samples: Sequence, cost: UnitsPricer) -> SampleBatch:
        """The checked samples with their tokens and their attention units under `cost`."""
        samples = check_samples(samples)
        return cls(samples, [tokens(x) for x in samples], cost.units(samples))

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def shapes(self) -> list[Sample] | None:
        """What a `Plan` of this batch keeps (`Plan.shapes`): the samples if any is a clip, else
        None. Every plan a planner prices must carry it, or its clips are priced as text."""
        return self.samples if is_shaped(self.samples) else None

    def pick(self, ids: Sequence[int]) -> list[Sample]:
        """The samples of these ids (what `CostModel.time` and `lower_bound` take)."""
        return [self.samples[i] for i in ids]

    def units_of(self, ids: Sequence[int]) -> float:
        """Attention units of these ids together."""
        return float(self.units[list(ids)].sum()) if len(ids) else 0.0
