"""`wlb-llm`: WLB-LLM's workload-aware packing on a fixed context-parallel layout.

WLB-LLM (Wang et al., "WLB-LLM: Workload-Balanced 4D Parallelism for Large Language Model
Training", OSDI 2025, arXiv:2503.17924) keeps its 4D layout fixed for the run and balances the
work inside it:

- CP level, per-document sharding (its section 5): one context-parallel size for the run, every
  document cut into 2 x CP chunks and CP worker j holding the head-tail pair (j, 2 CP - 1 - j),
  so every worker has the same tokens and the same causal attention work. That is ballast's
  CONTEXT layout. The size is the smallest power of two at which `max_len` (the context window)
  fits, or `--degree`; the other ranks are data parallel, world / CP replicas, every micro-batch
  at the one recompute level at which `max_len` fits (as `static` sets it).
- PP level, var-length packing (its Algorithm 1): the step's N micro-batches (as many as
  fixed-length packing at the context window makes, ceil(tokens / max_len), rounded up to a
  multiple of the replicas) take the documents longest first, each into the micro-batch of
  least workload W_a + W_l (attention, quadratic, plus linear work and the CP exchange:
  `CostModel.marginal_times`, where WLB-LLM profiles them) if its tokens stay within S_max (the
  most a micro-batch holds at the run's level), else into the one of fewest tokens if they fit
  there, else it waits for the next round.
- Outlier delay: documents of at least L_1 tokens wait in a multi-level queue (level i holds
  L_i <= length < L_(i+1)); a level that holds N of them releases N, one for every micro-batch,
  the earliest first, and the others wait for later steps (`outliers.py`; `defer`, which
  `held.DeferredSamples` carries: at most `held.MAX_WAIT` steps, and never past an epoch's last
  step). A batch planned alone (verify, bench) trains all its outliers in its step.

Micro-batches go to the replicas by LPT on their time (in lockstep where asked, as under
FSDP, WLB-LLM's data parallelism). Under pipeline parallelism each replica is a pipeline and
runs its micro-batches through it in packing order: Algorithm 1 is WLB-LLM's PP-level balance,
micro-batches of unequal tokens and equal workload, so 1F1B's steady state does not stall behind
a heavy one; their count stays fixed-length packing's, as in its evaluation. Not modelled: the
runtime choice between per-sequence and per-document sharding (ballast's runtime always shards
per document; the cost model's `context_attention` prices its kernels).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..vocabulary.layouts import CONTEXT_ONLY, Splits
from ..plans.plan import Group, Plan, Wave
from ..vocabulary.samples import Sample, SampleBatch, tokens
from .base import Planner
from .outliers import micro_batch_count, waiting_outliers
from .packing import deal_by_time, fixed_run, micro_batch, pad_lockstep
from .registry import register

def greedy_pack(ids: Sequence[int], lengths: Sequence[int], workload: np.ndarray, count: int,
                capacity: int) -> tuple[list[list[int]], list[int]]:
    """Algorithm 1's packing of `ids` into `count` micro-batches of at most `capacity` tokens:
    longest first, each into the micro-batch of least workload, else the one of fewest tokens,
    else left for the next round. (The non-empty micro-batches, the ids left.)"""
    bins: list[list[int]] = [[] for _ in range(count)]
    work, tokens = [0.0] * count, [0] * count
    left = []
    for i in sorted(ids, key=lambda i: (-lengths[i], i)):
        lightest = min(range(count), key=lambda k: (work[k], k))
        shortest = min(range(count), key=lambda k: (tokens[k], k))
        target = next((k for k in (lightest, shortest) if tokens[k] + lengths[i] <= capacity), None)
        if target is None:
            left.append(i)
            continue
        bins[target].append(i)
        work[target] += workload[i]
        tokens[target] += lengths[i]
    return [b for b in bins if b], left


@register
class WLBLLMPlanner(Planner):
    name = "wlb-llm"

    def splits(self) -> Splits:
        """Context parallelism over the whole group (per-document head-tail sharding)."""
        return CONTEXT_ONLY

    def defer(self, samples: Sequence[Sample]) -> list[int]:
        """The outliers its queue keeps (`outliers.waiting_outliers`, N over its replicas), unless
        --no-defer-outliers."""
        if not self.options.defer_outliers:
            return []
        lengths = [tokens(x) for x in samples]
        max_len, degree, _ = fixed_run(self.cost, lengths, self.options.max_len, self.options.degree)
        return waiting_outliers(lengths, max_len, self.cluster.world_size // degree)

    def _plan(self, batch: SampleBatch) -> Plan:
        cost, lengths = self.cost, batch.lengths
        max_len, degree, recompute = fixed_run(cost, lengths, self.options.max_len, self.options.degree)
        replicas = self.cluster.world_size // degree
        capacity = cost.max_tokens(degree, recompute)
        workload = cost.marginal_times(np.asarray(lengths, dtype=np.float64), batch.units, degree, recompute)
        count = micro_batch_count(sum(lengths), max_len, replicas)
        info = {"degree": degree, "recompute": recompute, "micro_batches": count}
        bins: list[list[int]] = []
        pending = list(range(len(lengths)))
        while pending:  # the documents that found no room form later rounds
            packed, pending = greedy_pack(pending, lengths, workload, count, capacity)
            assert packed, "a round places its longest document: it fits an empty micro-batch"
            bins += packed
            count = micro_batch_count(sum(lengths[i] for i in pending), max_len, replicas)
        micro_batches = [micro_batch(b, lengths, degree, cost, recompute) for b in bins]
        per_group = deal_by_time(micro_batches, batch, degree, cost, replicas)
        wave = Wave([Group(g * degree, degree, mbs) for g, mbs in enumerate(per_group)])
        if self.options.lockstep:
            wave = pad_lockstep(wave, batch, cost)
        return Plan(lengths, [wave], lockstep=self.options.lockstep, shapes=batch.shapes, info=info)
