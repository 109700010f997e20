"""CostCoefficients: the numbers a cost model prices with, validated; where they come from is
`cost_sources.py` (analytic, published) or `ballast profile` (profiled), their JSON `cost_files.py`.

docs/design.md (section 4) states what each coefficient prices; `cost.CostModel` prices with them.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..vocabulary.value_checks import check_types, from_fields, read_json
from ..vocabulary.patterns import AttentionPattern, attention_pattern

# Full recomputation keeps only a block's input: h of the 17 h values it saves (Korthikanti et al.).
KEPT_UNDER_RECOMPUTE = 1 / 17
# Recomputing a layer repeats its forward: one third of forward + backward.
RECOMPUTE_OVERHEAD = 1 / 3


class InfeasibleError(ValueError):
    """What memory cannot hold: a model's states on a device, or a sample (or micro-batch) at any
    degree and recompute level."""


@dataclass(frozen=True)
class CostCoefficients:
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
    """Activation bytes saved for backward per token with no recomputation."""
    states: float
    """Bytes per device a micro-batch finds held besides its activations: parameters, gradients,
    optimizer state, FSDP's gathered units, autocast copies (`device_memory.DeviceMemory.states`;
    `get_cost_model` prices it for the job's sharding mode and precision, whatever a file says)."""
    device_memory: float
    """Usable bytes per device."""
    layers: int
    """Transformer blocks; recompute levels are multiples of 1 / layers."""
    heads: int
    kv_heads: int
    world_size: int
    """Devices the coefficients were made for (states are sharded over them, as the mode says)."""
    recompute: float = RECOMPUTE_OVERHEAD
    """r: extra compute of recomputing every layer, as a fraction of forward + backward (of the
    linear term b s; also of the attention term a s^2 unless `recompute_attention` is set)."""
    kept: float = KEPT_UNDER_RECOMPUTE
    """k: fraction of a layer's activations kept when it is recomputed."""
    comm_latency: dict[int, float] = field(default_factory=dict)
    """Fixed seconds a micro-batch's all-to-alls cost at an SP degree whatever their size (the
    latency of its 4 x layers collectives and the sharding work around them); `ballast profile`
    measures it, 0 where absent. comm() adds it, so a gloo run's many small exchanges are priced."""
    loss_per_token: float = 0.0
    """Bytes of `act_per_token` that are the model's head's, not its blocks' (folded in, kept
    under recomputation), which a pipeline holds on its last stage only: the loss's [tokens,
    vocab] tensors (`cost_sources.with_device_memory`), or in a profile's own fit what its
    measurements at several depths left per token beside the blocks (`act_fixed`: the final
    norm's input and the log-probabilities saved; 0 from one depth)."""
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
    rank_sample_seconds: float = 0.0
    """w: seconds per sample of a micro-batch on each rank of its group, forward + backward of
    every block, not divided by the degree: what every rank does for every sample it holds a
    share of, whatever the share (a clip's conditioning: `models.condition_attention` projects
    each held clip's text on every rank that holds any of its tokens, and diffusers Wan's
    condition embedder embeds every clip's text and timestep on every rank). Priced per sample
    of a micro-batch, under recomputation as the attention term: in `time_from_sums` (planners
    pass their micro-batches' sample counts) and in each sample's `marginal_times` (the lower
    bound's prices and `sequence_times`'; a group of d pays it d times, so its area is exact);
    the heuristics that price from `work` leave it out, as they leave `recompute_fixed`.
    `ballast profile` fits it for clip models whose grid runs packed clips at degree 1 and above
    (`profile.columns.separates_rank_samples`); 0 elsewhere, analytic and published."""
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
    the recomputed work (r, r_attn): each recomputed block saves and restores its inputs and RNG
    state and runs its forward's launches, hooks and kernel setup again. A level c of the layers
    pays c g_r (`fixed_seconds`). Without it the fit bends r to price a small micro-batch's
    recomputation (where a fixed cost is a large share) and over-prices a large one's: on
    dit-tiny on CPU r came out 0.91 without g_r and 0.35 with it. `ballast profile` fits it; 0
    analytic and published. Heuristic estimates that price recomputation by a per-token slope
    (`bounds.py`, ballast's and Zeppelin's packing estimates) leave it out; time() prices it."""

    def __post_init__(self) -> None:
        check_types(self, "cost model", self.model)
        attention_pattern(self.attention)  # a ValueError naming the patterns, where the name enters
        if self.recompute_attention is None:
            object.__setattr__(self, "recompute_attention", self.recompute)
        for name in ("bandwidth", "comm_latency", "context_latency"):
            object.__setattr__(self, name, {int(d): float(v) for d, v in getattr(self, name).items()})
        for name in ("span_seconds", "sample_seconds"):
            value = getattr(self, name)
            if value < 0 or (value > 0 and not self.a > 0):
                raise ValueError(f"cost model {self.model!r}: {name} {value} must be >= 0, and 0 unless a > 0 "
                                 f"(it is priced in attention units)")
        for name in ("call_seconds", "rank_sample_seconds", "remap_per_token", "remap_latency", "recompute_fixed"):
            if getattr(self, name) < 0:
                raise ValueError(f"cost model {self.model!r}: {name} {getattr(self, name)} must be >= 0")
        if not self.context_attention > 0:
            raise ValueError(f"cost model {self.model!r}: context_attention must be > 0, got {self.context_attention}")
        if self.states >= self.device_memory:
            raise InfeasibleError(
                f"model {self.model!r}: its states ({self.states / 1e9:.3g} GB per device on {self.world_size} "
                f"devices) do not fit the device memory ({self.device_memory / 1e9:.3g} GB) at any degree: give "
                f"the job more devices, or each device more memory (--device-memory-gb), or shard more (--fsdp)")

    @property
    def pattern(self) -> AttentionPattern:
        return attention_pattern(self.attention)

    # --- JSON: one format for the three sources --------------------------------------------------
    def to_dict(self) -> dict:
        """The coefficients, as a cost model file holds them (nothing a subclass adds: a planner's
        rule and the cluster are not coefficients)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(CostCoefficients)}

    @classmethod
    def from_dict(cls, data: dict):
        return from_fields(cls, data, "cost-model")

    def save(self, path: str | Path, provenance: dict | None = None) -> None:
        """Write the model as JSON; `provenance` (where the file comes from) goes beside its fields."""
        record = self.to_dict() if provenance is None else {**self.to_dict(), "provenance": provenance}
        Path(path).write_text(json.dumps(record, indent=2))

    @classmethod
    def load(cls, path: str | Path):
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
