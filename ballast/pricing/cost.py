"""CostModel: time and memory of a micro-batch at an SP degree, split and recompute level.

docs/design.md (section 4) is the home of the formulas; in short, for a micro-batch of samples s
(|s| tokens, q_s attention units) in a group of degree d = u x cp at level c:

    time(mb, d, c)   = [sum_s (a q_s f (1 + c r_attn) + b s (1 + c r))] / d + comm(sum_s s, d) (1 + c/2)
                       + g + c g_r + h calls(mb) (1 + c r_attn)        (f = context_attention where cp > 1)
    comm(n, d)       = bytes(u) n / (d bw(u)) + 2 G n (cp - 1) / cp / bw(d) + fixed latency
    memory(mb, d, c) = states + act_per_token n / d (c k + 1 - c) + G n (1 - c)

G is `gathered_per_token` (0 without CP); `states`, and the loss's logits inside act_per_token
and k, are priced per sharding mode and precision by `device_memory.py` (`device`). The coefficients and their JSON are `coefficients.py`'s;
which degrees and splits exist is the model's `catalogue` (`vocabulary/split_catalogue.py`) under
its planner's rule (`splits`); a sample alone at every degree (planners' and the bound's rows) is
`sequence_times.py`'s; whether samples fit at all is `fits.py`'s; remap slots are
`remapping.py`'s; the data-parallel collectives and the optimizer step `whole_step.py`'s. Every method that takes `samples` takes token counts (text) or (frames, height,
width) shapes alike, and `cp=None` means the catalogue's split of the degree.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..vocabulary.cluster import Cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.layouts import ULYSSES_ONLY, HeadLayout, Splits
from ..vocabulary.samples import Sample, sample_grid, tokens as sample_tokens, tokens_array
from ..vocabulary.split_catalogue import SplitCatalogue
from .coefficients import CostCoefficients, InfeasibleError
from .device_memory import DeviceMemory
from .micro_batch import MicroBatchPrices, fixed_seconds, rank_sample_seconds, recomputed_exchanges
from .stages import StagePrices
from .whole_step import NOTHING, DataParallelPrices

@dataclass(frozen=True)
class CostModel(CostCoefficients):
    network: Cluster | None = field(default=None, compare=False, repr=False)
    """The cluster whose nodes and NICs price the exchanges that cross nodes (`nics.py`), set
    where the model meets its cluster (`cost_sources.py`); not part of the coefficients, so not in
    the JSON. None: every exchange at its degree's bandwidth alone."""
    splits: Splits = field(default=ULYSSES_ONLY, compare=False)
    """Which (Ulysses x CP) splits of a degree the planner that holds this model may run (`under`,
    `catalogue`); not part of the coefficients, so not in the JSON."""

    device: DeviceMemory | None = field(default=None, compare=False, repr=False)
    """What `states`, and the loss's part of `act_per_token` and `kept`, were priced from: the
    model's parameters, the sharding mode and the precision (`cost_sources.with_device_memory`);
    not a coefficient, so not in the JSON. None: the coefficients as given."""
    mesh: JobMesh | None = field(default=None, compare=False, repr=False)
    """The job mesh the coefficients are a rank's of (`get_cost_model`): under TP a TP shard's
    work, memory and heads over the mesh's pool (`tensor_parallel.sharded`); plans made with this
    model record its TP and PP degrees. Not a coefficient, so not in the JSON. None: one pool of
    the whole world."""
    data_parallel: DataParallelPrices = field(default=NOTHING, compare=False, repr=False)
    """What the data-parallel sharding costs besides the passes' work: the gradient sync and the
    part of it that backward does not hide, FSDP2's gathers around each pass, the optimizer step
    (`whole_step.data_parallel_prices`, set where the model meets its cluster and sharding mode,
    `cost_sources.get_cost_model`; under PP each stage's own, `StagePrices.data_parallel`). Not a
    coefficient, so not in the JSON. NOTHING: none of it priced."""
    stages: StagePrices | None = field(default=None, compare=False, repr=False)
    """Under PP (the mesh's p > 1) its stages' states and boundary (`pipeline.stage_prices`): a
    plan of p stages is timed as the 1F1B step of its micro-batches and its memory checked per
    stage. Not a coefficient, so not in the JSON. None: no pipeline."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.device is not None and self.device.after_backward >= self.device_memory:
            raise InfeasibleError(
                f"model {self.model!r}: after backward a device holds {self.device.after_backward / 1e9:.3g} GB "
                f"({self.device.describe()}), more than its memory ({self.device_memory / 1e9:.3g} GB): give the "
                f"job more devices or memory (--device-memory-gb), or shard more (--zero1, --fsdp)")
        # A profile offers a CP part only where it measured one (`SplitCatalogue.measured_context`).
        measured = frozenset(self.context_latency) if self.source == "profiled" else None
        catalogue = SplitCatalogue(self.world_size, self.heads, self.pattern.layout, frozenset(self.bandwidth),
                                   measured, self.splits)
        object.__setattr__(self, "catalogue", catalogue)
        object.__setattr__(self, "_prices", {})
        # Planners ask per micro-batch, so the undominated splits are found once.
        object.__setattr__(self, "_candidates", {d: self._undominated(d) for d in catalogue.degrees})

    # --- the splits ----------------------------------------------------------------------------
    @property
    def degrees(self) -> list[int]:
        """SP degrees with a split the catalogue offers (`SplitCatalogue.degrees`)."""
        return self.catalogue.degrees

    def under(self, splits: Splits) -> CostModel:
        """This model for a planner that runs the splits `splits` allows."""
        return self if splits == self.splits else dataclasses.replace(self, splits=splits)

    def fastest_candidates(self, degree: int) -> list[int]:
        """The cp of `catalogue.context_parts` that no other offered split beats on every term
        (exchange per token, memory per token with no and with full recomputation, fixed
        latency, attention factor): only these can run some micro-batch fastest."""
        return self._candidates.get(degree, [])

    def _undominated(self, degree: int) -> list[int]:
        def terms(cp: int) -> tuple[float, ...]:
            return (self.comm_per_token(degree, cp), self.per_token_memory(degree, 0.0, cp),
                    self.per_token_memory(degree, 1.0, cp), self.fixed_latency(degree, cp), self.attention_factor(cp))
        parts = {cp: terms(cp) for cp in self.catalogue.context_parts(degree)}
        return [cp for cp, mine in parts.items()
                if not any(other != mine and all(o <= m for o, m in zip(other, mine)) for other in parts.values())]

    def _cp(self, degree: int, cp: int | None) -> int:
        return self.catalogue.default_cp(degree) if cp is None else cp

    def micro_batch_prices(self, degree: int, cp: int | None = None) -> MicroBatchPrices:
        """A micro-batch's prices at this degree and split, made once (`micro_batch.py`)."""
        key = (degree, cp)
        prices = self._prices.get(key)
        if prices is None:
            split = self._cp(degree, cp)
            u = degree // split
            ulysses = degree > 1 and u > 1
            context = degree > 1 and split > 1
            gathered = self.gathered_per_token(degree, split)
            prices = MicroBatchPrices(
                degree, split, self.a, self.b, self.g, self.recompute, self.recompute_attention,
                self.recompute_fixed, self.attention_factor(split),
                self.exchange_bytes(u) if ulysses else 0.0, degree * self.bandwidth[u] if ulysses else 1.0,
                2.0 * gathered * (split - 1) / split / self.bandwidth[degree] if context else 0.0,
                self.fixed_latency(degree, split), self.act_per_token, self.kept, gathered,
                self.device_memory - self.states, self.level_blocks, self.rank_sample_seconds)
            self._prices[key] = prices
        return prices

    # --- memory --------------------------------------------------------------------------------
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

    def activation_bytes(self, tokens, degree: int, recompute: float, cp: int | None = None):
        """Bytes per device that `tokens` (a float or an array) of a micro-batch keep for backward
        at this degree, level and split: their activations, and the gathered K, V of the layers
        that are not recomputed."""
        return self.micro_batch_prices(degree, cp).activation_bytes(tokens, recompute)

    def per_token_memory(self, degree: int, recompute: float, cp: int | None = None) -> float:
        """Bytes per device one token of a micro-batch takes at this degree, level and split."""
        return self.activation_bytes(1.0, degree, recompute, cp)

    def kept_share(self, degree: int, cp: int | None = None) -> float:
        """The share of a token's bytes (`activation_bytes` at level 0) that full recomputation
        keeps: k of the activations, none of the gathered K, V."""
        return self.micro_batch_prices(degree, cp).kept_share

    def memory(self, samples: Sequence[Sample], degree: int, recompute: float, cp: int | None = None) -> float:
        tokens = float(sum(map(sample_tokens, samples))) if len(samples) else 0.0
        return self.states + self.activation_bytes(tokens, degree, recompute, cp)

    def max_tokens(self, degree: int, recompute: float, cp: int | None = None) -> int:
        """The most tokens one micro-batch can hold at this degree, recompute level and split."""
        return self.micro_batch_prices(degree, cp).max_tokens(recompute)

    @property
    def level_blocks(self) -> int:
        """The blocks a recompute level counts in (levels are multiples of its inverse): the
        model's, or under PP one stage's, since every stage recomputes the same share of its own
        blocks (`runtime/pipeline`: a level of 3/4 on stages of 2 blocks would run 2 of 2)."""
        return max(1, self.layers // self.stages.count) if self.stages is not None else self.layers

    def levels(self, need, degree: int, cp: int | None = None):
        """The least recompute levels (multiples of 1 / `level_blocks`; above 1 where none fits)
        at which micro-batches whose `activation_bytes` at level 0 are `need` (a float or an array,
        above the free memory) fit: need (1 - c (1 - kept_share)) = free."""
        return self.micro_batch_prices(degree, cp).levels(need)

    def min_recompute(self, tokens: int, degree: int, cp: int | None = None) -> float | None:
        """The smallest recompute level (a multiple of 1 / `level_blocks`) at which `tokens` fit,
        or None."""
        return self.micro_batch_prices(degree, cp).min_recompute(tokens)

    def min_degree(self, tokens: int, at_least: int = 1) -> int | None:
        """The smallest degree, from `at_least` up, at which `tokens` fit in one micro-batch at
        full recomputation."""
        return next((d for d in self.degrees if d >= at_least and self.max_tokens(d, 1.0) >= tokens), None)

    # --- samples -------------------------------------------------------------------------------
    def units(self, samples: Sequence[Sample]) -> np.ndarray:
        """Attention units of each sample under the model's pattern (float64), the cost of its
        spans (`span_seconds`) and its own (`sample_seconds`) included as units of a."""
        frames, per_frame = sample_grid(samples)
        units = self.pattern.units(frames, per_frame, self.spatial_share)
        if self.span_seconds == 0 and self.sample_seconds == 0:  # nothing to add (and a may be 0)
            return units
        spans = self.pattern.spans_per_block(frames, per_frame, self.layers)
        return units + (self.span_seconds * spans + self.sample_seconds) / self.a

    # --- time ----------------------------------------------------------------------------------
    def exchange_bytes(self, degree: int) -> float:
        """Bytes one token contributes to a micro-batch's all-to-alls at SP degree `degree`:
        `bytes_per_token` with the kv heads replicated as the runtime does where the degree does
        not divide them (`layouts.HeadLayout.exchange_bytes`)."""
        return self.pattern.layout.exchange_bytes(self.bytes_per_token, self.heads, self.kv_heads, degree)

    def exchange_seconds(self, tokens, degree: int, cp: int | None = None):
        """Seconds the exchanges of `tokens` (a float or an array) of a micro-batch take at this
        degree and split besides their fixed latency: the Ulysses part's all-to-alls at bw(u),
        the CP part's K, V gather and dK, dV reduce-scatter at bw(d); 0 at degree 1."""
        return self.micro_batch_prices(degree, cp).exchange_seconds(tokens)

    def comm_per_token(self, degree: int, cp: int | None = None) -> float:
        """Seconds of exchanges per token of a micro-batch at this degree and split (0 at degree 1)."""
        return self.exchange_seconds(1.0, degree, cp)

    def fixed_latency(self, degree: int, cp: int | None = None) -> float:
        """Seconds a micro-batch's exchanges cost at this degree and split whatever their size:
        the Ulysses part's all-to-alls (`comm_latency` of u) and the CP collectives'
        (`context_latency` of the whole degree)."""
        cp = self._cp(degree, cp)
        u = degree // cp
        ulysses = self.comm_latency.get(u, 0.0) if u > 1 else 0.0
        return ulysses if cp == 1 else ulysses + self.context_latency.get(degree, 0.0)

    def comm(self, tokens: float, degree: int, cp: int | None = None, recompute: float = 0.0) -> float:
        """Seconds of a micro-batch's exchanges: their bytes and fixed latency, the forward ones
        again for the recomputed layers (`recomputed_exchanges`)."""
        return self.micro_batch_prices(degree, cp).comm(tokens, recompute)

    def attention_factor(self, cp: int) -> float:
        """What a split's CP part multiplies the attention term by (`context_attention`)."""
        return self.context_attention if cp > 1 else 1.0

    def time_from_sums(self, sum_units: float, sum_s: float, degree: int, recompute: float,
                       cp: int | None = None, *, samples: int) -> float:
        """time() from the sums over the micro-batch of attention units and tokens and its count
        of samples (planners keep these), without its kernel calls (`call_time`). The count is
        required: a caller that left it out would under-price a clip model's `rank_sample_seconds`
        without a sign."""
        return self.micro_batch_prices(degree, cp).seconds(sum_units, sum_s, recompute, samples)

    def fixed_seconds(self, recompute: float) -> float:
        """Seconds of a micro-batch at this recompute level whatever its samples (`micro_batch.fixed_seconds`)."""
        return fixed_seconds(self.g, self.recompute_fixed, recompute)

    def attention_time(self, tokens, units):
        """a q elementwise, computed as (a (q / s)) s: for text q / s is s exactly, so this
        rounds as a text-only model's a s s does."""
        return self.a * (units / tokens) * tokens

    def work(self, tokens, units, recompute=0.0):
        """a q (1 + c r_attn) + b s (1 + c r) elementwise (floats or arrays of tokens s, their
        attention units q and levels): a sample's compute at degree 1, without g and
        all-to-alls."""
        return (self.attention_time(tokens, units) * (1.0 + recompute * self.recompute_attention)
                + self.b * tokens * (1.0 + recompute * self.recompute))

    def time(self, samples: Sequence[Sample], degree: int, recompute: float, cp: int | None = None) -> float:
        s = tokens_array(samples)
        summed = self.time_from_sums(float(self.units(samples).sum()), float(s.sum()), degree, recompute, cp,
                                     samples=len(samples))
        return summed + self.call_time(samples, recompute)

    def call_time(self, samples: Sequence[Sample], recompute: float) -> float:
        """The micro-batch's attention calls (`call_seconds`), the part of `time` that no sum over
        its samples gives."""
        if self.call_seconds == 0 or not len(samples):
            return 0.0
        calls = self.pattern.calls_per_block(*sample_grid(samples), self.layers)
        return self.call_seconds * calls * (1.0 + recompute * self.recompute_attention)

    def rank_sample_time(self, samples, recompute=0.0):
        """What `samples` (a count, or an array of counts) add on every rank of their micro-batch's
        group at this level (`rank_sample_seconds`), not divided by the degree."""
        return rank_sample_seconds(self.rank_sample_seconds, self.recompute_attention, samples, recompute)

    def split_time(self, samples: Sequence[Sample], degree: int, recompute: float,
                   cp: int | None = None) -> tuple[float, float]:
        """(compute incl. the fixed overhead, communication) of one micro-batch, in seconds."""
        comm = self.comm(float(tokens_array(samples).sum()), degree, cp, recompute)
        return self.time(samples, degree, recompute, cp) - comm, comm

    def marginal_times(self, tokens, units, degree: int, recompute, cp: int | None = None):
        """What each sample adds to its micro-batch's time at this degree, level and split,
        elementwise (arrays of tokens, their attention units and levels): time() is these summed
        plus `fixed_seconds`, the collectives' fixed latency (`comm`'s at the level) and the
        kernel calls (`call_time`)."""
        attention = (self.attention_time(tokens, units) * (1.0 + recompute * self.recompute_attention)
                     * self.attention_factor(self._cp(degree, cp)))
        linear = self.b * tokens * (1.0 + recompute * self.recompute)
        return ((attention + linear) / degree + self.exchange_seconds(tokens, degree, cp) * recomputed_exchanges(recompute)
                + self.rank_sample_time(1.0, recompute))
