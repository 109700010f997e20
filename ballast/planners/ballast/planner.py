"""`ballast`: ballast's own planner. Degree, placement, accumulation and recomputation, jointly.

A wave lasts as long as its slowest group; a group's time is the sum of its micro-batches.
Inside a group, compute and all-to-all time do not depend on how the sequences are packed:
only the fixed cost g per micro-batch and the recomputation of recomputed layers do, and
memory decides between them. The planner therefore sees a group's time as

    est = sum_s (a q_s + b |s|) / d + comm(tokens, d) + F(tokens / d)
    F(x) = g + (x - cap)+ min(r rho / (1 - k), g / cap)

where q_s is sample s's attention units (|s|^2 for a text sequence, `samples.attention_units`),
cap is what fits a device without recomputation and rho the group's compute per token:
beyond cap a group either recomputes (r rho per token, at the least level that fits) or
opens another micro-batch (g), whichever is cheaper. The same F makes the cost model's lower
bound tight. For a makespan target T the planner builds a wave in four moves:

1. **Degree per sequence.** Each sequence takes the degree of least area (devices x seconds)
   among those that finish it alone within T, so short sequences stay at degree 1 and a
   sequence grows its degree only as far as T demands: Zeppelin's crossovers, per step.
2. **Groups in proportion to work.** Each degree class gets ranks in proportion to its area
   (whole groups, at least one per non-empty class, spare ranks to the class whose groups
   are slowest, granularity counted: three equal sequences on two groups take two units;
   then ranks move between classes while that shortens the slowest: `allocation.py`);
   blocks are laid out largest first, so every block is aligned and stays inside a node
   unless its degree is wider. Groups of different degrees share the wave (FlexSP), each
   with its own accumulation count (DCP-inter).
3. **Earliest-finish assignment, then local search.** Longest first, each sequence goes to
   the group whose `est` grows least (Hydraulis balances replicas by quadratic time; here the
   memory overhead is in the balance too); then sequences move off the slowest group, or
   swap with shorter ones of another group, while that shortens the wave.
4. **Micro-batches and recompute levels.** Each group tries every micro-batch count from
   the fewest memory allows up to the count at which nothing is recomputed, packs its
   sequences token-balanced, gives each micro-batch the least recompute level that fits
   (DCP-intra, per micro-batch), and keeps the fastest count; sequences do not split, so
   best-fit bins of what fits without recomputation, and of what fits with all of it (the
   fewest micro-batches memory allows, which token balance can miss), are tried too. Under
   FSDP2 each micro-batch is priced with the gathers that outlast its passes
   (`GroupPacker.mb_time`), so a count that makes short passes pays for them.

**Splits.** A group of degree d runs attention as Ulysses over u ranks times context
parallelism over c (d = u c, `layouts.Splits`; ballast may use any split the heads allow). Each
sequence's time alone (moves 1 and 3's feasibility, the allocation) is at its fastest split;
`est` prices each degree at one split, the one least for a group holding its share of the
batch (the gathered K and V shrink `cap`); move 4 packs each group at every split no other
beats on every term and keeps the fastest, so the group's `cp` is chosen on exact times.

Targets T from the lower bound up to "least area everywhere" are all tried, each also with
a floor on the degree (every sequence at least at degree D, the longest keeping their wider
one; one degree for all at the top), which pays g once for many short sequences where
all-to-alls are cheap. Distinct layouts are ranked by the proxy; the best few are assigned,
the two best estimated waves packed exactly, repaired by moving sequences between groups on
exact times (a group that gave sequences away is packed afresh), and the faster kept.
Two-wave splits are tried too: the longest sequences in a wave of their own when one of
them takes a large part of the step, and, as Zeppelin splits by class, the sequences that need wide groups at the
lower bound ahead of the rest. Every candidate is a valid plan and the fastest under the
cost model wins. Last, a step that a few sequences decide alone gets those sequences remapped
where that is faster (`poles.py`; not under lockstep), and each wave whose all-to-alls cross
nodes is routed over every NIC of the node (`Wave.routed`) where that ends it sooner. Under a
pipeline neither (`Planner.pipelined`), and the search runs twice, for the pipeline and as if
there were none (that one building only its proxy's best head size), the shorter step through
the pipeline kept (`waves`), and across steps outliers wait in WLB-LLM's queue until enough have
gathered (`defer`).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ...pricing.cost import CostModel
from ...vocabulary.layouts import ANY_SPLIT, Splits
from ...plans.plan import Plan, Wave
from ...vocabulary.samples import Sample, SampleBatch, tokens
from ...plans.timeline import step_time, wave_time
from ..registry import register
from ..base import Planner
from ..outliers import waiting_outliers
from ..packing import pad_lockstep
from .poles import remap_poles
from .search import WaveSearch


def staged_levels(waves: list[Wave], batch: SampleBatch, cost: CostModel) -> None:
    """Give every micro-batch of `waves`, searched as if there were no pipeline (levels in the
    whole model's blocks), the least level a stage of `cost`'s pipeline runs as priced (in its
    blocks, `CostModel.level_blocks`): never below its own, so it still fits."""
    for wave in waves:
        for group in wave.groups:
            for mb in group.micro_batches:
                if mb.seq_ids:
                    level = cost.min_recompute(sum(batch.lengths[i] for i in mb.seq_ids), group.degree, group.cp)
                    assert level is not None and level >= mb.recompute - 1e-9, "a coarser level fits as well"
                    mb.recompute = level


@register
class BallastPlanner(Planner):
    name = "ballast"

    def splits(self) -> Splits:
        """Every split the heads allow; each group runs its fastest (`GroupPacker.pack`)."""
        return ANY_SPLIT

    def defer(self, samples: Sequence[Sample]) -> list[int]:
        """Under a pipeline, WLB-LLM's outlier queue (`outliers.waiting_outliers`) with N counted
        over the pool's ranks, each a pipeline: a step then holds no lone outlier whose
        micro-batch's chain through the stages sets the bubble, and the held ones gather until
        they run side by side. Simulated, mean step over a run (every sample trained by its end,
        bench/pipelines.sh's settings): P1 3.1%, P2 8.2%, P3 12.0% shorter. Without a pipeline
        it gained 0.3% and 1.2% (bench/simulated.sh's B and C; A holds none), too little to
        change the step a sample trains in, so there ballast trains every sample in the step
        that drew it, the batches of the planners that do not defer. None either without a
        max_len (the queue's levels are fractions of it) or under --no-defer-outliers."""
        if not (self.options.defer_outliers and self.pipelined and self.options.max_len is not None):
            return []
        return waiting_outliers([tokens(x) for x in samples], self.options.max_len, self.cluster.world_size)

    def _plan(self, batch: SampleBatch) -> Plan:
        waves = self.waves(batch, self.cluster.world_size)
        if self.options.lockstep:
            waves = [pad_lockstep(wave, batch, self.cost) for wave in waves]
        elif not self.pipelined:
            waves = remap_poles(self.cost, batch, waves, self.waves)
        plan = Plan(batch.lengths, waves, lockstep=self.options.lockstep, shapes=batch.shapes)
        if self.options.routing and not self.pipelined:
            self._route(plan)
        return plan

    def _route(self, plan: Plan) -> None:
        """Route each wave whose all-to-alls cross nodes where that ends it sooner: not where its
        NICs are evenly loaded already (whole nodes exchanging alike), where the hand-offs to
        proxies only add time; where a few ranks' NICs carry a node's inter-node bytes."""
        for wave in plan.waves:
            if wave.crosses_nodes(self.cluster.devices_per_node):
                unrouted = wave_time(plan, wave, self.cost)
                wave.routed = True
                wave.routed = wave_time(plan, wave, self.cost) < unrouted

    def waves(self, batch: SampleBatch, ranks: int) -> list[Wave]:
        """The fastest waves for `batch` on ranks 0..ranks-1 (the rest of the cluster idle); under
        a pipeline, also the waves searched as if there were none, whichever step is shorter
        through the pipeline: its packing for 1F1B can miss a layout the plain search finds (on
        llama3-8b, PP 4 under ZeRO-1, one batch of three ran 16% slower without it; on P1 one
        step of ten 2.3%). The plain search builds only the head size its proxy ranks best: on
        P1-P3 (bench/pipelines.sh) every plain plan that won was that one, and building three
        had doubled the planning time (P1 1.99 s a step, now 1.15; P3 2.65 s, now 2.40)."""
        seconds, found = WaveSearch(self.cost, batch, ranks).best()
        if not self.pipelined:
            return found
        _, plain = WaveSearch(dataclasses.replace(self.cost, stages=None), batch, ranks).best(heads=1)
        staged_levels(plain, batch, self.cost)
        return plain if step_time(Plan(batch.lengths, plain, shapes=batch.shapes), self.cost) < seconds else found
