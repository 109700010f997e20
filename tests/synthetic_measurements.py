"""Profile measurements that follow profile/fit.py's model exactly, for the fit's tests (text and
video): the fit must recover the coefficients they were made from."""
from __future__ import annotations

import math

import numpy as np

from ballast.vocabulary.model_shape import ModelShape
from ballast.vocabulary.patterns import SPATIAL_TEMPORAL, attention_pattern
from ballast.profile.coefficients import Coefficients
from ballast.profile.grid import Measurement, Point
from ballast.profile.profiler import shape_bytes_per_token_layer


def attention_seconds(p: Point, true: Coefficients) -> float:
    """What the model's blocks spend attending, forward + backward, at degree 1, recomputation included."""
    ra = true.recompute_attention_layer
    if true.attention == "causal":
        return (p.layers + ra * p.recompute_layers) * true.a_layer * p.sum_sq
    if true.attention == "full":
        return (p.layers + ra * p.recompute_layers) * true.a_layer * 2.0 * p.sum_sq
    (spatial, temporal), (k_s, k_t) = SPATIAL_TEMPORAL.block_counts(p.layers), SPATIAL_TEMPORAL.block_counts(p.recompute_layers)
    return ((spatial + ra * k_s) * true.spatial_layer * p.spatial_pairs
            + (temporal + ra * k_t) * true.temporal_layer * p.temporal_pairs)


def span_seconds(p: Point, true: Coefficients) -> float:
    """What the model's blocks spend per attended span (e_l) and per sample (f_l), forward +
    backward at degree 1, recomputation included: every block's spans (a sequence, clip, frame
    or patch column) and samples."""
    pattern = attention_pattern(true.attention)
    ra, total = true.recompute_attention_layer, 0.0
    for n, k, span in zip(pattern.block_counts(p.layers), pattern.block_counts(p.recompute_layers), pattern.spans):
        total += (n + ra * k) * (sum(float(span.count(f, h * w)) for f, h, w in p.grids()) * true.span_layer
                                 + len(p.lengths) * true.sample_layer)
    return total


def call_seconds(p: Point, true: Coefficients) -> float:
    """What the model's blocks spend per attention kernel call (h_l): one per distinct span
    length of the micro-batch and block (the CPU path of `models.kernels`), recomputation
    included, on every rank of a group alike."""
    pattern = attention_pattern(true.attention)
    ra, total = true.recompute_attention_layer, 0.0
    for n, k, span in zip(pattern.block_counts(p.layers), pattern.block_counts(p.recompute_layers), pattern.spans):
        total += (n + ra * k) * len({int(span.length(f, h * w)) for f, h, w in p.grids()}) * true.call_layer
    return total


def rank_sample_seconds(p: Point, true: Coefficients) -> float:
    """What every rank of a group spends per sample of the micro-batch (w_l: a clip's
    conditioning), every block, recomputation included, not divided by the degree."""
    blocks = p.layers + true.recompute_attention_layer * p.recompute_layers
    return blocks * len(p.lengths) * true.rank_sample_layer


def synthetic(points: list[Point], true: Coefficients, noise: float = 0.0, seed: int = 0,
              shape: ModelShape | None = None) -> list[Measurement]:
    """Measurements of `points` made from `true`, times multiplied by (1 + noise N(0, 1)).
    `shape`'s kv heads are replicated where a degree does not divide them (None: every degree
    divides them); a recomputed layer repeats its forward exchange, half of its bytes, calls and
    fixed latency; every attended span costs e_l (`span_seconds`), every kernel call h_l
    (`call_seconds`), every sample w_l on every rank (`rank_sample_seconds`), every recomputed
    block gr_l. A point
    with a CP part (text only) exchanges in its Ulysses sub-groups of u ranks, and gathers K, V
    (reduce-scatters dK, dV) over its CP group: 2 calls per block, 1 more per recomputed one,
    their send buffers every token's K, V each way (the gather sends its rows to every CP rank),
    at `true`'s CP link; the micro-batch pays the CP bytes the cost model prices at bw(d), its
    attention times `context_attention`, and the CP latency."""
    from ballast.vocabulary.model_shape import get_model_shape
    from ballast.profile.context import context_bytes_per_token_layer, gathered_values_per_token_layer

    rng = np.random.default_rng(seed)
    kv_shape = shape or get_model_shape("tiny")
    value_bytes = true.bytes_per_token_layer / shape_bytes_per_token_layer(kv_shape, 1, 1)
    out = []
    for p in points:
        d, u, c, depth, k = p.degree, p.ulysses, p.cp, p.layers, p.recompute_layers
        shard = math.ceil(p.tokens / d)
        calls = 0 if u == 1 else 4 * depth + 2 * k
        replicated = 1.0 if shape is None else shape_bytes_per_token_layer(shape, 1, u) / shape_bytes_per_token_layer(shape, 1, 1)
        exchanged = true.bytes_per_token_layer * replicated
        comm_bytes = 0.0 if u == 1 else exchanged * shard * (depth + k / 2)
        comm = 0.0 if u == 1 else calls * true.call_latency[u] + comm_bytes / true.bandwidth[u]
        # CostModel scales a CP micro-batch's spans by the CP attention factor, as its pairs.
        attention = (attention_seconds(p, true) + span_seconds(p, true)) * (true.context_attention if c > 1 else 1.0)
        repeated = depth + k / 2  # blocks' worth of exchanges: the recomputed ones' forward half again
        seconds = ((attention + (depth + k * true.recompute_layer) * true.b_layer * p.tokens
                    + true.b_fixed * p.tokens) / d + true.g_fixed + depth * true.g_layer + k * true.recompute_fixed_layer
                   + call_seconds(p, true) + rank_sample_seconds(p, true)
                   + (0.0 if u == 1 else repeated * (exchanged * p.tokens / (d * true.bandwidth[u])
                                                     + true.latency_layer[u])))
        if p.remap:  # the remap layer's own cost: every group as long as the others, nothing moves
            seconds += repeated * (true.remap_layer + true.remap_token_layer * p.tokens / d)
        context_calls, context_bytes, context = 0, 0.0, 0.0
        if c > 1:
            priced = context_bytes_per_token_layer(kv_shape, value_bytes, d, c) * p.tokens
            seconds += repeated * (priced / true.bandwidth[d] + true.context_latency_layer[d])
            context_calls = 2 * depth + k
            context_bytes = gathered_values_per_token_layer(kv_shape, d, c) * value_bytes * p.tokens * (depth + k / 2) * 2
            context = (context_calls * true.context_call_latency[d]
                       + context_bytes * (c - 1) / c / true.context_bandwidth[d])
        act = shard * (true.act_fixed + (depth - k) * true.act_layer + k * true.kept_layer)
        jitter = 1.0 + noise * rng.standard_normal(2)
        out.append(Measurement(p, seconds * jitter[0], (comm + context) * jitter[1], calls + context_calls,
                               comm_bytes + context_bytes, act, shard, context_seconds=context * jitter[1],
                               context_calls=context_calls, context_bytes=context_bytes,
                               comm_values=(comm_bytes + context_bytes) / value_bytes,
                               context_values=context_bytes / value_bytes))
    return out
