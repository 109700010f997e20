"""The step besides the passes' own work: the data-parallel collectives, the part of them that
compute does not hide, and the optimizer step (docs/design.md, section 4, *The whole step*).

A rank holds P parameters whole (a TP shard's, a stage's under PP), R of them in no block, over a
pool of N data-parallel ranks; collectives run at the cluster's ring bandwidth bw per rank
(`Cluster.ring_bandwidth`) plus its collective latency l each; v = (N - 1) / N; a gathered
parameter has pb bytes (2 under bf16, FSDP2's policy; else 4). What the runtime runs:

    mode        after the last backward (K buckets, overlapped)    after the optimizer     optimizer
    replicated  all-reduce S = 2 v 4 P / bw + K l                  -                       32 P / mem
    zero1       reduce-scatter S = v 4 P / bw + K l                Z = 4 P / bw + K l      32 P / N / mem
    fsdp        the root's reduce-scatter S = v 4 R / bw + l        -                       32 P / N / mem

K = ceil(4 P / BUCKET_BYTES) (the runtime's buckets, `runtime/grad_sync.py`; FSDP2's last unit
is the root), ZeRO-1's Z the owners' broadcasts of the updated parameters, mem the device's
memory bandwidth (`Cluster.memory_bandwidth`) and 32 bytes a parameter what AdamW streams
(`OPTIMIZER_BYTES`).

**FSDP2's passes.** Every pass gathers what it runs: a forward the root and every block
(Gf = v pb P / bw + (blocks + 1) l), a backward every block again and reduce-scatters every
unit's gradients (Gb = v (pb (P - R) + 4 P) / bw + (2 blocks + 1) l), on a stream of their own
while the pass computes (prefetched a unit ahead). Nothing hides the first gathers, the root's
and the first block's (u = v pb (R + B) / bw + 2 l, B the largest block): a fixed cost of every
micro-batch, which `get_cost_model` adds to the cost model's g (`Cluster.micro_batch_overhead`
counts parameter gathers there too), so planners and the bound see it. A pass of f seconds
forward and b backward (u in f) then takes max(f, Gf) and max(b, Gb): a short pass waits for
its gathers.

**Overlap of the reduction.** Bucket k's collective starts once every rank of the pool has its
gradients final and bucket k - 1 is done. A rank's gradients become final during its last
backward, which ends at E_r and lasts W_r: bucket k (of K, in backward's order) at
E_r - W_r (K - 1 - k) / K; a rank with no pass has them at the end of the waves T. So

    F = max_k [ max_r (E_r - W_r (K - 1 - k) / K) + (K - k) S / K ]
      = max_r max(E_r + S / K,  E_r - W_r (K - 1) / K + S)

(linear in k for each rank, so an end of the range is the max), and the step ends at
F + O + Z. Under PP each stage's ranks reduce their stage's gradients over their own pool and
step their own optimizer: the step ends at max_k (F_k + O_k + Z_k).

**Bound.** The rank that ends the waves at T must still reduce its last bucket, and the buckets
run one after another: F >= max(T + S / K, S). So a step is at least max(LB + S / K, S) + O + Z
over a lower bound LB of the waves, and under PP at least max(LB + min_k (S_k / K_k + O_k + Z_k),
max_k (S_k + O_k + Z_k)) (the stage that ends last is not known). FSDP2's gathers only lengthen
passes, so a bound of the waves without them holds with them, and the busiest rank's one pass at
least lasts Gf + Gb.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ..vocabulary.cluster import Cluster
from ..vocabulary.sharding import BUCKET_BYTES, Sharding
from .device_memory import BF16, FP32, ParameterCounts

OPTIMIZER_BYTES = 32
"""Bytes of device memory AdamW's step (fp32) streams per parameter it updates: it reads the
parameter, its gradient, momentum and variance (16) and writes the parameter, momentum and
variance (12); the gradient norm before it reads the gradient once more (4)."""


@dataclass(frozen=True)
class DataParallelPrices:
    """What a rank's data-parallel sharding costs in a step besides its passes' own work (module
    docstring); all seconds."""

    buckets: int = 0
    """K: the reduction's collectives after the last backward, launched in order as backward makes
    their gradients final."""
    reduction: float = 0.0
    """S: seconds of all of them, one after another."""
    after_optimizer: float = 0.0
    """Z: seconds after the optimizer step (ZeRO-1's broadcasts of the updated parameters)."""
    optimizer: float = 0.0
    """O: seconds of the optimizer step on the parameters this rank updates."""
    forward_gathers: float = 0.0
    """Gf: FSDP2's gathers of one forward pass (0 unless FSDP)."""
    backward_collectives: float = 0.0
    """Gb: FSDP2's gathers and reduce-scatters of one backward pass (0 unless FSDP)."""
    first_gathers: float = 0.0
    """u: the gathers a pass waits for before it computes (0 unless FSDP): part of the cost
    model's g, where `get_cost_model` puts it."""

    def __post_init__(self) -> None:
        assert self.buckets >= 0 and min(self.reduction, self.after_optimizer, self.optimizer, self.forward_gathers,
                                         self.backward_collectives, self.first_gathers) >= 0, self

    @property
    def last_bucket(self) -> float:
        """S / K: the last bucket's collective, which no backward hides."""
        return self.reduction / self.buckets if self.buckets else 0.0

    @property
    def after_reduction(self) -> float:
        """O + Z: what follows the reduction."""
        return self.optimizer + self.after_optimizer

    def passes(self, forward: float, backward: float) -> tuple[float, float]:
        """A pass's seconds (forward, backward; the first gathers in its g) with FSDP2's gathers
        around it (module docstring)."""
        return max(forward, self.forward_gathers), max(backward, self.backward_collectives)

    def reduction_end(self, last_backwards: Iterable[tuple[float, float] | None], waves_end: float) -> float:
        """F: when the reduction ends, given each pool rank's last backward as (end, seconds), None
        for a rank with no pass in the step (module docstring)."""
        if not self.buckets:
            return waves_end
        share = (self.buckets - 1) / self.buckets
        end = waves_end + self.last_bucket
        for last in last_backwards:
            finish, seconds = last if last is not None else (waves_end, 0.0)
            end = max(end, finish + self.last_bucket, finish - seconds * share + self.reduction)
        return end

    def least_end(self, waves_bound: float) -> float:
        """No step whose waves take at least `waves_bound` (and one pass: its gathers) ends sooner
        (module docstring)."""
        waves = max(waves_bound, self.forward_gathers + self.backward_collectives)
        return max(waves + self.last_bucket, self.reduction) + self.after_reduction


NOTHING = DataParallelPrices()
"""Nothing priced besides the passes' work: a cost model that knows no parameters, or one rank
with nothing to step."""


def data_parallel_prices(counts: ParameterCounts, sharding: Sharding, bf16: bool, pool: int,
                         cluster: Cluster, source: str = "analytic") -> DataParallelPrices:
    """The prices (module docstring) for a rank holding `counts` in `sharding` (`bf16`: FSDP2
    gathers in bf16) over a pool of `pool` ranks of `cluster` (the pool's cluster: its ring
    bandwidth, latency and memory bandwidth), under a cost model whose coefficients come from
    `source` (`CostModel.source`): FlexSP's `published` profile was measured under ZeRO-3, so
    under FSDP its passes hold their gathers and reduce-scatters already (its g what they left
    exposed) and only the optimizer step is added."""
    if sharding is Sharding.CANONICAL:  # a strategy's movement prices its reduction and step over the job
        return NOTHING
    optimizer = optimizer_seconds(counts.total / (1 if sharding is Sharding.REPLICATED else pool), cluster)
    if pool == 1 or (source == "published" and sharding is Sharding.FSDP):
        return DataParallelPrices(optimizer=optimizer)
    assert cluster.ring_bandwidth is not None, f"cluster {cluster.name!r} of {pool} ranks has a ring bandwidth"
    bw, latency, share = cluster.ring_bandwidth, cluster.all_to_all_latency, (pool - 1) / pool
    if sharding is Sharding.FSDP:
        gathered = BF16 if bf16 else FP32
        blocks = counts.block and round((counts.total - counts.root) / counts.block)
        return DataParallelPrices(
            1, share * FP32 * counts.root / bw + latency, optimizer=optimizer,
            forward_gathers=share * gathered * counts.total / bw + (blocks + 1) * latency,
            backward_collectives=(share * (gathered * (counts.total - counts.root) + FP32 * counts.total) / bw
                                  + (2 * blocks + 1) * latency),
            first_gathers=share * gathered * (counts.root + counts.block) / bw + 2 * latency)
    gradients = FP32 * counts.total
    buckets = max(1, math.ceil(gradients / BUCKET_BYTES))
    if sharding is Sharding.REPLICATED:
        return DataParallelPrices(buckets, 2 * share * gradients / bw + buckets * latency, optimizer=optimizer)
    return DataParallelPrices(buckets, share * gradients / bw + buckets * latency,
                              after_optimizer=gradients / bw + buckets * latency, optimizer=optimizer)


def optimizer_seconds(updated: float, cluster: Cluster) -> float:
    """AdamW's step over `updated` parameters; 0 where the cluster gives no memory bandwidth."""
    if cluster.memory_bandwidth is None:
        return 0.0
    return OPTIMIZER_BYTES * updated / cluster.memory_bandwidth
