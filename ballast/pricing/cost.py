"""CostModel: time and memory of a micro-batch at an SP degree and checkpoint level.

docs/design.md's model, in seconds and bytes:

    time(mb, d, c)   = [sum_s (a q_s (1 + c r_attn) + b s (1 + c r))] / d + comm(sum_s s, d) (1 + c/2) + g + c g_r
    comm(n, d)       = bytes_per_token n / (d bw(d)) + latency(d)  (0 at d = 1; latency(d) is
                                                                profiled, or the cluster's
                                                                per-call latency (analytic))
    memory(mb, d, c) = states + act_per_token (sum_s s) / d (c k + 1 - c)

q_s counts the sample's spans and itself too: q_s = units_s + (e spans_s + f) / a (`span_seconds`,
`sample_seconds`, 0 unless profiled), and a recomputed layer repeats its forward exchanges, half of them
(`RECOMPUTED_EXCHANGES`). A kernel that calls once per distinct span length adds h calls(mb) (1 + c
r_attn) to time() (`call_seconds`): the one term that is not a sum over samples, so planners'
sums and the lower bound leave it out. g_r (`recompute_fixed`) is what recomputing every layer
costs a micro-batch whatever its samples; g + c g_r is `fixed_seconds`.

A group of degree d = u x cp (Ulysses over u ranks times context parallelism over cp,
`layouts.Splits`; `plans.Group.cp`) adds, where cp > 1:

    attention        a q_s times `context_attention` (the CP kernel's work as measured)
    comm(n, d, cp)   = comm(n / cp, u) of the Ulysses sub-group (its own bandwidth and latency)
                       + 2 G n (cp - 1) / cp / bw(d) + context_latency(d): K and V of the other
                       CP ranks gathered forward and dK, dV reduce-scattered backward, G the
                       K + V bytes of a token for a rank's share of the heads (`gathered_per_token`)
    memory           + G n (1 - c): each layer that is not recomputed keeps the gathered K, V

Planners price a degree at its rule's least split (`split`, from `splits`) unless they weigh
the splits (ballast tries `fastest_candidates`); a plan's group records its split, and whoever
prices a plan passes the group's `cp`. A profiled model offers a CP part at a degree only if
its profile measured one there (`context_latency` has the degree) or no split without one is
allowed: unmeasured CP terms are analytic guesses, not this device's.

A remap domain's memory, slots and bound terms are `remapping.py`'s; the lower bound is
`bounds.py`'s (both price with this model).

A sample s of the micro-batch has |s| tokens and q_s attention units (`samples.attention_units`
under the model's attention pattern, `patterns.py`): |s|^2 for a text sequence under a causal decoder, what
docs/design.md writes a s^2; a video clip's follow its frames x height x width. Planners and the
lower bound read q from `units()`, never square lengths themselves. Every method that takes
`samples` takes token counts (text) or (frames, height, width) shapes alike.

Three sources of coefficients share this one class and its JSON format: `analytic` (from a
model shape and a cluster) and `published` (FlexSP's A100 profile), both `cost_sources.py`'s,
and `profiled` (written by `ballast profile`). Checkpoint levels are fractions of layers, so
they are multiples of 1 / layers.

The plain model (docs/design.md, section 4) has one recomputation factor r for both terms;
r_attn (`recompute_attention`) is the s^2 term's own, and equals r unless a profile measured it apart. It must be apart where
attention's forward is a different share of its forward + backward than a matmul's: on
`tiny` on CPU, recomputing every layer costs about +20% at 8192 tokens (attention dominates)
and +30-40% at 1024 (linear layers do), which no single r prices well at both.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..vocabulary.cluster import Cluster
from ..vocabulary.value_checks import check_types, from_fields, read_json
from ..vocabulary.layouts import ULYSSES_ONLY, HeadLayout, Splits
from ..vocabulary.patterns import AttentionPattern, attention_pattern
from ..vocabulary.samples import Sample, sample_grid, tokens as sample_tokens

# Full checkpointing keeps only a block's input: h of the 17 h values it saves (Korthikanti et al.).
KEPT_UNDER_CHECKPOINT = 1 / 17
# Recomputing a layer repeats its forward: one third of forward + backward.
RECOMPUTE_OVERHEAD = 1 / 3
# Recomputing a layer repeats its forward exchanges (the whole block is checkpointed, its
# all-to-alls or CP gathers inside): half of the layer's, each forward one moving as many bytes
# and calls as its backward twin (Ulysses: q, k, v and out of four all-to-alls; CP: the K, V
# gather of gather and reduce-scatter; the 2D video layout alike).
RECOMPUTED_EXCHANGES = 0.5
LEVEL_EPS = 1e-9  # relative slack of a level or fit computed in floats

class InfeasibleError(ValueError):
    """A sequence (or micro-batch) that no degree and checkpoint level can hold in memory."""


@dataclass(frozen=True)
class CostModel:
    source: str
    """`analytic`, `published` or `profiled`: where the coefficients come from."""
    model: str
    """Name of the model shape the coefficients describe."""
    a: float
    """Seconds per attention unit (`samples.attention_units`: s^2 of a causal text sequence of s
    tokens), forward + backward, on one device."""
    b: float
    """Seconds per token (linear layers, forward + backward, on one device)."""
    g: float
    """Fixed seconds per micro-batch."""
    bandwidth: dict[int, float]
    """Effective all-to-all bytes/s per SP degree (degree 1 needs none)."""
    bytes_per_token: float
    """Bytes one token contributes to a step's all-to-alls (q, k, v, out; forward and backward)."""
    act_per_token: float
    """Activation bytes saved for backward per token with no checkpointing."""
    states: float
    """Bytes of model and optimizer state per device (sharded over all devices)."""
    device_memory: float
    """Usable bytes per device."""
    layers: int
    """Transformer blocks; checkpoint levels are multiples of 1 / layers."""
    heads: int
    kv_heads: int
    world_size: int
    """Devices the coefficients were made for (states are sharded over them)."""
    recompute: float = RECOMPUTE_OVERHEAD
    """r: extra compute of recomputing every layer, as a fraction of forward + backward (of the
    linear term b s; also of the attention term a s^2 unless `recompute_attention` is set)."""
    kept: float = KEPT_UNDER_CHECKPOINT
    """k: fraction of a layer's activations kept when it is checkpointed."""
    comm_latency: dict[int, float] = field(default_factory=dict)
    """Fixed seconds a micro-batch's all-to-alls cost at an SP degree whatever their size (the
    latency of its 4 x layers collectives and the sharding work around them); `ballast profile`
    measures it, 0 where absent. comm() adds it, so a gloo run's many small exchanges are priced."""
    fit: dict = field(default_factory=dict)
    """Free-form report of how the coefficients were obtained (residuals of a profile fit)."""
    recompute_attention: float | None = None
    """r_attn: r of the attention term a s^2 alone; None (the default) means r, docs/design.md's
    single factor. `ballast profile` fits it apart from r."""
    attention_window: int | None = None
    """The model's `ModelShape.attention_window`: no sequence may be longer (`check_fits`)."""
    max_positions: int | None = None
    """The model's `ModelShape.max_positions`: no sequence may be longer (`check_fits`)."""
    attention: str = "causal"
    """The model's attention pattern by name (`ModelShape.attention`); `pattern` is the value:
    how `units` prices a sample, and the layout whose degree rule `degrees` follows."""
    spatial_share: float = 0.5
    """The model's `ModelShape.spatial_share` (spatial-temporal attention only)."""
    context_attention: float = 1.0
    """Attention work under context parallelism relative to the same queries' work in one
    process (the head-tail chunks' kernel calls and masks, as `ballast profile` measures them;
    1.0 analytic: flash-attn skips the masked tiles and the chunks balance causal work)."""
    context_latency: dict[int, float] = field(default_factory=dict)
    """Fixed seconds a micro-batch's CP collectives cost in a group of degree d whatever their
    size (2 x layers calls), like `comm_latency`; 0 where absent."""
    network: Cluster | None = field(default=None, compare=False, repr=False)
    """The cluster whose nodes and NICs price the exchanges that cross nodes (`nics.py`), set
    where the model meets its cluster (`cost_sources.py`); not part of
    the coefficients, so not in the JSON. None: every exchange at its degree's bandwidth alone."""
    span_seconds: float = 0.0
    """e: seconds per attended span, forward + backward of every block on one device, besides
    the span's (query, key) pairs: a kernel's cost per span (a CPU kernel's setup per span and
    head, a GPU varlen kernel's last, partly masked tile). A span is what one block attends over
    inside a sample (`patterns.AttentionPattern.spans_per_block`: a text sequence, a clip under
    full attention, a frame or a patch column of a spatial-temporal block). `units` adds it as
    e / a units per span, so every planner and the bound price it. `ballast profile` fits it;
    0 analytic and published."""
    sample_seconds: float = 0.0
    """Seconds per sample (a sequence or clip), forward + backward of every block on one device,
    besides its spans and tokens: per-sample work around attention (a clip's kernel calls of its
    own shape, its conditioning). Apart from `span_seconds` only where a sample has several spans
    (spatial-temporal clips; elsewhere a sample is one span and `span_seconds` holds it). Priced
    as sample_seconds / a units per sample (`units`); `ballast profile` fits it, 0 analytic and
    published."""
    call_seconds: float = 0.0
    """h: seconds per attention kernel call, forward + backward of every block on one device,
    where the kernel calls once per distinct span length of a micro-batch (the CPU path of
    `models.kernels`: all spans of one length go as one SDPA, so a micro-batch of many clips of
    few shapes makes few calls and one of as many shapes as clips makes one per clip). Priced on
    a micro-batch's samples by `time` (h times `AttentionPattern.calls_per_block`, under
    recomputation as the attention term, not divided by the degree: every rank of a group makes
    every call, on its share of the heads); not a sum over samples, so planners, which price
    micro-batches from sums (`time_from_sums`), and the lower bound leave it out (the bound stays
    a lower bound). `ballast profile` fits it where the grid separates calls from spans; 0
    elsewhere, and for one-call varlen kernels (a block's one call is in g)."""
    remap_per_token: float = 0.0
    """Seconds per token of a rank's balanced share of a remap slot, forward + backward of every
    block, that Zeppelin's remapping layer costs besides the rows it moves: its two exchanges
    around every attention copy every row (the rows that stay too), and they hold the domain's
    ranks in step block by block. `remap_overhead`; `ballast profile` fits it from its remap
    points (`profile.grid.remap_points`), 0 analytic and published."""
    remap_latency: float = 0.0
    """Seconds per remap slot besides its rows: the exchanges' calls, every block's four (two
    forward, two backward). `remap_overhead`; profiled like `remap_per_token`."""
    recompute_fixed: float = 0.0
    """g_r: seconds a micro-batch pays for recomputing every layer whatever its samples, on top of
    the recomputed work (r, r_attn): each checkpointed block saves and restores its inputs and RNG
    state and runs its forward's launches, hooks and kernel setup again. A level c of the layers
    pays c g_r (`fixed_seconds`). Without it the fit bends r to price a small micro-batch's
    checkpointing (where a fixed cost is a large share) and over-prices a large one's: on
    dit-tiny on CPU r came out 0.91 without g_r and 0.35 with it. `ballast profile` fits it; 0
    analytic and published. Heuristic estimates that price recomputation by a per-token slope
    (`bounds.py`, ballast's and Zeppelin's packing estimates) leave it out; time() prices it."""
    splits: Splits = field(default=ULYSSES_ONLY, compare=False)
    """Which (Ulysses x CP) splits of a degree the planner that holds this model may run
    (`under`); not part of the coefficients, so not in the JSON."""

    def __post_init__(self) -> None:
        check_types(self, "cost model", self.model)
        attention_pattern(self.attention)  # a ValueError naming the patterns, where the name enters
        if self.recompute_attention is None:
            object.__setattr__(self, "recompute_attention", self.recompute)
        object.__setattr__(self, "bandwidth", {int(d): float(v) for d, v in self.bandwidth.items()})
        object.__setattr__(self, "comm_latency", {int(d): float(v) for d, v in self.comm_latency.items()})
        object.__setattr__(self, "context_latency", {int(d): float(v) for d, v in self.context_latency.items()})
        for name in ("span_seconds", "sample_seconds"):
            value = getattr(self, name)
            if value < 0 or (value > 0 and not self.a > 0):
                raise ValueError(f"cost model {self.model!r}: {name} {value} must be >= 0, and 0 unless a > 0 "
                                 f"(it is priced in attention units)")
        for name in ("call_seconds", "remap_per_token", "remap_latency", "recompute_fixed"):
            if getattr(self, name) < 0:
                raise ValueError(f"cost model {self.model!r}: {name} {getattr(self, name)} must be >= 0")
        if not self.context_attention > 0:
            raise ValueError(f"cost model {self.model!r}: context_attention must be > 0, got {self.context_attention}")
        # Split of every degree under `splits`, and the splits it allows, cached: planners ask per micro-batch.
        parts = {}
        d = 1
        while d <= self.world_size:
            allowed = [c for c in self.splits.context_parts(d, self.heads, self.pattern.layout)
                       if d == 1 or d in self.bandwidth and (c == d or d // c in self.bandwidth)]
            if allowed and allowed[0] == 1 and self.source == "profiled" and d not in self.context_latency:
                # A profile that ran no point with a CP part at d measured none of CP's terms there
                # (its latency, attention factor, gather): their analytic stand-ins would price CP
                # below the Ulysses split it measured, and a planner that weighs splits would choose
                # CP for it (ballast's video steps: 15-20% under-predicted). Offered only where
                # nothing measured can run.
                allowed = [1]
            if allowed:
                parts[d] = allowed
            d *= 2
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "_candidates", {d: self._undominated(d) for d in parts})
        if self.states >= self.device_memory:
            raise InfeasibleError(
                f"model {self.model!r}: its states ({self.states / 1e9:.3g} GB per device, sharded over "
                f"{self.world_size} devices) do not fit the device memory ({self.device_memory / 1e9:.3g} GB) "
                f"at any degree: give the job more devices, or each device more memory (--device-memory-gb)")

    # --- degrees and memory ------------------------------------------------------------------
    @property
    def pattern(self) -> AttentionPattern:
        return attention_pattern(self.attention)

    @property
    def degrees(self) -> list[int]:
        """SP degrees usable for this model on this cluster: powers of two up to the world size
        with a split `splits` allows (the Ulysses part's layout rule, `layouts.Layout.allows`,
        and CONTEXT's) and a bandwidth (a profile knows the degrees it measured)."""
        return list(self._parts)

    def under(self, splits: Splits) -> CostModel:
        """This model for a planner that runs the splits `splits` allows."""
        return self if splits == self.splits else dataclasses.replace(self, splits=splits)

    def split(self, degree: int) -> int:
        """cp of the split planners price a group of `degree` at under `splits`: the least cp
        it allows (heads first: Ulysses holds no gathered K and V, and its exchange stays inside
        the smaller block). A planner that weighs the splits (ballast) gives a group another
        allowed split where that runs its micro-batches faster (`Plan` records each group's)."""
        return self._parts[degree][0]

    def context_parts(self, degree: int) -> list[int]:
        """Every cp `splits` allows at `degree` (empty where none)."""
        return self._parts.get(degree, [])

    def fastest_candidates(self, degree: int) -> list[int]:
        """The cp of `context_parts` that no other allowed split beats on every term (exchange per
        token, memory per token with no and with full checkpointing, fixed latency, attention
        factor): only these can run some micro-batch fastest, so searches need try no other."""
        return self._candidates.get(degree, [])

    def _undominated(self, degree: int) -> list[int]:
        def terms(cp: int) -> tuple[float, ...]:
            return (self.comm_per_token(degree, cp), self.per_token_memory(degree, 0.0, cp),
                    self.per_token_memory(degree, 1.0, cp), self.fixed_latency(degree, cp),
                    self.context_attention if cp > 1 else 1.0)
        parts = {cp: terms(cp) for cp in self._parts[degree]}
        return [cp for cp, mine in parts.items()
                if not any(other != mine and all(o <= m for o, m in zip(other, mine)) for other in parts.values())]

    def gathered_per_token(self, degree: int, cp: int) -> float:
        """Bytes of K and V one token of a micro-batch brings to each rank of a group of degree
        `degree` split `cp` ways for context parallelism, over all layers and one pass: its
        Ulysses sub-group of u = degree / cp ranks shards the kv heads (replicated to lcm(kv,
        u) where u does not divide them), each rank gathering its share. 0 at cp 1."""
        if cp == 1:
            return 0.0
        u = degree // cp
        # bytes_per_token counts q, k, v and out both ways: K and V one way are kv / (heads + kv) of half.
        kv = self.bytes_per_token / 2 * self.kv_heads / (self.heads + self.kv_heads)
        return kv * HeadLayout.exchanged_kv_heads(self.kv_heads, u) / self.kv_heads / u

    # --- samples -----------------------------------------------------------------------------
    def units(self, samples: Sequence[Sample]) -> np.ndarray:
        """Attention units of each sample under the model's pattern (float64), the cost of its
        spans (`span_seconds`) and its own (`sample_seconds`) included as units of a."""
        frames, per_frame = sample_grid(samples)
        units = self.pattern.units(frames, per_frame, self.spatial_share)
        if self.span_seconds == 0 and self.sample_seconds == 0:  # recorded results stay bit-identical
            return units
        spans = self.pattern.spans_per_block(frames, per_frame, self.layers)
        return units + (self.span_seconds * spans + self.sample_seconds) / self.a

    def _kept_fraction(self, checkpoint: float) -> float:
        return checkpoint * self.kept + (1.0 - checkpoint)

    def _cp(self, degree: int, cp: int | None) -> int:
        # A degree no split allows prices as Ulysses alone (memory questions about it still have answers).
        return (self._parts[degree][0] if degree in self._parts else 1) if cp is None else cp

    def per_token_memory(self, degree: int, checkpoint: float, cp: int | None = None) -> float:
        """Bytes per device one token of a micro-batch takes at this degree, level and split."""
        gathered = self.gathered_per_token(degree, self._cp(degree, cp)) * (1.0 - checkpoint)
        return self.act_per_token / degree * self._kept_fraction(checkpoint) + gathered

    def memory(self, samples: Sequence[Sample], degree: int, checkpoint: float, cp: int | None = None) -> float:
        tokens = float(sum(map(sample_tokens, samples))) if len(samples) else 0.0
        if self._cp(degree, cp) == 1:  # today's expression, so recorded results stay bit-identical
            return self.states + self.act_per_token * tokens / degree * self._kept_fraction(checkpoint)
        return self.states + tokens * self.per_token_memory(degree, checkpoint, cp)

    def max_tokens(self, degree: int, checkpoint: float, cp: int | None = None) -> int:
        """The most tokens one micro-batch can hold at this degree, checkpoint level and split."""
        free = self.device_memory - self.states
        # A relative margin: above ~1e7 tokens one ulp exceeds an absolute 1e-9 (exact fits lost).
        if self._cp(degree, cp) == 1:
            return int(free * degree / (self.act_per_token * self._kept_fraction(checkpoint)) * (1 + 1e-12))
        return int(free / self.per_token_memory(degree, checkpoint, cp) * (1 + 1e-12))

    def min_checkpoint(self, tokens: int, degree: int, cp: int | None = None) -> float | None:
        """The smallest checkpoint level (a multiple of 1/layers) at which `tokens` fit, or None."""
        free = self.device_memory - self.states
        if self._cp(degree, cp) == 1:  # today's expression, so recorded results stay bit-identical
            need = self.act_per_token * tokens / degree
            if need <= free * (1 + LEVEL_EPS):
                return 0.0
            c = (1.0 - free / need) / (1.0 - self.kept)
        else:
            need = self.per_token_memory(degree, 0.0, cp) * tokens
            if need <= free * (1 + LEVEL_EPS):
                return 0.0
            # need(c) = need(0) - c x saved: a recomputed layer keeps k of its activations and no gathered K, V.
            c = (need - free) / (need - self.per_token_memory(degree, 1.0, cp) * tokens)
        level = math.ceil(c * self.layers - LEVEL_EPS) / self.layers
        return level if level <= 1.0 else None

    def min_degree(self, tokens: int, at_least: int = 1) -> int | None:
        """The smallest degree, from `at_least` up, at which `tokens` fit in one micro-batch at
        full checkpointing."""
        return next((d for d in self.degrees if d >= at_least and self.max_tokens(d, 1.0) >= tokens), None)

    def check_fits(self, samples: Sequence[Sample]) -> None:
        """Raise InfeasibleError naming the first sequence no plan can hold."""
        limit = self.max_tokens(self.degrees[-1], 1.0)
        window = self.attention_window
        for i, s in enumerate(map(sample_tokens, samples)):
            if window is not None and s > window:
                raise InfeasibleError(
                    f"sequence {i} has {s} tokens, more than model {self.model!r}'s sliding-window attention "
                    f"covers ({window}): ballast attends over whole sequences; lower --max-len to {window}")
            if self.max_positions is not None and s > self.max_positions:
                raise InfeasibleError(
                    f"sequence {i} has {s} tokens, more than model {self.model!r}'s positions cover "
                    f"(max_position_embeddings {self.max_positions}): its last tokens would train at positions "
                    f"the model was not made for; lower --max-len to {self.max_positions}, or raise "
                    f"max_position_embeddings in its config.json (with a RoPE scaling where it needs one)")
            if s > limit:
                raise InfeasibleError(
                    f"sequence {i} has {s} tokens, more than any plan can hold: at most {limit} "
                    f"tokens fit one micro-batch (SP degree {self.degrees[-1]}, full checkpointing, "
                    f"{self.device_memory / 1e9:.3g} GB per device); lower --max-len, or give each "
                    f"device more memory (--device-memory-gb){self._degree_lever()}")

    def _degree_lever(self) -> str:
        """What would allow an SP degree above the largest usable one, for check_fits' message:
        more ranks only where the heads (and a profile's measured degrees) allow the next one."""
        top, layout = self.degrees[-1], self.pattern.layout
        if 2 * top > self.world_size:
            return " or the job more ranks"
        if 2 * top not in self.bandwidth:
            return f"; the cost profile measured no SP degree above {top} (profile more ranks)"
        if not self.splits.context:
            return (f"; SP degree {2 * top} needs context parallelism ({layout.why_not(2 * top, self.heads)}): "
                    f"use a planner that runs it (ballast, megatron-dynamic-cp, zeppelin, wlb-llm) or "
                    f"static with --cp")
        return f"; no split of SP degree {2 * top} is allowed under {self.splits.name}"

    # --- time ----------------------------------------------------------------------------------
    def exchange_bytes(self, degree: int) -> float:
        """Bytes one token contributes to a micro-batch's all-to-alls at SP degree `degree`:
        `bytes_per_token` with the kv heads replicated as the runtime does where the degree does
        not divide them (`layouts.HeadLayout.exchange_bytes`)."""
        return self.pattern.layout.exchange_bytes(self.bytes_per_token, self.heads, self.kv_heads, degree)

    def comm_per_token(self, degree: int, cp: int | None = None) -> float:
        """Seconds of exchanges per token of a micro-batch at this degree and split (0 at degree 1)."""
        if degree == 1:
            return 0.0
        cp = self._cp(degree, cp)
        u = degree // cp
        ulysses = 0.0 if u == 1 else self.exchange_bytes(u) / (degree * self.bandwidth[u])
        if cp == 1:
            return ulysses
        return ulysses + 2.0 * self.gathered_per_token(degree, cp) * (cp - 1) / cp / self.bandwidth[degree]

    def fixed_latency(self, degree: int, cp: int | None = None) -> float:
        """Seconds a micro-batch's exchanges cost at this degree and split whatever their size:
        the Ulysses part's all-to-alls (`comm_latency` of u) and the CP collectives'
        (`context_latency` of the whole degree)."""
        cp = self._cp(degree, cp)
        u = degree // cp
        ulysses = self.comm_latency.get(u, 0.0) if u > 1 else 0.0
        return ulysses if cp == 1 else ulysses + self.context_latency.get(degree, 0.0)

    def comm(self, tokens: float, degree: int, cp: int | None = None, checkpoint: float = 0.0) -> float:
        """Seconds of a micro-batch's exchanges: their bytes and fixed latency, the forward ones
        again for the recomputed layers (`recomputed_exchanges`)."""
        if degree == 1 or tokens == 0:
            return 0.0
        cp = self._cp(degree, cp)
        if cp == 1:  # today's expression, so recorded results stay bit-identical
            comm = (self.exchange_bytes(degree) * tokens / (degree * self.bandwidth[degree])
                    + self.comm_latency.get(degree, 0.0))
        else:
            comm = self.comm_per_token(degree, cp) * tokens + self.fixed_latency(degree, cp)
        return comm * recomputed_exchanges(checkpoint)

    def time_from_sums(self, sum_units: float, sum_s: float, degree: int, checkpoint: float,
                       cp: int | None = None) -> float:
        """time() from the sums over the micro-batch of attention units and tokens (planners
        keep these)."""
        attention = self.a * sum_units * (1.0 + checkpoint * self.recompute_attention)
        if self._cp(degree, cp) > 1:
            attention *= self.context_attention
        compute = (attention + self.b * sum_s * (1.0 + checkpoint * self.recompute)) / degree
        return compute + self.comm(sum_s, degree, cp, checkpoint) + self.fixed_seconds(checkpoint)

    def fixed_seconds(self, checkpoint: float) -> float:
        """Seconds of a micro-batch at this checkpoint level whatever its samples: g, and the
        recomputed layers' fixed part (`recompute_fixed`)."""
        return self.g + checkpoint * self.recompute_fixed

    def attention_time(self, tokens, units):
        """a q elementwise, computed as (a (q / s)) s: for text q / s is s exactly, so this
        rounds as the text-only model's a s s did and recorded text results stay bit-identical."""
        return self.a * (units / tokens) * tokens

    def work(self, tokens, units, checkpoint=0.0):
        """a q (1 + c r_attn) + b s (1 + c r) elementwise (floats or arrays of tokens s, their
        attention units q and levels): a sample's compute at degree 1, without g and
        all-to-alls."""
        return (self.attention_time(tokens, units) * (1.0 + checkpoint * self.recompute_attention)
                + self.b * tokens * (1.0 + checkpoint * self.recompute))

    def time(self, samples: Sequence[Sample], degree: int, checkpoint: float, cp: int | None = None) -> float:
        s = _tokens_array(samples)
        summed = self.time_from_sums(float(self.units(samples).sum()), float(s.sum()), degree, checkpoint, cp)
        return summed + self.call_time(samples, checkpoint)

    def call_time(self, samples: Sequence[Sample], checkpoint: float) -> float:
        """The micro-batch's attention calls (`call_seconds`), the part of `time` that no sum over
        its samples gives."""
        if self.call_seconds == 0 or not len(samples):
            return 0.0
        calls = self.pattern.calls_per_block(*sample_grid(samples), self.layers)
        return self.call_seconds * calls * (1.0 + checkpoint * self.recompute_attention)

    def split_time(self, samples: Sequence[Sample], degree: int, checkpoint: float,
                   cp: int | None = None) -> tuple[float, float]:
        """(compute incl. the fixed overhead, communication) of one micro-batch, in seconds."""
        comm = self.comm(float(_tokens_array(samples).sum()), degree, cp, checkpoint)
        return self.time(samples, degree, checkpoint, cp) - comm, comm

    def remap_overhead(self, tokens_per_rank: float, checkpoint: float) -> float:
        """What running a slot of `tokens_per_rank` balanced tokens per rank through the remap
        layer costs besides its moves (`remap_per_token`, `remap_latency`); a recomputed block
        repeats its forward exchanges, as the all-to-alls' (`recomputed_exchanges`)."""
        return ((self.remap_latency + self.remap_per_token * tokens_per_rank)
                * recomputed_exchanges(checkpoint))

    # --- bounds --------------------------------------------------------------------------------
    def sequence_times(self, samples: Sequence[Sample], every_split: bool = False) -> np.ndarray:
        """Array [degree index, sequence] of time(s, d, c_min) without g at the degree's `split`
        (`every_split`: the least over every split `splits` allows, for bounds, found among
        `fastest_candidates`); inf where it does not fit."""
        s, q = _tokens_array(samples), self.units(samples)
        free = self.device_memory - self.states
        out = np.full((len(self.degrees), len(s)), np.inf)
        for i, d in enumerate(self.degrees):
            parts = self.fastest_candidates(d) if every_split else [self.split(d)]
            out[i] = np.min([self._alone(s, q, d, cp, free) for cp in parts], axis=0)
        return out

    def _alone(self, s: np.ndarray, q: np.ndarray, d: int, cp: int, free: float) -> np.ndarray:
        """sequence_times' row of degree d at split cp."""
        if cp == 1:  # today's expressions, so recorded results stay bit-identical
            need = self.act_per_token * s / d
            c = np.clip((1.0 - free / np.maximum(need, LEVEL_EPS)) / (1.0 - self.kept), 0.0, None)
        else:
            need = self.per_token_memory(d, 0.0, cp) * s
            saved = need - self.per_token_memory(d, 1.0, cp) * s
            c = np.clip((need - free) / np.maximum(saved, LEVEL_EPS), 0.0, None)
        c = np.ceil(c * self.layers - LEVEL_EPS) / self.layers
        if cp == 1:
            work = self.work(s, q, c) / d
            if d > 1:
                work = work + self.exchange_bytes(d) * s / (d * self.bandwidth[d]) * recomputed_exchanges(c)
        else:
            work = self.marginal_times(s, q, d, c, cp)
        return np.where(c <= 1.0, work, np.inf)

    def marginal_times(self, tokens, units, degree: int, checkpoint, cp: int | None = None):
        """What each sample adds to its micro-batch's time at this degree, level and split,
        elementwise (arrays of tokens, their attention units and levels): time() is these summed
        plus `fixed_seconds` and the collectives' fixed latency (`comm`'s at the level)."""
        cp = self._cp(degree, cp)
        attention = self.attention_time(tokens, units) * (1.0 + checkpoint * self.recompute_attention)
        if cp > 1:
            attention = attention * self.context_attention
        linear = self.b * tokens * (1.0 + checkpoint * self.recompute)
        exchanges = self.comm_per_token(degree, cp) * tokens * recomputed_exchanges(checkpoint)
        return (attention + linear) / degree + exchanges

    # --- construction and JSON -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(dataclasses.replace(self, network=None)).items()
                if k not in ("splits", "network")}

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        return from_fields(cls, data, "cost-model")

    def save(self, path: str | Path, provenance: dict | None = None) -> None:
        """Write the model as JSON; `provenance` (where the file comes from) goes beside its fields."""
        record = self.to_dict() if provenance is None else {**self.to_dict(), "provenance": provenance}
        Path(path).write_text(json.dumps(record, indent=2))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"cost model file {path} does not exist")
        data = read_json(path, "cost model file")
        if isinstance(data, dict):
            data.pop("provenance", None)  # the file's origin, not a field of the model
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError) as e:
            raise ValueError(f"cost model file {path}: {e}") from e


def recomputed_exchanges(checkpoint):
    """How many times a micro-batch's exchanges run at this checkpoint level (floats or arrays),
    relative to none recomputed: recomputed layers repeat their forward ones."""
    return 1.0 + checkpoint * RECOMPUTED_EXCHANGES


def _tokens_array(samples: Sequence[Sample]) -> np.ndarray:
    return np.fromiter(map(sample_tokens, samples), dtype=np.float64, count=len(samples))
