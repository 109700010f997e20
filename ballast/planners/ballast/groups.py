"""Inside a group of the `ballast` planner: micro-batches, recompute levels, exact repair.

Within a group, compute and all-to-all time do not depend on how its sequences are packed;
only the fixed cost g per micro-batch and recomputation do. `GroupPacker.pack` searches the
micro-batch count, `repair` moves single sequences between groups by exact times. Under a
pipeline of p stages a group's time is its micro-batches' through it (`pipelines.py`: a
bubble of p - 1 longest micro-batches), so more micro-batches, each shorter, may win; `pack`
tries counts up to one sequence per micro-batch and runs them in `pipeline_order`.
"""
from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence

import numpy as np

from ...pricing.cost import CostModel
from ...pricing.micro_batch import MicroBatchPrices
from ...plans.pass_times import gathered_seconds
from ...plans.plan import Group, MicroBatch
from ...vocabulary.samples import SampleBatch
from ..packing import best_fit_decreasing
from ..pipelines import pipeline_order, pipelined_seconds

# Micro-batch counts tried per group: a geometric ladder of this many between the fewest that
# memory allows and the count with no recomputation, then this many either side of the best.
LADDER = 6
REFINE = 2
# Receivers each exact repair move tries (the least loaded groups).
REPAIR_RECEIVERS = 4
# Bins from which `timed` prices a packing as arrays: below it a Python call per bin is cheaper
# than numpy's per-call overhead.
MANY_BINS = 24


