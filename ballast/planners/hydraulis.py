"""`hydraulis`: Hydraulis' dynamic heterogeneous replicas and two-stage data assignment.

Hydraulis (Li et al., 2024) names two imbalances of variable-length training: sampling
imbalance (a step's lengths differ across steps and replicas) and packing imbalance (memory
grows linearly with a micro-batch's tokens, time quadratically: with its attention units,
`samples.attention_units`, s^2 for a text sequence). It answers each step with
model replicas of heterogeneous parallel strategies and a two-stage assignment. Here a
replica is an SP group, its strategy its degree. One step, one wave, groups independent:

0. Replicas for the step's length histogram. Each sequence gets an estimated time per
   degree (alone, at the least recompute level it needs, plus its share of the fixed
   per-micro-batch cost). For a small degree d_S and a target time T, a sequence that does
   not fit d_S or takes longer than T there is long: it wants the smallest larger degree at
   which it takes at most T (else its fastest). Long sequences are binned first-fit
   decreasing into replicas of their degree holding T each, so there are enough large
   replicas for them; the remaining ranks become replicas of degree d_S. Every d_S and
   T = the lower bound x TARGETS gives a layout; layouts are ranked by the histogram estimate
   (the slowest long replica, or the short work spread over the small replicas) and the best
   LAYOUTS_DISPATCHED get a full stage 1. The strategy proposal of the paper (a fixed set
   of strategies searched offline from the length distribution, one picked per step) is
   replaced by this per-step construction.
1. Sequences to replicas: randomised greedy. Sequences in an order go one by one to the
   replica that would finish them first (replicas of a degree that cannot hold a sequence
   are skipped), which minimises the slowest replica's estimated time. The first order is
   most work first (work: a q + b s, q the attention units); TRIALS - 1 more are seeded
   shuffles of it (`PlannerOptions.seed`; each sequence's key is its work times a lognormal
   factor, so similar sequences swap places and heavy ones still come early). The order with
   the smallest slowest-replica time wins; a seed fixes the plan.
2. Micro-batches inside a replica: for a count m, sequences most work first go to the
   micro-batch of least work (a q + b s) that still has room under the token cap
   (full recomputation at the replica's degree); each micro-batch then runs at the least
   recompute level its tokens need. Counts are tried from the fewest that can hold the
   tokens upward, and the count whose micro-batches take the least total time wins: fewer
   micro-batches pay the fixed cost g fewer times, more of them recompute less. The search
   stops once no larger count can win: a count m costs at least the replica's work, its
   all-to-alls, m g and the recomputation that sequences too long to run without
   recomputation force on any count.

This is hydraulis on one job mesh (no --strategy): its "replicas" are the pool's Ulysses SP
groups. On heterogeneous strategies (--strategy) the published form runs instead
(`hydraulis_strategies.py`: pipelines of their own (TP, PP), stage 1 and stage 2 as the
repository has them, the choice of a strategy per step; `hydraulis_pool.py`, its offline
proposal of strategies). Deviations here: the paper's replicas combine tensor and pipeline
parallelism, and its packing balances pipeline micro-batches; these replicas are Ulysses SP
groups, so a replica's time is the sum of its micro-batch times and only g and recomputation
make the count matter. Where the paper's implementation solves integer programs (its repository
depends on PuLP), this planner keeps to the greedy heuristics above, so that a step plans in
milliseconds.
"""
from __future__ import annotations

import heapq
import math
from typing import Mapping, Sequence

import numpy as np

from ..plans.plan import Group, MicroBatch, Plan, Wave, fill_idle
from ..vocabulary.samples import SampleBatch
from .base import Planner
from .packing import mb_time, pad_lockstep
from ..pricing.bounds import lower_bound
from .registry import register
from ..pricing.sequence_times import sequence_times

TRIALS = 8  # orders tried by the randomised greedy, most work first included
NOISE = 0.3  # sigma of the lognormal factor that shuffles an order
TARGETS = (1.0, 1.25, 1.5, 2.0, 3.0)  # replica target times, multiples of the lower bound
LAYOUTS_DISPATCHED = 3  # layouts, best by the histogram estimate, that get a full stage 1


