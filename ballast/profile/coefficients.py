"""Coefficients: the profile's fit, per block and fixed, and the CostModel they make at any depth.

`fit.py` says how each is fitted. Mapped onto CostModel at depth L, all exactly: a = L a_l, b = L
b_l + b_0, g = g_0 + L g_l, comm_latency(d) = L lat_l(d), act_per_token = act_0 + L act_l, kept =
(act_0 + L kept_l) / act_per_token, recompute_attention = ra_l, recompute = r_l L b_l / b
(CostModel charges recomputation on b_0's part too, which is never recomputed) and
recompute_fixed = L gr_l.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..pricing.cost import CostModel
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import attention_pattern, fit_attention


@dataclass(frozen=True)
class Coefficients:
    """Per-layer and fixed parts of the cost model's coefficients (seconds, bytes, tokens)."""

    a_layer: float
    b_layer: float
    b_fixed: float
    g_layer: float
    g_fixed: float
    recompute_layer: float
    """r_l: extra time of recomputing one block's linear work (b_l), as a fraction of its
    forward + backward."""
    recompute_attention_layer: float
    """ra_l: the same for the block's attention (a_l)."""
    latency_layer: dict[int, float]
    """Size-independent seconds of SP per block and micro-batch, by degree."""
    bandwidth: dict[int, float]
    """All-to-all bytes/s per rank by degree (send-buffer bytes, as the runtime moves them)."""
    call_latency: dict[int, float]
    """Seconds per all-to-all call by degree (reported; lat_l holds it and the sharding work)."""
    bytes_per_token_layer: float
    """All-to-all send bytes per token and block, in the values the runs sent (bf16 on GPUs, fp32
    on CPUs); 0 when no degree above 1 was measured (nothing exchanged, nothing to price)."""
    act_fixed: float
    """Saved-for-backward bytes per token besides the blocks' (the head's, never recomputed);
    fitted only from several depths, else 0 and in the blocks' terms."""
    act_layer: float
    """Saved-for-backward bytes per token of one block, not recomputed."""
    kept_layer: float
    """Bytes per token one recomputed block keeps (its input)."""
    attention: str = "causal"
    """The attention pattern the coefficients price (`ModelShape.attention`)."""
    spatial_layer: float | None = None
    """c_s: seconds per attended pair (F S^2 per clip) of one spatial block (`spatial-temporal`
    only; a_layer then is (c_s + c_t) / 2, a per layer when half the blocks are of each kind
    is half of it)."""
    temporal_layer: float | None = None
    """c_t: seconds per attended pair (S F^2 per clip) of one temporal block."""
    span_layer: float = 0.0
    """e_l: seconds per attended span (a sequence, clip, frame or patch column: `Span.count`)
    of one block, forward + backward, besides its pairs (CostModel's `span_seconds` / L)."""
    sample_layer: float = 0.0
    """f_l: seconds per sample of one block besides its spans (CostModel's `sample_seconds` / L);
    fitted only where a sample has several spans (`AttentionPattern.spans_are_samples` false)."""
    remap_token_layer: float = 0.0
    """Seconds per token of a rank's balanced share and block, forward + backward, of running a
    slot through the remap layer besides its moves (CostModel's `remap_per_token` / L); fitted
    from the remap points (`grid.remap_points`), else 0."""
    remap_layer: float = 0.0
    """Seconds per remap slot and block besides its rows (CostModel's `remap_latency` / L)."""
    call_layer: float = 0.0
    """h_l: seconds per attention kernel call of one block (a distinct span length of the
    micro-batch: `AttentionPattern.calls_per_block`), forward + backward, besides its spans
    (CostModel's `call_seconds` / L); fitted only where the grid separates calls from spans
    (`separates_calls`), else 0."""
    rank_sample_layer: float = 0.0
    """w_l: seconds per sample of the micro-batch and block on every rank of its group, forward +
    backward, not divided by the degree (CostModel's `rank_sample_seconds` / L); fitted only for
    clip models whose grid tells it from the span term (`columns.separates_rank_samples`), else 0."""
    recompute_fixed_layer: float = 0.0
    """gr_l: seconds a micro-batch pays per recomputed block besides its recomputed work (the
    recomputation's own saving, restoring and launches: CostModel's `recompute_fixed` / L)."""
    context_attention: float = 1.0
    """CostModel's `context_attention`: the attention term of a micro-batch run with a CP part,
    relative to a_l (1.0 when no point ran one)."""
    context_latency_layer: dict[int, float] = dataclasses.field(default_factory=dict)
    """Size-independent seconds of the CP collectives per block and micro-batch, by degree."""
    context_call_latency: dict[int, float] = dataclasses.field(default_factory=dict)
    """Seconds per CP collective call by degree (reported; context_latency_layer holds it)."""
    context_bandwidth: dict[int, float] = dataclasses.field(default_factory=dict)
    """Bytes/s of the CP collectives by degree, counted as the cost model prices them (2 G n
    (c - 1) / c per block: the bytes that leave the rank); reported next to `bandwidth`, which
    prices them (and stands in for it at a degree no Ulysses point ran)."""

    def attention_at(self, depth: int) -> tuple[float, float | None]:
        """(a, spatial_share) of the CostModel at `depth` blocks; spatial_share None unless the
        pattern fits a coefficient per span (then the measured one: `patterns.fit_attention`)."""
        pattern = attention_pattern(self.attention)
        if not pattern.split_fit:
            return depth * self.a_layer, None
        return fit_attention(pattern, [blocks * getattr(self, term.name) for blocks, term
                                       in zip(pattern.block_counts(depth), pattern.fit_terms)])

    def cost_model(self, shape: ModelShape, world_size: int, device_memory: float, states: float,
                   fit: dict | None = None) -> CostModel:
        """The CostModel of `shape` (at its depth) with these coefficients."""
        depth = shape.layers
        if shape.pattern is not attention_pattern(self.attention):
            raise ValueError(f"coefficients of {self.attention} attention cannot price model {shape.name!r} "
                             f"({shape.attention} attention)")
        a, share = self.attention_at(depth)
        b = depth * self.b_layer + self.b_fixed
        act = self.act_fixed + depth * self.act_layer
        return CostModel(
            source="profiled", model=shape.name, a=a, b=b, g=self.g_fixed + depth * self.g_layer,
            bandwidth=dict(self.bandwidth), bytes_per_token=depth * self.bytes_per_token_layer,
            act_per_token=act, states=states, device_memory=device_memory, layers=depth,
            heads=shape.heads, kv_heads=shape.kv_heads, world_size=world_size, attention_window=shape.attention_window,
            max_positions=shape.max_positions,
            attention=shape.attention, spatial_share=shape.spatial_share if share is None else share,
            recompute=self.recompute_layer * depth * self.b_layer / b if b > 0 else 0.0,
            recompute_attention=self.recompute_attention_layer,
            kept=(self.act_fixed + depth * self.kept_layer) / act, loss_per_token=self.act_fixed,
            comm_latency={d: depth * v for d, v in self.latency_layer.items()},
            context_attention=self.context_attention, span_seconds=depth * self.span_layer if a > 0 else 0.0,
            sample_seconds=depth * self.sample_layer if a > 0 else 0.0, call_seconds=depth * self.call_layer,
            rank_sample_seconds=depth * self.rank_sample_layer,
            remap_per_token=depth * self.remap_token_layer, remap_latency=depth * self.remap_layer,
            recompute_fixed=depth * self.recompute_fixed_layer,
            context_latency={d: depth * v for d, v in self.context_latency_layer.items()}, fit=fit or {})

    def to_dict(self) -> dict:
        """The fields; a text model's as they always were (no attention pattern, no c_s, c_t, no
        CP terms unless a point ran CP, no h_l or remap terms unless fitted)."""
        out = dataclasses.asdict(self)
        if not attention_pattern(self.attention).clips:
            del out["attention"]
        for key in ("call_layer", "rank_sample_layer", "remap_token_layer", "remap_layer", "recompute_fixed_layer"):
            if not getattr(self, key):
                del out[key]
        if not self.context_latency_layer:
            for key in ("context_attention", "context_latency_layer", "context_call_latency", "context_bandwidth"):
                del out[key]
        return {key: value for key, value in out.items() if value is not None}