class GroupPacker:
    """Exact micro-batch packing and timing for the samples of one batch. Memory, and so
    packing, follows tokens; time follows tokens and attention units."""

    def __init__(self, cost: CostModel, batch: SampleBatch, work: np.ndarray, quad: np.ndarray,
                 row: dict[int, int]):
        self.cost = cost
        self.lengths = batch.lengths
        self.units = batch.units.tolist()
        self.work = work
        """[degree row, sequence]: time alone at that degree (inf where it does not fit)."""
        self.quad = quad
        """a q + b s of every sample (q its attention units, s its tokens)."""
        self.row = row
        """Row of `work` for each degree."""
        self.stages = cost.stages.count if cost.stages is not None else 1
        """p: the pipeline's stages every group runs its micro-batches through (1: none)."""
        self._bins: dict[tuple, list[tuple[tuple[int, ...], int]]] = {}
        """LPT's bins by (sequences, count, balanced on tokens), `_lpt`."""

    def repair(self, groups: list[Group], times: list[float]) -> int | None:
        """Move one sequence off the slowest group, judged by exact times: the donor's index,
        or None if no move helps.

        Moves are incremental (the sequence leaves its micro-batch, joins the receiver's
        lightest one or a new one, each at its least recompute level), so a repair costs
        O(sequences x receivers) micro-batch evaluations instead of repacking whole groups.
        """
        slow = int(np.argmax(times))
        donor = groups[slow]
        receivers = sorted((j for j in range(len(groups)) if j != slow), key=lambda j: times[j])[:REPAIR_RECEIVERS]
        for m, mb in enumerate(donor.micro_batches):
            for s in mb.seq_ids:
                for j in receivers:
                    d, cp = groups[j].degree, groups[j].cp
                    # Adding s costs the receiver at least its compute and all-to-all there.
                    if (not np.isfinite(self.work[self.row[d], s])
                            or times[j] + self.quad[s] / d + self.cost.comm(self.lengths[s], d, cp) >= times[slow]):
                        continue
                    joined, added = self.with_sequence(groups[j].micro_batches, s, d, cp)
                    if self.stages > 1:
                        added = self.mbs_time(joined, d, cp) - times[j]
                    if times[j] + added >= times[slow]:
                        continue
                    left, saved = self.without_sequence(donor.micro_batches, m, s, donor.degree, donor.cp)
                    if self.stages > 1:
                        saved = times[slow] - self.mbs_time(left, donor.degree, donor.cp)
                    if saved > 0:
                        groups[j].micro_batches, times[j] = joined, times[j] + added
                        donor.micro_batches, times[slow] = left, times[slow] - saved
                        return slow
        return None

    def repack(self, group: Group, time: float) -> float:
        """Pack a group afresh if that is faster (moves only ever take sequences out of their
        micro-batches, so a donor may keep more micro-batches than its rest needs); its time."""
        packed_time, packed, cp = self.pack([s for mb in group.micro_batches for s in mb.seq_ids], group.degree)
        if packed_time < time:
            group.micro_batches, group.cp = packed, cp
            return packed_time
        return time

    def with_sequence(self, mbs: list[MicroBatch], s: int, degree: int, cp: int
                      ) -> tuple[list[MicroBatch], float]:
        """`mbs` (a group of `degree` split `cp`) with sequence s added to the micro-batch of
        fewest tokens, or alone if faster, and the time that adds."""
        single = MicroBatch([s], self.cost.min_recompute(self.lengths[s], degree, cp))
        best = (mbs + [single], self.mb_time(single, degree, cp))
        if mbs:
            i = min(range(len(mbs)), key=lambda i: sum(self.lengths[x] for x in mbs[i].seq_ids))
            ids = mbs[i].seq_ids + [s]
            level = self.cost.min_recompute(sum(self.lengths[x] for x in ids), degree, cp)
            if level is not None:
                merged = MicroBatch(ids, level)
                added = self.mb_time(merged, degree, cp) - self.mb_time(mbs[i], degree, cp)
                if added < best[1]:
                    best = (mbs[:i] + [merged] + mbs[i + 1:], added)
        return best

    def without_sequence(self, mbs: list[MicroBatch], m: int, s: int, degree: int, cp: int
                          ) -> tuple[list[MicroBatch], float]:
        """`mbs` with sequence s taken out of micro-batch m (dropped if it empties), and the
        time that saves."""
        ids = [x for x in mbs[m].seq_ids if x != s]
        before = self.mb_time(mbs[m], degree, cp)
        if not ids:
            return mbs[:m] + mbs[m + 1:], before
        rest = MicroBatch(ids, self.cost.min_recompute(sum(self.lengths[x] for x in ids), degree, cp))
        return mbs[:m] + [rest] + mbs[m + 1:], before - self.mb_time(rest, degree, cp)

    def pack(self, seqs: list[int], degree: int) -> tuple[float, list[MicroBatch], int]:
        """The split (cp), micro-batch count and recompute levels of least time for these
        sequences in a group of `degree`: the time, the micro-batches (in a pipeline's order) and
        the split."""
        time, mbs, cp = min(((*self.pack_at(seqs, degree, cp), cp) for cp in self.cost.fastest_candidates(degree)),
                            key=lambda p: p[0])
        return time, self.ordered(mbs, degree, cp), cp

    def ordered(self, mbs: list[MicroBatch], degree: int, cp: int) -> list[MicroBatch]:
        """`mbs` in the order a pipeline runs them best (`pipeline_order`); as they are without one."""
        if self.stages == 1:
            return mbs
        return [mbs[i] for i in pipeline_order([self.mb_time(mb, degree, cp) for mb in mbs])]

    def pack_at(self, seqs: list[int], degree: int, cp: int) -> tuple[float, list[MicroBatch]]:
        """`pack` at split `cp`: the time and the micro-batches."""
        if not seqs:
            return 0.0, []
        lengths = self.lengths
        seqs = sorted(seqs, key=lambda s: -lengths[s])
        tokens = sum(lengths[s] for s in seqs)
        fewest = max(1, math.ceil(tokens / self.cost.max_tokens(degree, 1.0, cp)))
        cap = self.cost.max_tokens(degree, 0.0, cp)
        # Sequences do not split, so token balance alone may recompute at any count: bins of
        # `cap` tokens (best-fit decreasing) are the fewest micro-batches with no recomputation.
        # A budget may hold no token at all without recomputation (cap 0): then no count avoids
        # it, and one sequence per micro-batch is the most there is to try.
        unchecked = self.bins(seqs, degree, cp, cap) if lengths[seqs[0]] <= cap else []
        no_recompute = max(fewest, math.ceil(tokens / cap), len(unchecked)) if cap else len(seqs)
        # A pipeline's bubble shrinks with its micro-batches' (`pipelined_seconds`: the longest),
        # down to the longest sequence's: counts up to twice the tokens over its tokens, where
        # token balance has made every micro-batch that short.
        most = max(no_recompute, math.ceil(2 * tokens / lengths[seqs[0]])) if self.stages > 1 else no_recompute
        # Time against the count is roughly convex (g grows, recomputation shrinks): try the
        # ends, a geometric ladder between them, then the neighbours of the best.
        top = max(fewest, min(most, len(seqs)))
        ratio = (top / fewest) ** (1.0 / (LADDER - 1))
        ladder = {fewest, top, *(round(fewest * ratio ** i) for i in range(1, LADDER - 1))}
        least = self._least(seqs, degree, cp)
        timed = self._ladder(seqs, degree, cp, ladder, top, least)
        # Token balance is no bin packing: LPT may need a micro-batch more than memory does
        # (1633 tokens in bins of 860 fit as 803 + 830, not as LPT's 902 + 731), which costs g.
        # Bins of what fits under full recomputation are near the fewest memory allows.
        crammed = self.bins(seqs, degree, cp, self.cost.max_tokens(degree, 1.0, cp))
        bar = min((v[0] for v in timed.values() if v), default=math.inf)
        for key, mbs in ((-1, unchecked), (-2, crammed)):
            if mbs and least(len(mbs)) <= bar:
                timed[key] = (self.mbs_time(mbs, degree, cp), mbs)
        best = min(filter(None, timed.values()), key=lambda v: v[0], default=None)
        if best is not None:
            centre = len(best[1])
            for m in range(max(fewest, centre - REFINE), min(top, centre + REFINE) + 1):
                if (m not in timed and least(m) <= best[0]
                        and (candidate := self.timed(seqs, degree, cp, m)) and candidate[0] < best[0]):
                    best = candidate
            # A pipeline stalls behind its longest micro-batch: the best count balanced on work
            # (WLB-LLM's equal cost per micro-batch) rather than tokens, where memory allows.
            if self.stages > 1 and (weighted := self.timed(seqs, degree, cp, len(best[1]), self.quad)):
                best = min(best, weighted, key=lambda v: v[0])
        if best is None:
            # One sequence per micro-batch always fits: the last resort if balancing cannot.
            alone = self.timed(seqs, degree, cp, len(seqs))
            assert alone is not None, f"sequences {seqs[:5]} fit no packing at degree {degree}"
            return alone
        return best

    def _ladder(self, seqs: list[int], degree: int, cp: int, ladder: set[int], top: int,
                least: Callable[[int], float]) -> dict[int, tuple[float, list[MicroBatch]] | None]:
        """`timed` at every count of `ladder` (None where none fits, or where `least`, `_least`'s
        bound, shows it cannot beat a count timed before it), `top` first: under a pipeline the counts below its
        knee cost a bubble that the top count's time already beats, and each timing is an LPT
        over the group's sequences. In the ladder's order, as `pack_at`'s ties resolve by it."""
        first = self.timed(seqs, degree, cp, top)
        bar = first[0] if first else math.inf
        timed = {}
        for m in ladder:
            if m == top:
                timed[m] = first
            else:
                timed[m] = found = None if least(m) > bar else self.timed(seqs, degree, cp, m)
                bar = min(bar, found[0]) if found else bar
        return timed

    def _least(self, seqs: list[int], degree: int, cp: int) -> Callable[[int], float]:
        """A lower bound on `_total` of any `count` micro-batches of these sequences (a function
        of the count): every micro-batch pays its fixed seconds at least, their variable seconds
        sum to the sequences' at level 0 at least, and through a pipeline the longest is at least
        their mean and at least the first sequence's alone. Shaved by a relative 1e-9 so that
        the floats' rounding of the sums it stands for never lets it exceed one. None bounds
        FSDP2's gathered passes here (-inf): they are no sum of per-sequence seconds."""
        if self.cost.data_parallel.forward_gathers:
            return lambda count: -math.inf
        prices = self.cost.micro_batch_prices(degree, cp)
        fixed = prices.fixed_part()
        units = sum(map(self.units.__getitem__, seqs))
        tokens = sum(map(self.lengths.__getitem__, seqs))
        variable = prices.seconds(units, tokens, 0.0, len(seqs)) - fixed
        first = prices.seconds(self.units[seqs[0]], self.lengths[seqs[0]], 0.0, 1)
        bubble = self.stages - 1

        def least(count: int) -> float:
            longest = max(variable / count + fixed, first)
            return (variable + count * fixed + bubble * longest) * (1.0 - 1e-9)
        return least

    def bins(self, seqs: list[int], degree: int, cp: int, capacity: int) -> list[MicroBatch]:
        """Best-fit-decreasing bins of at most `capacity` tokens, each at its least recompute level."""
        return [MicroBatch(b, self.cost.min_recompute(sum(self.lengths[s] for s in b), degree, cp))
                for b in best_fit_decreasing(seqs, self.lengths, capacity)]

    def timed(self, longest_first: list[int], degree: int, cp: int, count: int,
              weights: Sequence[float] | None = None) -> tuple[float, list[MicroBatch]] | None:
        """`count` micro-batches balanced by LPT on `weights` (None: tokens) at their least
        recompute levels, and the group's seconds for them (`mbs_time`); None if one cannot fit."""
        prices = self.cost.micro_batch_prices(degree, cp)
        bins = self._lpt(tuple(longest_first), count, weights)
        if len(bins) >= MANY_BINS and not self.cost.data_parallel.forward_gathers:
            return self._timed_at_once(prices, bins)
        mbs, seconds = [], []
        for ids, tokens, units in bins:
            level = prices.min_recompute(tokens)
            if level is None:
                return None
            mbs.append(MicroBatch(list(ids), level))
            seconds.append(self._seconds(prices, units, tokens, level, len(ids)))
        return self._total(seconds), mbs

    def _timed_at_once(self, prices: MicroBatchPrices, bins: list[tuple[tuple[int, ...], int, float]]
                       ) -> tuple[float, list[MicroBatch]] | None:
        """`timed`'s levels and seconds of many bins as arrays: the same floats (the prices' array
        forms keep every operation's order), without a Python call per bin."""
        sizes = [n for _, n, _ in bins]
        # A bin's level grows with its tokens: all fit when the largest does (the loop's None
        # without an array where it does not).
        if prices.min_recompute(max(sizes)) is None:
            return None
        tokens = np.array(sizes, dtype=np.float64)
        levels = prices.min_recompute_of_many(tokens)
        units = np.array([u for _, _, u in bins], dtype=np.float64)
        samples = np.array([len(ids) for ids, _, _ in bins], dtype=np.float64)
        seconds = prices.seconds(units, tokens, levels, samples).tolist()
        return self._total(seconds), [MicroBatch(list(ids), level) for (ids, _, _), level in zip(bins, levels.tolist())]

    def _lpt(self, longest_first: tuple[int, ...], count: int, weights: Sequence[float] | None
             ) -> list[tuple[tuple[int, ...], int, float]]:
        """LPT's non-empty bins of `longest_first` into `count` by `weights` (None: tokens), each
        with its tokens and attention units; kept for the packer's life, since every split of a
        degree packs the same sequences into the same bins (only their levels and times differ)."""
        key = (longest_first, count, weights is None)
        if key not in self._bins:
            weights = self.lengths if weights is None else weights
            lengths, units = self.lengths, self.units
            # The first `count` sequences open one bin each, in bin order, as the heap would place
            # them while their weights are positive (always for tokens); a heap of (load, bin)
            # pops the same bins whatever its internal order, ties by bin.
            first = longest_first[:count] if all(weights[s] > 0 for s in longest_first[:count]) else ()
            opened = len(first)
            bins = [[s] for s in first] + [[] for _ in range(count - opened)]
            tokens = [lengths[s] for s in first] + [0] * (count - opened)
            summed = [units[s] for s in first] + [0] * (count - opened)
            heap = [(weights[s], b) for b, s in enumerate(first)] + [(0, b) for b in range(opened, count)]
            heapq.heapify(heap)
            replace = heapq.heapreplace
            for s in longest_first[opened:]:
                load, b = heap[0]
                bins[b].append(s)
                tokens[b] += lengths[s]
                summed[b] += units[s]
                replace(heap, (load + weights[s], b))
            self._bins[key] = [(tuple(b), n, u) for b, n, u in zip(bins, tokens, summed) if b]
        return self._bins[key]

    def mb_time(self, mb: MicroBatch, degree: int, cp: int) -> float:
        """A micro-batch's seconds, with FSDP2's gathers where they outlast its passes
        (`DataParallelPrices.passes`): under FSDP2 a count that makes short passes pays for it."""
        # Sums through map over lists: the packer times tens of thousands of micro-batches per
        # plan. A text sample's units are integers in float64, summed exactly below 2^53.
        units = sum(map(self.units.__getitem__, mb.seq_ids))
        tokens = sum(map(self.lengths.__getitem__, mb.seq_ids))
        return self._seconds(self.cost.micro_batch_prices(degree, cp), units, tokens, mb.recompute, len(mb.seq_ids))

    def _seconds(self, prices: MicroBatchPrices, units: float, tokens: int, level: float, samples: int) -> float:
        """`mb_time` from a micro-batch's sums of attention units and tokens and its count of
        samples at `level`."""
        seconds = prices.seconds(units, tokens, level, samples)
        if not self.cost.data_parallel.forward_gathers:
            return seconds
        plain = prices.seconds(units, tokens, 0.0, samples) if level else seconds
        return gathered_seconds(self.cost.data_parallel, seconds, plain)

    def _total(self, seconds: list[float]) -> float:
        """A group's seconds for micro-batches of these seconds (`mbs_time`)."""
        return sum(seconds) if self.stages == 1 else pipelined_seconds(seconds, self.stages)

    def mbs_time(self, mbs: list[MicroBatch], degree: int, cp: int) -> float:
        """A group's seconds for `mbs`: their sum, through the pipeline where there is one
        (`pipelined_seconds`)."""
        return self._total([self.mb_time(mb, degree, cp) for mb in mbs])

