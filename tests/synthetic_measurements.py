"""Profile measurements that follow profile/fit.py's model exactly, for the fit's tests (text and
video): the fit must recover the coefficients they were made from."""
from __future__ import annotations

import math

import numpy as np

from ballast.model_shape import ModelShape
from ballast.patterns import SPATIAL_TEMPORAL
from ballast.profile.fit import Coefficients
from ballast.profile.grid import Measurement, Point
from ballast.profile.profiler import shape_bytes_per_token_layer


def attention_seconds(p: Point, true: Coefficients) -> float:
    """What the model's blocks spend attending, forward + backward, at degree 1, recomputation included."""
    ra = true.recompute_attention_layer
    if true.attention == "causal":
        return (p.layers + ra * p.checkpoint_layers) * true.a_layer * p.sum_sq
    if true.attention == "full":
        return (p.layers + ra * p.checkpoint_layers) * true.a_layer * 2.0 * p.sum_sq
    (spatial, temporal), (k_s, k_t) = SPATIAL_TEMPORAL.block_counts(p.layers), SPATIAL_TEMPORAL.block_counts(p.checkpoint_layers)
    return ((spatial + ra * k_s) * true.spatial_layer * p.spatial_pairs
            + (temporal + ra * k_t) * true.temporal_layer * p.temporal_pairs)


def synthetic(points: list[Point], true: Coefficients, noise: float = 0.0, seed: int = 0,
              shape: ModelShape | None = None) -> list[Measurement]:
    """Measurements of `points` made from `true`, times multiplied by (1 + noise N(0, 1)).
    `shape`'s kv heads are replicated where a degree does not divide them (None: every degree
    divides them); a recomputed layer repeats its forward exchange, half of its bytes."""
    rng = np.random.default_rng(seed)
    out = []
    for p in points:
        d, depth, k = p.degree, p.layers, p.checkpoint_layers
        shard = math.ceil(p.tokens / d)
        calls = 0 if d == 1 else 4 * depth + 2 * k
        replicated = 1.0 if shape is None else shape_bytes_per_token_layer(shape, 1, d) / shape_bytes_per_token_layer(shape, 1, 1)
        exchanged = true.bytes_per_token_layer * replicated
        comm_bytes = 0.0 if d == 1 else exchanged * shard * (depth + k / 2)
        comm = 0.0 if d == 1 else calls * true.call_latency[d] + comm_bytes / true.bandwidth[d]
        seconds = ((attention_seconds(p, true) + (depth + k * true.recompute_layer) * true.b_layer * p.tokens
                    + true.b_fixed * p.tokens) / d + true.g_fixed + depth * true.g_layer
                   + (0.0 if d == 1 else depth * exchanged * p.tokens / (d * true.bandwidth[d])
                      + depth * true.latency_layer[d]))
        act = shard * (true.act_fixed + (depth - k) * true.act_layer + k * true.kept_layer)
        jitter = 1.0 + noise * rng.standard_normal(2)
        out.append(Measurement(p, seconds * jitter[0], comm * jitter[1], calls, comm_bytes, act, shard))
    return out
