"""`megatron-dynamic-cp`: Megatron-Core's dynamic (hybrid) context-parallel scheduler.

Each sequence gets the context-parallel size it needs: the next power of two of
ceil(length / max tokens per rank), where the tokens per rank are set once for the run (the
capacity of one rank at the run's recompute setting). Sequences, heaviest workload first,
are filled greedily into groups of their size: into the least-loaded open group of that
size while its tokens fit and its workload stays within 5% over the balanced target, else
into a newly opened aligned block, else into the next round. Every round is one wave of
single-micro-batch groups.

Under pipeline parallelism Megatron keeps TP and PP static and runs every round's bins through
one schedule: the scheduler runs on all-gathered lengths, the micro-batch count is broadcast,
and every stage runs round i as micro-batch i, each bin's CP group the same on every stage
(middle stages receive only its cu_seqlens, max_seqlen and CP size). Here a round is a wave of
one micro-batch per group, so the plan's slots (`Plan.slots`) are its rounds, in the order the
scheduler made them (heaviest first), and the timeline runs them as that one 1F1B schedule.
"""
from __future__ import annotations

import math

from ..vocabulary.layouts import CONTEXT_ONLY, Splits
from ..plans.plan import Group, MicroBatch, Plan, Wave, fill_idle
from ..vocabulary.samples import SampleBatch
from .base import Planner
from .packing import fixed_run, pad_lockstep
from .registry import register

SLACK = 0.05


@register
class MegatronDynamicCPPlanner(Planner):
    name = "megatron-dynamic-cp"

    def splits(self) -> Splits:
        return CONTEXT_ONLY

    def _plan(self, batch: SampleBatch) -> Plan:
        cost, world, lengths = self.cost, self.cluster.world_size, batch.lengths
        _, smallest, recompute = fixed_run(cost, lengths, self.options.max_len)
        # Per rank as the run's smallest degree sees it, so that max_len needs that degree
        # exactly (max_tokens rounds down per degree, not per rank).
        per_rank = cost.max_tokens(smallest, recompute) / smallest
        degree_of = {}
        for i, s in enumerate(lengths):
            need = 1 << max(0, math.ceil(s / per_rank) - 1).bit_length()
            # A size the heads cannot be sharded over rounds up to the next one they can.
            degree_of[i] = next(d for d in cost.degrees if d >= need)
        # Workload without g: sequences packed into one micro-batch share its fixed cost.
        work = {i: cost.time(batch.pick([i]), degree_of[i], recompute) - cost.g for i in degree_of}
        # The balanced per-rank workload; a sequence heavier than that gets a group of its own.
        target = sum(work[i] * degree_of[i] for i in work) / world
        pending = sorted(work, key=lambda i: -work[i])
        waves = []
        while pending:
            groups, deferred = self._round(pending, lengths, degree_of, work, per_rank, target * (1 + SLACK))
            waves.append(Wave(fill_idle(groups, world)))
            assert len(deferred) < len(pending), "a round must place at least one sequence"
            pending = deferred
        for wave in waves:
            for g in wave.groups:
                for mb in g.micro_batches:
                    mb.recompute = recompute
        if self.options.lockstep:
            waves = [pad_lockstep(wave, batch, cost) for wave in waves]
        return Plan(lengths, waves, lockstep=self.options.lockstep, shapes=batch.shapes,
                    info={"recompute": recompute, "tokens_per_rank": per_rank})

    def _round(self, pending, lengths, degree_of, work, per_rank, limit):
        free = [True] * self.cluster.world_size
        groups: list[Group] = []
        load: dict[int, float] = {}
        tokens: dict[int, int] = {}
        deferred = []
        for i in pending:
            d = degree_of[i]
            open_groups = [k for k, g in enumerate(groups) if g.degree == d
                           and tokens[k] + lengths[i] <= d * per_rank and load[k] + work[i] <= limit]
            if open_groups:
                k = min(open_groups, key=lambda k: load[k])
            else:
                start = next((s for s in range(0, len(free) - d + 1, d) if all(free[s:s + d])), None)
                if start is None:
                    deferred.append(i)
                    continue
                free[start:start + d] = [False] * d
                groups.append(Group(start, d, [MicroBatch([], 0.0)]))
                k = len(groups) - 1
                load[k], tokens[k] = 0.0, 0
            groups[k].micro_batches[0].seq_ids.append(i)
            load[k] += work[i]
            tokens[k] += lengths[i]
        return groups, deferred