@register
class HydraulisPlanner(Planner):
    name = "hydraulis"

    def _plan(self, batch: SampleBatch) -> Plan:
        estimates = self.sequence_estimates(batch)
        layouts = self.candidate_layouts(estimates, lower_bound(self.cost, batch.samples))
        work = self.cost.work(np.asarray(batch.lengths, dtype=np.float64), batch.units)
        heaviest_first = np.argsort(-work, kind="stable")
        (slowest, replicas), layout = min(((self.dispatch(lay, heaviest_first, estimates), lay)
                                           for lay in layouts), key=lambda r: r[0][0])
        rng = np.random.default_rng(self.options.seed)
        for _ in range(TRIALS - 1):
            order = np.argsort(-work * np.exp(NOISE * rng.standard_normal(len(batch))), kind="stable")
            trial = self.dispatch(layout, order, estimates)
            if trial[0] < slowest:
                slowest, replicas = trial
        groups, start = [], 0
        for degree, seq_ids in zip(layout, replicas):
            groups.append(Group(start, degree, self.pack(seq_ids, batch, degree)))
            start += degree
        wave = Wave(fill_idle(groups, self.cluster.world_size))
        if self.options.lockstep:
            wave = pad_lockstep(wave, batch, self.cost)
        return Plan(batch.lengths, [wave], lockstep=self.options.lockstep, shapes=batch.shapes,
                    info={"replicas": list(layout), "estimate_s": slowest})

    # --- stage 0: replicas --------------------------------------------------------------------
    def sequence_estimates(self, batch: SampleBatch) -> np.ndarray:
        """[degree index, sequence]: seconds alone at the least level, with its share of g (by
        tokens: what fills a micro-batch is memory)."""
        cost = self.cost
        s = np.asarray(batch.lengths, dtype=np.float64)
        share = np.array([np.minimum(1.0, s / max(1, cost.max_tokens(d, 0.0))) for d in cost.degrees])
        return sequence_times(cost, batch.samples) + cost.g * share

    def candidate_layouts(self, estimates: np.ndarray, bound: float) -> list[tuple[int, ...]]:
        """The most promising replica layouts (degrees, largest first) for this histogram."""
        world, degrees = self.cluster.world_size, self.cost.degrees
        top = estimates[-1]
        # One replica layout that always works: as many of the largest degree as fit.
        count = world // degrees[-1]
        scored = {(degrees[-1],) * count: max(top.max(), top.sum() / count)}
        for small in range(len(degrees)):
            for f in TARGETS:
                found = self.layout(estimates, small, bound * f)
                if found is not None and scored.get(found[0], math.inf) > found[1]:
                    scored[found[0]] = found[1]
        return sorted(scored, key=scored.get)[:LAYOUTS_DISPATCHED]

    def layout(self, estimates: np.ndarray, small: int, target: float) -> tuple[tuple[int, ...], float] | None:
        """Replica degrees and their estimated slowest time for small degree index and target."""
        degrees, world = self.cost.degrees, self.cluster.world_size
        mine = estimates[small]
        is_long = ~(mine <= target)
        upper = estimates[small:, is_long]
        within = upper <= target
        # The smallest degree within the target, else the fastest one.
        wants = small + np.where(within.any(axis=0), within.argmax(axis=0), upper.argmin(axis=0))
        replicas: list[int] = []
        slowest = 0.0
        for j in np.unique(wants):
            loads = first_fit_decreasing(estimates[j, is_long][wants == j], target)
            replicas += [degrees[j]] * len(loads)
            slowest = max(slowest, max(loads))
        used = sum(replicas)
        if used > world:
            return None
        smalls = (world - used) // degrees[small]
        short_work = float(mine[~is_long].sum())
        if short_work > 0:
            if smalls == 0:
                return None
            slowest = max(slowest, short_work / smalls)
        return tuple(sorted(replicas + [degrees[small]] * smalls, reverse=True)), slowest

    # --- stage 1: sequences to replicas -------------------------------------------------------
    def dispatch(self, layout: tuple[int, ...], order: np.ndarray,
                 estimates: np.ndarray) -> tuple[float, list[list[int]]]:
        """Greedy earliest finish in `order`: (slowest replica's estimate, sequences per replica)."""
        row = {d: i for i, d in enumerate(self.cost.degrees)}
        heaps: dict[int, list[tuple[float, int]]] = {}
        for r, d in enumerate(layout):
            heaps.setdefault(d, []).append((0.0, r))
        times = {d: estimates[row[d]].tolist() for d in heaps}
        replicas: list[list[int]] = [[] for _ in layout]
        for i in order.tolist():
            best_d, best_end = 0, math.inf
            for d, heap in heaps.items():
                end = heap[0][0] + times[d][i]
                if end < best_end:
                    best_d, best_end = d, end
            assert best_end < math.inf, f"sequence {i} fits no replica of {layout}"
            _, r = heapq.heappop(heaps[best_d])
            heapq.heappush(heaps[best_d], (best_end, r))
            replicas[r].append(i)
        return max(load for heap in heaps.values() for load, _ in heap), replicas

    # --- stage 2: micro-batches inside a replica ----------------------------------------------
    def pack(self, seq_ids: list[int], batch: SampleBatch, degree: int) -> list[MicroBatch]:
        """The replica's micro-batches at the count that minimises its time."""
        if not seq_ids:
            return []
        cost, lengths = self.cost, batch.lengths
        cap = cost.max_tokens(degree, 1.0)
        work = {i: float(cost.work(lengths[i], batch.units[i])) for i in seq_ids}
        items = sorted(seq_ids, key=lambda i: -work[i])
        floor = self._floor(items, batch, degree)
        best, best_time = None, math.inf
        for m in range(max(1, math.ceil(sum(lengths[i] for i in items) / cap)), len(items) + 1):
            if floor + m * cost.g >= best_time:
                break
            bins = balance_under_cap(items, lengths, work, m, cap)
            if bins is None:
                continue
            mbs = [MicroBatch(b, cost.min_recompute(sum(lengths[i] for i in b), degree)) for b in bins]
            total = sum(mb_time(mb, batch, degree, cost) for mb in mbs)
            if total < best_time:
                best, best_time = mbs, total
            if total <= floor + m * cost.g + 1e-12:
                break  # every micro-batch at its least possible level: more can only add g
        assert best is not None
        return best

    def _floor(self, items: list[int], batch: SampleBatch, degree: int) -> float:
        """Replica time without g that no count can beat: work, all-to-alls, forced recomputation."""
        cost = self.cost
        s = np.asarray([batch.lengths[i] for i in items], dtype=np.float64)
        forced = np.array([cost.min_recompute(int(x), degree) for x in s])
        compute = float(cost.work(s, batch.units[items], forced).sum()) / degree
        return compute + cost.comm(float(s.sum()), degree)


