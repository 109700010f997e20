"""Fit docs/design.md's cost model to measured micro-batches, per layer, so any depth can be priced.

DCP's fast profiling runs a reduced-depth copy of the model and extrapolates: terms of the
blocks grow with the depth L, those of the embedding, output layer, loss and step loop do not.
With measurements at two or more depths the fit separates them; at one depth it folds the
fixed parts into the per-layer ones (exact at that depth). Per micro-batch of sequences s with
S1 = sum s, S2 = sum s^2, n = S1 tokens, SP degree d and k recomputed blocks:

    time = [(L + k ra_l) a_l S2 + (L + k r_l) b_l S1 + b_0 S1] / d + g_0 + L g_l + k gr_l
           + L bytes_l n / (d bw(d)) + L lat_l(d)                 (the last two at d > 1 only)
    activation bytes = x (act_0 + (L - k) act_l + k kept_l),      x = tokens of the largest shard

Bandwidth comes from the all-to-all calls timed inside the runtime (per degree, least squares
of seconds = calls lat_call + bytes / bw); the size-independent part of SP per layer, lat_l(d),
from the micro-batch times, since it also holds the sharding work around the calls. Every
other coefficient is a non-negative weighted least-squares fit, each point weighted by one over
its expected spread, seconds^-alpha with alpha measured from the profile's own repeats
(`noise.py`: 1 gives relative errors, 0.5 a host whose bursts add up over a point's duration),
around a search for the two recomputation factors. The
fit's columns are `columns.py`'s; `coefficients.Coefficients` holds the result and maps it onto
a CostModel at any depth.

Recomputing a block repeats its forward, whose share of forward + backward differs between
attention (ra_l) and the rest of the block (r_l): one factor for both mis-prices recomputation
of long sequences or of short ones (on `tiny` on CPU a single r left the 8192-token points
11% high), so ra_l and r_l are fitted apart (a coarse grid, then Nelder-Mead). gr_l is a
recomputed block's fixed cost per micro-batch (saving and restoring its inputs and RNG state,
its forward's launches again): without it the fit bent r_l to price small micro-batches'
recomputation, where a fixed cost is a large share, and over-priced large ones' (dit-tiny on
CPU: r_l 0.91 without gr_l, 0.35 with it, near the third of forward + backward that a block's
forward is).


Context parallelism. A point run u x c (`Point.cp` = c > 1; text only) exchanges q, k, v and
out in its Ulysses sub-groups of u ranks (priced at bw(u), with lat_l(u)) and gathers K, V over
its CP group forward, reduce-scattering dK, dV backward: CostModel charges L bytes_cp n / bw(d)
for them, bytes_cp = 2 G_l (c - 1) / c (`profiler.context_bytes_per_token_layer`, G_l the K, V
bytes a token brings each rank per block), subtracted as known like the all-to-all bytes, and
L lat_cp(d), a column per degree that ran CP (the collectives' latency and the sharding work
around them). Its attention runs per head-tail chunk against the gathered keys (a tail chunk
in two kernel calls merged, `models/offset_causal.py`), which may cost another price per unit
than the local kernel: the attention column is split into the points without CP (a_l) and
those with (a_cp), and `context_attention` = a_cp / a_l, one factor over every split and length
the grid ran (the cost model has one). The CP collectives are timed apart (their calls on the
rank's CP group): `fit_context_link` reports their bandwidth with bytes counted as the cost
model prices them, and stands in for bw(d) at a degree no Ulysses point ran (a model whose heads
that degree does not divide). Activation bytes are fitted on the points without CP (CP's
gathered K, V are priced from the shape).

Video models. The attention term follows the model's pattern (`patterns.AttentionPattern`:
its units and its `fit_terms`, one coefficient per term):
under `full` (Wan-style DiTs) a_l multiplies a clip's units 2 n^2 (S2 above becomes 2 sum n^2);
the rest of the model is the text one. Under `spatial-temporal` (STDiT) a block attends either
within every frame or along time at every patch position (`AttentionPattern.block_counts`
says how many of each), so a micro-batch of clips (F frames of S patches) at depth L, with n_s(L)
spatial and n_t(L) temporal blocks among its first L and n_s(k), n_t(k) among the k
recomputed ones, spends

    [(n_s(L) + ra_l n_s(k)) c_s sum F S^2 + (n_t(L) + ra_l n_t(k)) c_t sum S F^2] / d

in attention instead of the a_l term: c_s and c_t are the seconds per attended (query, key)
pair of one spatial and one temporal block, both fitted (two columns; the video grid makes
them non-collinear). At depth L they become CostModel's a and spatial_share exactly
(`patterns.fit_attention`): a = (n_s(L) c_s + n_t(L) c_t) / 2 and the measured spatial share
sigma = n_s(L) c_s / (n_s(L) c_s + n_t(L) c_t), the share of the attention time a clip with
F = S spends in spatial blocks (not the share of spatial blocks: a spatial pair and a temporal
one need not cost alike). A clip's conditioning (its text's key and value projections, a Wan's
condition embedder) runs on every rank that holds any of the clip's tokens, so where the grid
packs clips at degree 1 and above (`columns.separates_rank_samples`) a column (L + k ra_l) n
per point, n its samples, not divided by d, fits w_l (CostModel's `rank_sample_seconds`): on
the tiny Wan without it the fit had priced that work / d, degree-2 packed points came out
9-13% low and the degree-1 check plans 5-10% high.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..vocabulary.patterns import AttentionPattern, as_pattern
from .coefficients import Coefficients
from .columns import TimeColumns, known_comm, separates_calls, separates_rank_samples
from .grid import Measurement
from .noise import fit_weights, noise_exponent

MAX_RECOMPUTE = 2.0
"""Upper end of the search for ra_l and r_l: recomputing a layer repeats its forward, about a
third of forward + backward; twice the whole layer would mean the measurement is broken."""
CONTEXT_SPAN_ROUNDS = 4
"""Refits that scale the CP points' span column by the CP attention factor of the fit before (it
moves by the spans' small share of attention each round), before the recomputation factors are
searched again under the factor they settle at."""
RECOMPUTE_GRID = 41
"""Grid points per recomputation factor before the local refinement (steps of 0.05)."""


def _nnls(columns: list[np.ndarray], target: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares of weight * (X theta - target); (theta, residual norm).

    Columns are scaled to unit norm first: they span s^2 ~ 1e7 down to 1, and NNLS's active
    set tolerance is absolute."""
    # scipy.optimize is imported where a fit runs: at start it would cost every command ~1 s.
    from scipy.optimize import nnls

    x = np.column_stack(columns) * weight[:, None]
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    theta, residual = nnls(x / scale, target * weight)
    return theta / scale, float(residual)


