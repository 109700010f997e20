"""The columns of the profile's time fit: one per coefficient of `fit.py`'s form, a row per
point (its blocks, spans, calls, tokens and exchanges, under given recomputation factors)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..cost import RECOMPUTED_EXCHANGES
from ..patterns import AttentionPattern, as_pattern
from ..samples import sample_grid
from .grid import Point


def _attention_columns(points: Sequence[Point], pattern: AttentionPattern, recompute: float) -> list[np.ndarray]:
    """The attention term's columns for a recomputation factor ra_l, one per fit term of the
    pattern (a_l's for causal and full attention; c_s's and c_t's for spatial-temporal): the
    term's blocks among the point's (plus ra_l times those checkpointed) x its feature / d."""
    d = np.array([p.degree for p in points], dtype=float)
    blocks = _attending_blocks(points, pattern, recompute)
    columns = []
    for i, term in enumerate(pattern.fit_terms):
        feature = np.array([float(sum(term.span.pairs(f, h * w) for f, h, w in p.grids())) for p in points])
        columns.append(blocks[:, i] * (feature * term.scale) / d)
    return columns


def _attending_blocks(points: Sequence[Point], pattern: AttentionPattern, recompute: float) -> np.ndarray:
    """[point, span kind]: the point's blocks of each of the pattern's spans, plus recompute
    times those checkpointed (a recomputed block attends again)."""
    blocks = np.array([pattern.block_counts(p.layers) for p in points], dtype=float)
    checkpointed = np.array([pattern.block_counts(p.checkpoint_layers) for p in points], dtype=float)
    return blocks + checkpointed * recompute


def _span_columns(points: Sequence[Point], pattern: AttentionPattern, recompute: float) -> list[np.ndarray]:
    """e_l's column: the spans every block attends (plus ra_l times those of the checkpointed
    blocks) / d (a CP point's times the CP attention factor: `fit_time` iterates); and f_l's,
    the samples alike, where a sample has several spans (else its one span is the sample)."""
    d = np.array([p.degree for p in points], dtype=float)
    blocks = _attending_blocks(points, pattern, recompute)
    counts = np.array([[float(sum(span.count(f, h * w) for f, h, w in p.grids())) for span in pattern.spans]
                       for p in points])
    spans = (blocks * counts).sum(axis=1) / d
    if pattern.spans_are_samples:
        return [spans]
    return [spans, blocks.sum(axis=1) * np.array([float(len(p.lengths)) for p in points]) / d]


def _distinct_lengths(p: Point, pattern: AttentionPattern) -> list[int]:
    """`AttentionPattern.distinct_lengths` of the point's micro-batch."""
    return pattern.distinct_lengths(*sample_grid(p.samples))


def separates_calls(points: Sequence[Point], pattern: AttentionPattern) -> bool:
    """Whether the points tell a cost per kernel call from one per span: two micro-batches of
    several calls that differ in spans per call (dozens of tiny clips of a few shapes, and as many
    of distinct shapes: `video_grid.tiny_clips`). Without them h_l is not fitted (0)."""
    ratios = set()
    for p in points:
        calls = sum(_distinct_lengths(p, pattern))
        if calls > len(pattern.spans):
            spans = sum(float(sum(span.count(f, h * w) for f, h, w in p.grids())) for span in pattern.spans)
            ratios.add(round(spans / calls, 6))
    return len(ratios) >= 2


def _call_column(points: Sequence[Point], pattern: AttentionPattern, recompute: float) -> np.ndarray:
    """h_l's column: the kernel calls of every block (plus ra_l times those of the checkpointed
    ones), not / d (every rank of a group makes every call)."""
    blocks = _attending_blocks(points, pattern, recompute)
    return (blocks * np.array([_distinct_lengths(p, pattern) for p in points])).sum(axis=1)


def exchanged_layers(p: Point) -> float:
    """Blocks' worth of a point's exchanges: every block's, and the forward half again for each
    recomputed one (`cost.RECOMPUTED_EXCHANGES`)."""
    return p.layers + RECOMPUTED_EXCHANGES * p.checkpoint_layers


def time_columns(points: Sequence[Point], attention: float, linear: float, degrees: list[int],
                  context_degrees: list[int], several_depths: bool, pattern: AttentionPattern | str,
                  span_context: float = 1.0, calls: bool = False) -> list[np.ndarray]:
    """Columns of a_l (c_s, c_t)[, a_l of the CP points], e_l[, f_l][, h_l], b_l, g_l[, b_0, g_0],
    lat_l(u), [CP lat_l(d)][, the remap layer's per token and per slot] for recomputation factors
    (ra_l, r_l)."""
    layers = np.array([p.layers for p in points], dtype=float)
    ckpt = np.array([p.checkpoint_layers for p in points], dtype=float)
    d = np.array([p.degree for p in points], dtype=float)
    u = np.array([p.ulysses for p in points], dtype=float)
    context = np.array([p.cp > 1 for p in points])
    s1 = np.array([float(p.tokens) for p in points])
    attention_columns = _attention_columns(points, as_pattern(pattern), attention)
    if context_degrees:  # CP runs whole-sequence patterns only: one attention term, in two columns
        (column,) = attention_columns
        attention_columns = [column * ~context, column * context]
    spans = [column * np.where(context, span_context, 1.0)
             for column in _span_columns(points, as_pattern(pattern), attention)]
    if calls:
        spans.append(_call_column(points, as_pattern(pattern), attention))
    columns = attention_columns + spans + [(layers + ckpt * linear) * s1 / d, layers]
    if several_depths:
        columns += [s1 / d, np.ones(len(points))]
    exchanged = np.array([exchanged_layers(p) for p in points])
    remapped = np.array([p.remap for p in points])
    return (columns + [exchanged * (u == degree) for degree in degrees]
            + [exchanged * ((d == degree) & context) for degree in context_degrees]
            + ([exchanged * remapped * s1 / d, exchanged * remapped] if remapped.any() else []))


def known_comm(p: Point, bandwidth: dict[int, float], exchange_bytes_layer: dict[int, float],
               context_bytes_layer: dict[tuple[int, int], float]) -> float:
    """What the cost model charges a point's exchanges per byte: its Ulysses all-to-alls (in
    sub-groups of u ranks) and its CP all-gather and reduce-scatter (at the degree's bandwidth)."""
    u, layers = p.ulysses, exchanged_layers(p)
    ulysses = 0.0 if u == 1 else layers * exchange_bytes_layer[u] * p.tokens / (p.degree * bandwidth[u])
    if p.cp == 1:
        return ulysses
    return ulysses + layers * context_bytes_layer[(p.degree, p.cp)] * p.tokens / bandwidth[p.degree]