def first_fit_decreasing(times: np.ndarray, capacity: float) -> list[float]:
    """Loads of bins of `capacity` seconds filled first-fit decreasing (an item over it is alone)."""
    loads: list[float] = []
    for t in sorted(times.tolist(), reverse=True):
        k = next((k for k, load in enumerate(loads) if load + t <= capacity), None)
        if k is None:
            loads.append(t)
        else:
            loads[k] += t
    return loads


def balance_under_cap(items: list[int], lengths: Sequence[int], work: Mapping[int, float], m: int,
                      cap: int) -> list[list[int]] | None:
    """`items` (heaviest first) into m micro-batches by least `work` (seconds per sequence id)
    with room for `lengths` tokens under `cap`; None if some sequence finds no micro-batch with
    room."""
    heap = [(0.0, k) for k in range(m)]
    bins: list[list[int]] = [[] for _ in range(m)]
    tokens = [0] * m
    for i in items:
        s = lengths[i]
        skipped = []
        while heap and tokens[heap[0][1]] + s > cap:
            skipped.append(heapq.heappop(heap))
        if not heap:
            return None
        load, k = heapq.heappop(heap)
        bins[k].append(i)
        tokens[k] += s
        heapq.heappush(heap, (load + work[i], k))
        for entry in skipped:
            heapq.heappush(heap, entry)
    return [bin_ for bin_ in bins if bin_]