def _link(calls: np.ndarray, sent: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(bytes/s, seconds per call) of seconds = calls lat_call + bytes / bw."""
    (per_call, per_byte), _ = _nnls([calls, sent], seconds, 1.0 / seconds)
    # Tiny payloads only: latency explains everything; bytes per second overall bounds it.
    return (1.0 / per_byte if per_byte > 0 else sent.sum() / seconds.sum()), float(per_call)


def fit_bandwidth(measurements: Sequence[Measurement]) -> tuple[dict[int, float], dict[int, float]]:
    """(bandwidth, latency per call) by degree from the Ulysses all-to-alls timed inside the
    runtime (those of a u x c point are its sub-groups', of degree u); a degree that only ran CP
    takes its CP collectives' (`fit_context_link`), which is what the cost model prices there."""
    bandwidth, latency = {}, {}
    context = fit_context_link(measurements)
    for d in sorted({p.degree for p in (m.point for m in measurements) if p.degree > 1}):
        rows = [m for m in measurements if m.point.ulysses == d and m.comm_calls > m.context_calls]
        if not rows:
            if d in context:
                bandwidth[d], latency[d] = context[d]
                continue
            raise ValueError(f"no all-to-all was timed at SP degree {d}: the runtime's collectives "
                             f"were not observed (does it still call torch.distributed.all_to_all_single?)")
        bandwidth[d], latency[d] = _link(np.array([float(m.comm_calls - m.context_calls) for m in rows]),
                                         np.array([m.comm_bytes - m.context_bytes for m in rows]),
                                         np.array([m.comm_seconds - m.context_seconds for m in rows]))
    return bandwidth, latency


def fit_context_link(measurements: Sequence[Measurement]) -> dict[int, tuple[float, float]]:
    """(bytes/s, seconds per call) of the CP collectives by degree, their bytes counted as the
    cost model prices them: a gather sends its rows to every CP rank, itself included, and the
    reduce-scatter every rank's rows, so (c - 1) / c of the send buffers leave the rank."""
    out = {}
    for d in sorted({m.point.degree for m in measurements if m.point.cp > 1}):
        rows = [m for m in measurements if m.point.degree == d and m.context_calls > 0]
        if rows:
            out[d] = _link(np.array([float(m.context_calls) for m in rows]),
                           np.array([m.context_bytes * (m.point.cp - 1) / m.point.cp for m in rows]),
                           np.array([m.context_seconds for m in rows]))
    return out


def fit_time(measurements: Sequence[Measurement], bandwidth: dict[int, float],
             exchange_bytes_layer: dict[int, float], attention: AttentionPattern | str = "causal",
             context_bytes_layer: dict[tuple[int, int], float] | None = None) -> dict:
    """a_l (or c_s and c_t), b_l, b_0, g_l, g_0, gr_l, ra_l, r_l, lat_l(u) and, where points ran a CP
    part, the CP attention factor and CP lat_l(d) from the micro-batch times (see the module
    doc). context_bytes_layer: the CP bytes per token and block the cost model charges a (degree,
    cp) split (`CostModel.gathered_per_token` x 2 (c - 1) / c)."""
    points = [m.point for m in measurements]
    if not any(p.recompute_layers for p in points):
        raise ValueError("the profile has no recomputed micro-batch: the recomputation overhead "
                         "cannot be fitted")
    pattern = as_pattern(attention)
    for i, span in enumerate(pattern.spans):
        if not any(pattern.block_counts(p.layers)[i] for p in points):
            raise ValueError(f"no profiled depth has a {span} block: profile at a depth of "
                             f"{pattern.depth_step} blocks or more")
    several_depths = len({p.layers for p in points}) > 1
    degrees = sorted({p.ulysses for p in points if p.ulysses > 1})
    context_degrees = sorted({p.degree for p in points if p.cp > 1})
    if context_degrees and len(pattern.fit_terms) != 1:
        raise ValueError(f"points with a CP part cannot be fitted for {pattern.name} attention: its CP terms are "
                         f"fitted against one attention term (its blocks have {len(pattern.fit_terms)})")
    calls = separates_calls(points, pattern)
    rank_samples = separates_rank_samples(points, pattern)
    seconds = np.array([m.seconds for m in measurements])
    comm = np.array([known_comm(p, bandwidth, exchange_bytes_layer, context_bytes_layer or {}) for p in points])
    target, weight = seconds - comm, fit_weights(measurements, noise_exponent(measurements))

    columns = TimeColumns(points, degrees, context_degrees, several_depths, pattern, calls, rank_samples).at

    from scipy.optimize import minimize  # where a fit runs, as in `_nnls`

    def recomputation(span_context: float) -> tuple[float, float]:
        """(ra_l, r_l) of the least residual: a coarse grid, then Nelder-Mead."""
        def residual(factors) -> float:
            return _nnls(columns(*np.clip(factors, 0.0, MAX_RECOMPUTE), span_context), target, weight)[1]

        grid = np.linspace(0.0, MAX_RECOMPUTE, RECOMPUTE_GRID)
        coarse = min(((ra, r) for ra in grid for r in grid), key=residual)
        refine = minimize(residual, np.array(coarse), method="Nelder-Mead",
                          bounds=[(0.0, MAX_RECOMPUTE)] * 2, options={"xatol": 1e-4, "fatol": 1e-12})
        return tuple(float(v) for v in (refine.x if refine.fun <= residual(coarse) else coarse))

    count = len(pattern.fit_terms)
    recompute_attention, linear = recomputation(1.0)
    theta, _ = _nnls(columns(recompute_attention, linear), target, weight)
    if context_degrees:
        # CostModel scales a CP micro-batch's spans by the CP attention factor as its pairs: refit
        # with the span column scaled by the factor the fit before found until it settles, then
        # search the recomputation factors once more under it.
        for _ in range(CONTEXT_SPAN_ROUNDS):
            factor = theta[count] / theta[0] if theta[0] > 0 else 1.0
            theta, _ = _nnls(columns(recompute_attention, linear, factor), target, weight)
        recompute_attention, linear = recomputation(factor)
        theta, _ = _nnls(columns(recompute_attention, linear, factor), target, weight)
    theta = [float(v) for v in theta]
    attention_terms = {term.name: c for term, c in zip(pattern.fit_terms, theta[:count])}
    if pattern.split_fit:  # a per layer when every span has one block of it: sum of c / units
        attention_terms["a_layer"] = sum(c / term.units_per_feature for term, c in zip(pattern.fit_terms, theta))
    if context_degrees:
        context_a, theta = theta[count], theta[:count] + theta[count + 1:]
        a_l = attention_terms["a_layer"]
        # A CP column fitted to 0 (CP points too few or too noisy to show their attention: a
        # one-round profile of 32-token sequences) says nothing about the CP kernel: price it
        # as the local one rather than as free (CostModel refuses a factor of 0).
        attention_terms["context_attention"] = context_a / a_l if a_l > 0 and context_a > 0 else 1.0
    rest = theta[count:]
    e_l, *rest = rest
    f_l = 0.0 if pattern.spans_are_samples else rest.pop(0)
    h_l = rest.pop(0) if calls else 0.0
    w_l = rest.pop(0) if rank_samples else 0.0
    b_l, g_l, gr_l, *rest = rest
    b_0, g_0 = (rest[0], rest[1]) if several_depths else (0.0, 0.0)
    rest = rest[2:] if several_depths else rest
    latency = dict(zip(degrees, rest[:len(degrees)]))
    context_latency = dict(zip(context_degrees, rest[len(degrees):len(degrees) + len(context_degrees)]))
    remap_token, remap_slot = rest[len(degrees) + len(context_degrees):] or (0.0, 0.0)
    return dict(**attention_terms, span_layer=e_l, sample_layer=f_l, call_layer=h_l, rank_sample_layer=w_l, b_layer=b_l, b_fixed=b_0, g_layer=g_l,
                g_fixed=g_0, recompute_fixed_layer=gr_l, recompute_layer=linear, recompute_attention_layer=recompute_attention,
                latency_layer=latency, context_latency_layer=context_latency, remap_token_layer=remap_token,
                remap_layer=remap_slot)


def fit_activations(measurements: Sequence[Measurement]) -> dict:
    """act_0, act_l, kept_l from the saved-for-backward bytes (see the module doc) of the points
    without a CP part (those add the gathered K and V, which the cost model prices from the
    shape: `prediction_errors` compares them) and not remapped (the remap layer's exchanges keep
    buffers of their own, which no plain micro-batch has)."""
    measurements = [m for m in measurements if m.point.cp == 1 and not m.point.remap]
    points = [m.point for m in measurements]
    x = np.array([float(m.shard_tokens) for m in measurements])
    layers = np.array([p.layers for p in points], dtype=float)
    recomputed = np.array([p.recompute_layers for p in points], dtype=float)
    saved = np.array([m.activation_bytes for m in measurements])
    several_depths = len(set(layers)) > 1
    columns = [x * (layers - recomputed), x * recomputed] + ([x] if several_depths else [])
    theta, _ = _nnls(columns, saved, 1.0 / saved)
    return dict(act_layer=float(theta[0]), kept_layer=float(theta[1]),
                act_fixed=float(theta[2]) if several_depths else 0.0)


def fit(measurements: Sequence[Measurement], exchange_bytes_layer: dict[int, float],
        attention: AttentionPattern | str = "causal",
        context_bytes_layer: dict[tuple[int, int], float] | None = None) -> Coefficients:
    """Every coefficient from the grid's measurements (any mix of depths) of a model of this
    attention pattern (`ModelShape.attention`).

    exchange_bytes_layer: all-to-all send bytes per token and block by SP degree, for degree 1
    (the tokens' own q, k, v and output: `Coefficients.bytes_per_token_layer`) and every measured
    degree (kv heads replicated where the degree does not divide them). context_bytes_layer: the
    CP bytes per token and block by (degree, cp) split the points ran (see `fit_time`)."""
    if not measurements:
        raise ValueError("nothing was measured")
    bandwidth, call_latency = fit_bandwidth(measurements)
    context = fit_context_link(measurements)
    return Coefficients(**fit_time(measurements, bandwidth, exchange_bytes_layer, attention, context_bytes_layer),
                        context_bandwidth={d: bw for d, (bw, _) in context.items()},
                        context_call_latency={d: lat for d, (_, lat) in context.items()},
                        bandwidth=bandwidth, call_latency=call_latency,
                        bytes_per_token_layer=exchange_bytes_layer[1],
                        **fit_activations(measurements), attention=as_pattern(attention).name)

