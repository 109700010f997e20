"""One micro-batch's prices at one SP degree and split, as constants: what `CostModel`'s
time, exchange and memory formulas (docs/design.md, section 4) are at a fixed (degree, cp).

Planners price tens of thousands of micro-batches per plan, almost all at a handful of
(degree, cp); each `CostModel` method call re-derived the same split, bandwidths and gathered
bytes. `CostModel.micro_batch_prices` makes these once per (degree, cp) and its methods
delegate here, so there is one formula and it is evaluated with the constants at hand. Every
expression keeps the cost model's order of operations, so the prices are the same floats.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RECOMPUTED_EXCHANGES = 0.5
"""Of a micro-batch's exchanges, the share a recomputed layer runs again: its forward's (the
all-to-alls' forward half, the CP gather of gather and reduce-scatter; the 2D video layout alike)."""
LEVEL_EPS = 1e-9  # relative slack of a level or fit computed in floats


def recomputed_exchanges(recompute):
    """How many times a micro-batch's exchanges run at this recompute level (floats or arrays),
    relative to none recomputed: recomputed layers repeat their forward ones."""
    return 1.0 + recompute * RECOMPUTED_EXCHANGES


def fixed_seconds(g: float, recompute_fixed: float, recompute):
    """Seconds of a micro-batch at this recompute level whatever its samples: g, and the
    recomputed layers' fixed part (`recompute_fixed`)."""
    return g + recompute * recompute_fixed


def rank_sample_seconds(per_sample: float, recompute_attention: float, samples, recompute):
    """Seconds `samples` (counts; floats or arrays) cost on every rank of their micro-batch's
    group at this recompute level (`CostModel.rank_sample_seconds` = per_sample), not divided by
    the degree, recomputed with the attention they sit beside."""
    return per_sample * samples * (1.0 + recompute * recompute_attention)


@dataclass(frozen=True)
class MicroBatchPrices:
    """A micro-batch's time and memory at one degree d and split (u Ulysses x cp CP ranks), from
    the cost model's coefficients. Methods take floats or arrays, elementwise."""

    degree: int
    cp: int
    a: float
    b: float
    g: float
    recompute: float
    recompute_attention: float
    recompute_fixed: float
    attention_factor: float
    """`context_attention` where cp > 1, else 1."""
    ulysses_bytes: float
    """Exchange bytes per token of the Ulysses part (`CostModel.exchange_bytes(u)`; 0 at u = 1)."""
    ulysses_bandwidth: float
    """d times the Ulysses part's bandwidth (1 at u = 1: unused)."""
    context_rate: float
    """Seconds per token of the CP part's K, V gather and dK, dV reduce-scatter (0 at cp = 1)."""
    latency: float
    """The exchanges' fixed seconds per micro-batch (`CostModel.fixed_latency`)."""
    act_per_token: float
    kept: float
    gathered: float
    """Gathered K, V bytes per token per device (`CostModel.gathered_per_token`)."""
    free: float
    """Device memory less the states."""
    level_blocks: int
    rank_sample: float = 0.0
    """Seconds per sample on every rank of the group (`CostModel.rank_sample_seconds`)."""

    @property
    def u(self) -> int:
        return self.degree // self.cp

    def exchange_seconds(self, tokens):
        """The exchanges' seconds of `tokens` besides their fixed latency (`CostModel.exchange_seconds`)."""
        if self.degree == 1:
            return 0.0 * tokens
        seconds = 0.0 if self.u == 1 else self.ulysses_bytes * tokens / self.ulysses_bandwidth
        if self.cp == 1:
            return seconds
        return seconds + self.context_rate * tokens

    def comm(self, tokens, recompute=0.0):
        """Seconds of a micro-batch's exchanges (`CostModel.comm`): of a float, or elementwise of
        arrays of positive token counts (`GroupPacker` prices many micro-batches at once)."""
        if self.degree == 1 or (not isinstance(tokens, np.ndarray) and tokens == 0):
            return 0.0
        return (self.exchange_seconds(tokens) + self.latency) * recomputed_exchanges(recompute)

    def seconds(self, sum_units, sum_s, recompute, samples):
        """A micro-batch's seconds from its sums of attention units and tokens and its count of
        samples (`CostModel.time_from_sums`); elementwise of arrays too (`comm`'s)."""
        attention = self.a * sum_units * (1.0 + recompute * self.recompute_attention) * self.attention_factor
        compute = (attention + self.b * sum_s * (1.0 + recompute * self.recompute)) / self.degree
        seconds = compute + self.comm(sum_s, recompute) + fixed_seconds(self.g, self.recompute_fixed, recompute)
        if self.rank_sample:
            seconds += rank_sample_seconds(self.rank_sample, self.recompute_attention, samples, recompute)
        return seconds

    def fixed_part(self) -> float:
        """What every micro-batch of samples pays with none recomputed, whatever they are (`seconds`
        less its terms in units, tokens and samples): g, and the exchanges' latency where the
        group exchanges (`comm`'s latency)."""
        return fixed_seconds(self.g, self.recompute_fixed, 0.0) + (self.latency if self.degree > 1 else 0.0)

    def kept_fraction(self, recompute: float) -> float:
        """The share of its activations a micro-batch keeps at this level (all at 0, k at 1)."""
        return recompute * self.kept + (1.0 - recompute)

    def activation_bytes(self, tokens, recompute: float):
        """Bytes per device `tokens` keep for backward at this level (`CostModel.activation_bytes`)."""
        gathered = self.gathered * (1.0 - recompute)
        return self.act_per_token * tokens / self.degree * self.kept_fraction(recompute) + gathered * tokens

    def max_tokens(self, recompute: float) -> int:
        """The most tokens one micro-batch holds at this level (`CostModel.max_tokens`)."""
        per_rank = self.act_per_token * self.kept_fraction(recompute) + self.degree * self.gathered * (1.0 - recompute)
        # A relative margin: above ~1e7 tokens one ulp exceeds an absolute 1e-9 (exact fits lost).
        return int(self.free * self.degree / per_rank * (1 + 1e-12))

    @property
    def kept_share(self) -> float:
        """The share of a token's bytes at level 0 that full recomputation keeps (`CostModel.kept_share`)."""
        return self.kept * (self.act_per_token / (self.act_per_token + self.degree * self.gathered))

    def levels(self, need):
        """The least levels at which micro-batches needing `need` bytes at level 0 fit (`CostModel.levels`)."""
        c = (1.0 - self.free / need) / (1.0 - self.kept_share)
        return np.ceil(c * self.level_blocks - LEVEL_EPS) / self.level_blocks

    def min_recompute_of_many(self, tokens: np.ndarray) -> np.ndarray:
        """`min_recompute` of many positive token counts that all fit at some level (a float64
        array; the caller checks the largest), the same levels."""
        need = self.activation_bytes(tokens, 0.0)
        return np.where(need <= self.free * (1 + LEVEL_EPS), 0.0, self.levels(need))

    def min_recompute(self, tokens: int) -> float | None:
        """The least level at which `tokens` fit, or None (`CostModel.min_recompute`)."""
        need = self.activation_bytes(tokens, 0.0)
        if need <= self.free * (1 + LEVEL_EPS):
            return 0.0
        level = float(self.levels(need))
        return level if level <= 1.0 else None
