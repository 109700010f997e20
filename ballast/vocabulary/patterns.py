"""Attention patterns: the one vocabulary for what attention attends over.

Two levels, both values resolved from a name once, where a name enters (`ModelShape`,
`CostModel`, a model's blocks):

    Span              what one attention call attends over inside every sample of a packed
                      stream: CAUSAL (each token to the tokens before it), FULL (every token of
                      its sample), SPATIAL (the tokens of its frame), TEMPORAL (its patch column:
                      the same row and column in every frame). All but CAUSAL are bidirectional.
    AttentionPattern  a model's (`ModelShape.attention`): the spans its blocks take in turn, what
                      a sample costs in attention (`units`), the sharding layout its groups run
                      at a degree above 1 (`layouts.py`), whether its models train on clips, and
                      the terms `ballast profile` fits. CAUSAL_LM (text decoders), FULL_DIT
                      (Wan-style DiTs), SPATIAL_TEMPORAL (STDiT).

No other module compares pattern names: it asks the value (tests/vocabulary/test_vocabulary.py checks).
A new pattern is a new value here (and, for a new model family, an entry in the models' table).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .layouts import CONTEXT, ULYSSES, VIDEO_2D, HeadLayout

SAMPLE, FRAME, COLUMN = "sample", "frame", "column"


@dataclass(frozen=True, eq=False)
class Span:
    """What one attention call attends over inside every sample. A span equals its name (as a
    string enum's member does), so a stream built from a name and one built from the value
    compare alike."""

    name: str
    causal: bool
    """Each token attends to the tokens before it (else to every token of its span)."""
    within: str
    """The span a token attends inside: its whole sample, its frame, or its patch column."""

    @property
    def whole_sample(self) -> bool:
        """Spans are the samples themselves (no reordering of a frame-major stream)."""
        return self.within == SAMPLE

    @property
    def frames(self) -> bool:
        """Spans are frames: contiguous runs of a frame-major stream."""
        return self.within == FRAME

    def pairs(self, frames: int, per_frame: int) -> int:
        """The (query, key) pairs of a sample of `frames` frames of `per_frame` patches this span
        counts, as the profile's fit takes them (exact integers): n^2 per sample (a causal s x s
        attention is s^2 units by definition), F S^2 per clip for frames, S F^2 for columns."""
        if self.within == SAMPLE:
            return (frames * per_frame) ** 2
        if self.within == FRAME:
            return frames * per_frame * per_frame
        return per_frame * frames * frames

    def length(self, frames, per_frame):
        """How many tokens each of these spans of a sample holds (floats or arrays): the sample's
        F S, a frame's S, a column's F."""
        if self.within == SAMPLE:
            return np.asarray(frames, dtype=np.float64) * per_frame
        return np.asarray(per_frame if self.within == FRAME else frames, dtype=np.float64)

    def count(self, frames, per_frame):
        """How many of these spans a sample of `frames` frames of `per_frame` patches has (floats
        or arrays): one per sample, one per frame, one per patch column."""
        if self.within == SAMPLE:
            return np.ones_like(np.asarray(frames, dtype=np.float64))
        return np.asarray(frames if self.within == FRAME else per_frame, dtype=np.float64)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Span):
            return self.name == other.name
        return self.name == other if isinstance(other, str) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return repr(self.name)


CAUSAL = Span("causal", causal=True, within=SAMPLE)
FULL = Span("full", causal=False, within=SAMPLE)
SPATIAL = Span("spatial", causal=False, within=FRAME)
TEMPORAL = Span("temporal", causal=False, within=COLUMN)
SPANS = {s.name: s for s in (CAUSAL, FULL, SPATIAL, TEMPORAL)}


@dataclass(frozen=True)
class FitTerm:
    """One attention coefficient `ballast profile` fits: seconds per `feature` of one block of
    `span`, where a point's feature is `scale` x its summed `Span.pairs`."""

    name: str
    """The coefficient's name in the profile's fit report (`profile.fit.Coefficients`)."""
    span: Span
    scale: float
    units_per_feature: float
    """Attention units (`AttentionPattern.units`) per feature at this span's full share: the
    CostModel's a is sum over terms of blocks x coefficient / units_per_feature."""


# (frames, patches per frame, spatial share) -> attention units of every sample, float64 arrays.
UnitsFormula = Callable[[np.ndarray, np.ndarray, float], np.ndarray]


