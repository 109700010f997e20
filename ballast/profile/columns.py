"""The columns of the profile's time fit: one per coefficient of `fit.py`'s form, a row per
point (its blocks, spans, calls, tokens and exchanges, under given recomputation factors)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..pricing.micro_batch import RECOMPUTED_EXCHANGES
from ..vocabulary.patterns import AttentionPattern, as_pattern
from ..vocabulary.samples import sample_grid
from .grid import Point


def _distinct_lengths(p: Point, pattern: AttentionPattern) -> list[int]:
    """`AttentionPattern.distinct_lengths` of the point's micro-batch."""
    return pattern.distinct_lengths(*sample_grid(p.samples))


def _span_counts(p: Point, pattern: AttentionPattern) -> list[float]:
    """The spans one block of each of the pattern's span kinds attends in the point's micro-batch."""
    return [float(sum(span.count(f, h * w) for f, h, w in p.grids())) for span in pattern.spans]


def separates_calls(points: Sequence[Point], pattern: AttentionPattern) -> bool:
    """Whether the points tell a cost per kernel call from one per span: two micro-batches of
    several calls that differ in spans per call (dozens of tiny clips of a few shapes, and as many
    of distinct shapes: `video_grid.tiny_clips`). Without them h_l is not fitted (0)."""
    ratios = set()
    for p in points:
        calls = sum(_distinct_lengths(p, pattern))
        if calls > len(pattern.spans):
            ratios.add(round(sum(_span_counts(p, pattern)) / calls, 6))
    return len(ratios) >= 2


def separates_rank_samples(points: Sequence[Point], pattern: AttentionPattern | str) -> bool:
    """Whether the fit prices a cost per sample on every rank of a group (CostModel's
    `rank_sample_seconds`): clip models only, whose conditioning every rank holding a clip's
    tokens repeats (text models have none of their own), and only where micro-batches of
    several samples ran at degree 1 and above, which tell it from the span term (divided by
    the degree). Without them w_l is not fitted (0)."""
    return as_pattern(pattern).clips and {p.degree > 1 for p in points if len(p.lengths) > 1} == {False, True}


def exchanged_layers(p: Point) -> float:
    """Blocks' worth of a point's exchanges: every block's, and the forward half again for each
    recomputed one (`micro_batch.RECOMPUTED_EXCHANGES`)."""
    return p.layers + RECOMPUTED_EXCHANGES * p.recompute_layers


class TimeColumns:
    """Columns of a_l (c_s, c_t)[, a_l of the CP points], e_l[, f_l][, h_l][, w_l], b_l, g_l, gr_l[, b_0,
    g_0], lat_l(u), [CP lat_l(d)][, the remap layer's per token and per slot], a row per point, under
    any recomputation factors (ra_l, r_l).

    What does not depend on the factors (every point's pairs, spans, samples and calls per block)
    is counted once here: the fit's search evaluates the columns thousands of times, and
    recounting the spans of every clip each time was nearly all of a fit's seconds."""

    def __init__(self, points: Sequence[Point], degrees: list[int], context_degrees: list[int],
                 several_depths: bool, pattern: AttentionPattern | str, calls: bool = False,
                 rank_samples: bool = False):
        pattern = as_pattern(pattern)
        layers = np.array([p.layers for p in points], dtype=float)
        recomputed = np.array([p.recompute_layers for p in points], dtype=float)
        d = np.array([p.degree for p in points], dtype=float)
        u = np.array([p.ulysses for p in points], dtype=float)
        self._context = np.array([p.cp > 1 for p in points])
        self._split_attention = bool(context_degrees)  # CP runs one attention term, in two columns
        self._samples_apart = not pattern.spans_are_samples
        self._calls = calls
        # [point, span kind]: a block of each kind, and one recomputed (which attends again).
        self._blocks = np.array([pattern.block_counts(p.layers) for p in points], dtype=float)
        self._recomputed_blocks = np.array([pattern.block_counts(p.recompute_layers) for p in points], dtype=float)
        # Per fit term: its pairs x scale / d (the term's blocks multiply it).
        self._pairs = [np.array([float(sum(term.span.pairs(f, h * w) for f, h, w in p.grids())) for p in points])
                       * term.scale / d for term in pattern.fit_terms]
        self._spans = np.array([_span_counts(p, pattern) for p in points]) / d[:, None]
        self._samples = np.array([float(len(p.lengths)) for p in points]) / d
        self._rank_samples = self._samples * d if rank_samples else None
        self._kernel_calls = (np.array([_distinct_lengths(p, pattern) for p in points], dtype=float)
                              if calls else None)
        # A rank's share of the tokens (the linear, b_0 and remap columns are per rank).
        self._layers, self._recomputed, self._rank_tokens = layers, recomputed, np.array([float(p.tokens) for p in points]) / d
        exchanged = np.array([exchanged_layers(p) for p in points])
        remapped = np.array([p.remap for p in points])
        self._fixed = ([layers, recomputed] + ([self._rank_tokens, np.ones(len(points))] if several_depths else [])
                       + [exchanged * (u == degree) for degree in degrees]
                       + [exchanged * ((d == degree) & self._context) for degree in context_degrees]
                       + ([exchanged * remapped * self._rank_tokens, exchanged * remapped] if remapped.any() else []))

    def at(self, attention: float, linear: float, span_context: float = 1.0) -> list[np.ndarray]:
        """The columns under recomputation factors ra_l (attention) and r_l (linear), a CP point's
        spans scaled by the CP attention factor span_context (`fit_time` iterates it)."""
        blocks = self._blocks + self._recomputed_blocks * attention
        attention_columns = [blocks[:, i] * pairs for i, pairs in enumerate(self._pairs)]
        if self._split_attention:
            (column,) = attention_columns
            attention_columns = [column * ~self._context, column * self._context]
        spans = [(blocks * self._spans).sum(axis=1)]
        if self._samples_apart:
            spans.append(blocks.sum(axis=1) * self._samples)
        spans = [column * np.where(self._context, span_context, 1.0) for column in spans]
        if self._calls:  # not / d: every rank of a group makes every call
            spans.append((blocks * self._kernel_calls).sum(axis=1))
        if self._rank_samples is not None:  # not / d either: every rank of a group does it whole
            spans.append(blocks.sum(axis=1) * self._rank_samples)
        linear_column = (self._layers + self._recomputed * linear) * self._rank_tokens
        return attention_columns + spans + [linear_column] + self._fixed


def known_comm(p: Point, bandwidth: dict[int, float], exchange_bytes_layer: dict[int, float],
               context_bytes_layer: dict[tuple[int, int], float]) -> float:
    """What the cost model charges a point's exchanges per byte: its Ulysses all-to-alls (in
    sub-groups of u ranks) and its CP all-gather and reduce-scatter (at the degree's bandwidth)."""
    u, layers = p.ulysses, exchanged_layers(p)
    ulysses = 0.0 if u == 1 else layers * exchange_bytes_layer[u] * p.tokens / (p.degree * bandwidth[u])
    if p.cp == 1:
        return ulysses
    return ulysses + layers * context_bytes_layer[(p.degree, p.cp)] * p.tokens / bandwidth[p.degree]