@dataclass(frozen=True, eq=False)
class AttentionPattern:
    """A model's attention pattern (`ModelShape.attention` names it)."""

    name: str
    spans: tuple[Span, ...]
    """The spans the model's blocks take in turn, first block first."""
    units_formula: UnitsFormula
    layout: HeadLayout
    """How a group of degree > 1 lays a micro-batch over its ranks for attention."""
    clips: bool
    """Its models train on video clips (DiTs), not text."""
    loss_unit: str
    """What its models' per-token loss is, for plots."""
    fit_terms: tuple[FitTerm, ...]
    description: str

    def units(self, frames: np.ndarray, per_frame: np.ndarray, spatial_share: float) -> np.ndarray:
        """Attention work of samples of `frames` x `per_frame` tokens, in units of one causal
        s x s attention (a text sequence of s tokens under CAUSAL_LM costs s^2 units). A text
        sequence is one frame; a clip under a whole-sample pattern is its F H W tokens."""
        return self.units_formula(frames, per_frame, spatial_share)

    def spans_per_block(self, frames: np.ndarray, per_frame: np.ndarray, depth: int) -> np.ndarray:
        """Spans a block of a `depth`-block model attends in each sample, on average over its
        blocks (one kernel call's worth of setup each, `CostModel.span_seconds`): 1 for a whole-
        sample pattern, frames and patch columns in the proportion of a spatial-temporal model's
        blocks."""
        counts = self.block_counts(depth)
        return sum(n * span.count(frames, per_frame) for n, span in zip(counts, self.spans)) / sum(counts)

    def distinct_lengths(self, frames: np.ndarray, per_frame: np.ndarray) -> list[int]:
        """Distinct span lengths of each of the pattern's spans in a micro-batch of these samples:
        the attention calls a block of that span makes where the kernel runs all spans of one
        length together (the CPU path of `models.kernels`, `CostModel.call_seconds`)."""
        return [len(np.unique(span.length(frames, per_frame))) for span in self.spans]

    def calls_per_block(self, frames: np.ndarray, per_frame: np.ndarray, depth: int) -> float:
        """`distinct_lengths` on average over the blocks of a `depth`-block model."""
        counts = self.block_counts(depth)
        return sum(n * calls for n, calls in zip(counts, self.distinct_lengths(frames, per_frame))) / sum(counts)

    @property
    def spans_are_samples(self) -> bool:
        """Every block attends each sample as one span (text, full attention): a cost per span is
        a cost per sample, and the profile fits one term for both."""
        return all(span.whole_sample for span in self.spans)

    def block_spans(self, blocks: int) -> list[Span]:
        """The span of each of `blocks` blocks, in order."""
        return [self.spans[i % len(self.spans)] for i in range(blocks)]

    def block_counts(self, depth: int) -> tuple[int, ...]:
        """Blocks of each span among the first `depth` blocks (they take the spans in turn)."""
        k = len(self.spans)
        return tuple((depth - i + k - 1) // k for i in range(k))

    def split_why_not(self, degree: int, cp: int, heads: int) -> str | None:
        """Why a group of `degree` ranks split u = degree / cp Ulysses x `cp` context-parallel
        (`plans.Group.cp`) cannot run this pattern for a model of `heads` heads, or None: the CP
        part under CONTEXT's rule (every pattern runs it: whole samples are cut in chunks, a
        frame's or column's keys gathered), the Ulysses part under the pattern's layout rule."""
        if cp > 1 and (why := CONTEXT.why_not(cp, heads)) is not None:
            return why
        if (why := self.layout.why_not(degree // cp, heads)) is not None:
            return why + (f" (the Ulysses part of {degree} = {degree // cp} x CP {cp})" if cp > 1 else "")
        return None

    @property
    def split_fit(self) -> bool:
        """The profile fits one coefficient per span, so its grid must make their features
        independent (clips of several aspects per token count)."""
        return len(self.fit_terms) > 1

    @property
    def unit_label(self) -> str:
        """What one attention unit is, for reports: a token^2 of a causal sequence, else a unit."""
        return "token^2" if self.spans == (CAUSAL,) else "unit"

    @property
    def depth_step(self) -> int:
        """Profiled depths are multiples of this, so every span is measured at every depth."""
        return len(self.spans)

    def __repr__(self) -> str:
        return self.name


def _causal_units(frames: np.ndarray, per_frame: np.ndarray, share: float) -> np.ndarray:
    n = frames * per_frame  # exact: integers far below 2^53, so text's n * n is its s * s
    return n * n


def _full_units(frames: np.ndarray, per_frame: np.ndarray, share: float) -> np.ndarray:
    # A bidirectional attention over n tokens does twice a causal one's QK^T and AV FLOPs.
    n = frames * per_frame
    return 2.0 * n * n


def _spatial_temporal_units(frames: np.ndarray, per_frame: np.ndarray, share: float) -> np.ndarray:
    # A share of the blocks attends within each of the F frames (F S^2 pairs), the rest along
    # time at each of the S positions (S F^2 pairs), both bidirectional.
    return 2.0 * (share * frames * per_frame * per_frame + (1.0 - share) * per_frame * frames * frames)


CAUSAL_LM = AttentionPattern(
    "causal", (CAUSAL,), _causal_units, ULYSSES, clips=False, loss_unit="nats per token",
    fit_terms=(FitTerm("a_layer", CAUSAL, 1.0, 1.0),),
    description="each token attends to the tokens before it in its sample (text decoders)")
FULL_DIT = AttentionPattern(
    "full", (FULL,), _full_units, ULYSSES, clips=True, loss_unit="velocity MSE per token",
    fit_terms=(FitTerm("a_layer", FULL, 2.0, 1.0),),
    description="every token attends to every token of its sample (Wan-style video DiTs)")
SPATIAL_TEMPORAL = AttentionPattern(
    "spatial-temporal", (SPATIAL, TEMPORAL), _spatial_temporal_units, VIDEO_2D, clips=True,
    loss_unit="velocity MSE per token",
    fit_terms=(FitTerm("spatial_layer", SPATIAL, 1.0, 2.0), FitTerm("temporal_layer", TEMPORAL, 1.0, 2.0)),
    description="blocks alternate between attending within a frame and along time at one patch "
                "position (STDiT), both bidirectional")
PATTERNS = {p.name: p for p in (CAUSAL_LM, FULL_DIT, SPATIAL_TEMPORAL)}


def attention_pattern(name: str) -> AttentionPattern:
    """The pattern named `name`; ValueError naming the choices."""
    if name not in PATTERNS:
        raise ValueError(f"attention pattern {name!r}: expected one of {', '.join(PATTERNS)}")
    return PATTERNS[name]


def as_pattern(pattern: AttentionPattern | str) -> AttentionPattern:
    """A pattern value, or the one a name names."""
    return pattern if isinstance(pattern, AttentionPattern) else attention_pattern(pattern)


def span(name: str) -> Span:
    """The span named `name`; ValueError naming the choices."""
    if name not in SPANS:
        raise ValueError(f"attention pattern {name!r}: expected one of {', '.join(SPANS)}")
    return SPANS[name]


def fit_attention(pattern: AttentionPattern, per_term: Sequence[float]) -> tuple[float, float]:
    """CostModel's (a, spatial_share) from the seconds per feature of each fit term summed over
    the blocks of a depth (`per_term[i]`: blocks of term i's span x its coefficient).

    CostModel prices a sample at a q (`units`); the model spends sum_i per_term[i] feature_i.
    For the two to agree on every sample (the grid makes the features independent), a w_i u_i
    = per_term[i] with u_i the units per feature and w_i the span's share (sum 1):
    a = sum_i per_term[i] / u_i, and the share of the first span per_term[0] / u_0 / a. A
    negative part (an unconstrained fit) is clamped to 0 with a warning; with no attention
    time at all, a = 0 and the share is 0.5 (nothing to share)."""
    if any(v < 0 for v in per_term):
        warnings.warn(f"{pattern.name} fit: {', '.join(f'{t.span.name} {v:.3g}' for t, v in zip(pattern.fit_terms, per_term))}"
                      f" s per pair; the negative one is clamped to 0 (spatial_share clamped into [0, 1])", stacklevel=3)
        per_term = [max(v, 0.0) for v in per_term]
    parts = [v / t.units_per_feature for v, t in zip(per_term, pattern.fit_terms)]
    total = sum(parts)
    if total <= 0:
        return 0.0, 0.5
    return total, parts[0] / total
