"""`ballast`: ballast's own planner. Degree, placement, accumulation and checkpointing, jointly.

A wave lasts as long as its slowest group; a group's time is the sum of its micro-batches.
Inside a group, compute and all-to-all time do not depend on how the sequences are packed:
only the fixed cost g per micro-batch and the recomputation of checkpointed layers do, and
memory decides between them. The planner therefore sees a group's time as

    est = sum_s (a s^2 + b s) / d + comm(tokens, d) + F(tokens / d)
    F(x) = g + (x - cap)+ min(r rho / (1 - k), g / cap)

where cap is what fits a device without checkpointing and rho the group's compute per token:
beyond cap a group either recomputes (r rho per token, at the least level that fits) or
opens another micro-batch (g), whichever is cheaper. The same F makes the cost model's lower
bound tight. For a makespan target T the planner builds a wave in four moves:

1. **Degree per sequence.** Each sequence takes the degree of least area (devices x seconds)
   among those that finish it alone within T, so short sequences stay at degree 1 and a
   sequence grows its degree only as far as T demands: Zeppelin's crossovers, per step.
2. **Groups in proportion to work.** Each degree class gets ranks in proportion to its area
   (whole groups, at least one per non-empty class, spare ranks to the most loaded class);
   blocks are laid out largest first, so every block is aligned and stays inside a node
   unless its degree is wider. Groups of different degrees share the wave (FlexSP), each
   with its own accumulation count (DCP-inter).
3. **Earliest-finish assignment, then local search.** Longest first, each sequence goes to
   the group whose `est` grows least (Hydraulis balances replicas by quadratic time; here the
   memory overhead is in the balance too); then sequences move off the slowest group while
   that shortens the wave.
4. **Micro-batches and checkpoint levels.** Each group tries every micro-batch count from
   the fewest memory allows up to the count at which nothing is checkpointed, packs its
   sequences token-balanced, gives each micro-batch the least checkpoint level that fits
   (DCP-intra, per micro-batch), and keeps the fastest count.

Targets T from the lower bound up to "least area everywhere" are all tried; the two best
estimated waves are packed exactly and the faster kept. A sequence so long that it needs
most of the cluster is also tried in a wave of its own ahead of the rest. Every candidate is
a valid plan and the fastest under the cost model wins.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from ..cost import CostModel
from ..plan import Group, MicroBatch, Plan, Wave, fill_idle
from ..simulate import step_time
from . import register
from .base import Planner
from .packing import pad_lockstep

# Makespan targets tried, as multiples of the batch's lower bound; inf = least area everywhere.
TARGETS = (0.15, 0.25, 0.35, 0.5, 0.65, 0.8, 0.9, 1.0, 1.05, 1.12, 1.2, 1.35, 1.6, 2.0, 3.0, math.inf)
# Head sizes (longest sequences in a wave of their own) built fully.
HEAD_CANDIDATES = 2
HEAD_SIZES = (1, 2, 4, 8)
# Sequence placements per wave spent on assigning candidate layouts (best proxy first), and
# the fewest layouts assigned whatever the batch size; the rest are judged by their proxy.
PLACEMENT_BUDGET = 2048
MIN_ASSIGNED = 5
# Candidate waves packed exactly (the rest are judged by their estimate).
EXACT_CANDIDATES = 2
# Micro-batch counts tried per group: a geometric ladder of this many between the fewest that
# memory allows and the count with no checkpointing, then this many either side of the best.
LADDER = 6
REFINE = 2
# Exact-repair moves per candidate wave (a count, not a clock, so plans are reproducible),
# and receivers each move tries.
REPAIR_MOVES = 24
REPAIR_RECEIVERS = 4
# Local-search moves per group, so planning time stays linear in the cluster size.
MOVES_PER_GROUP = 2


class _Loads:
    """Estimated times of a wave's groups (the module docstring's `est`), updated per sequence.

    Besides F, a sequence longer than `cap` tokens per device must recompute its own excess
    whatever the micro-batch count (it cannot be split); that forced part is tracked per group
    and the larger of the two overheads charged.
    """

    def __init__(self, cost: CostModel, degrees: np.ndarray):
        self.cost, self.deg = cost, degrees.astype(np.float64)
        self.comm_per_token = np.array([0.0 if d == 1 else cost.bytes_per_token / (d * cost.bandwidth[d])
                                        for d in degrees])
        self.cap = (cost.device_memory - cost.states) / cost.act_per_token
        self.recompute_rate = cost.recompute / (1.0 - cost.kept)
        self.quad = np.zeros(len(degrees))      # sum of a s^2 + b s
        self.tokens = np.zeros(len(degrees))
        self.forced = np.zeros(len(degrees))    # recomputation no packing avoids

    def estimate(self, quad: np.ndarray, tokens: np.ndarray, forced: np.ndarray,
                 rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        cost, deg = self.cost, self.deg[rows]
        per_token = np.divide(quad, tokens, out=np.zeros_like(quad), where=tokens > 0)
        slope = np.minimum(self.recompute_rate * per_token, cost.g / self.cap)
        over = cost.g + np.maximum(forced, np.maximum(0.0, tokens / deg - self.cap) * slope)
        t = quad / deg + tokens * self.comm_per_token[rows] + over
        return np.where(tokens > 0, t, 0.0)

    def current(self) -> np.ndarray:
        return self.estimate(self.quad, self.tokens, self.forced)

    def terms(self, length, deg):
        """(a s^2 + b s, forced recomputation) of sequences of `length` at degrees `deg`."""
        cost = self.cost
        forced = np.maximum(0.0, length / deg - self.cap) * self.recompute_rate * (cost.a * length + cost.b)
        return cost.a * length * length + cost.b * length, forced

    def with_added(self, length: float) -> np.ndarray:
        quad, forced = self.terms(length, self.deg)
        return self.estimate(self.quad + quad, self.tokens + length, self.forced + forced)

    def without(self, j: int, length: float) -> float:
        quad, forced = self.terms(length, self.deg[j])
        rows = slice(j, j + 1)
        return float(self.estimate(self.quad[rows] - quad, self.tokens[rows] - length,
                                   self.forced[rows] - forced, rows)[0])

    def one(self, j: int, length: float) -> float:
        """estimate() of group j with a sequence added, in scalar arithmetic (the hot path)."""
        cost, deg = self.cost, float(self.deg[j])
        quad = float(self.quad[j]) + cost.a * length * length + cost.b * length
        tokens = float(self.tokens[j]) + length
        forced = float(self.forced[j])
        if length > deg * self.cap:
            forced += (length / deg - self.cap) * self.recompute_rate * (cost.a * length + cost.b)
        slope = min(self.recompute_rate * quad / tokens, cost.g / self.cap)
        over = cost.g + max(forced, max(0.0, tokens / deg - self.cap) * slope)
        return quad / deg + tokens * float(self.comm_per_token[j]) + over

    def move(self, j: int, length: float, sign: int = 1) -> None:
        cost, deg = self.cost, float(self.deg[j])
        self.quad[j] += sign * (cost.a * length * length + cost.b * length)
        self.tokens[j] += sign * length
        if length > deg * self.cap:
            self.forced[j] += sign * (length / deg - self.cap) * self.recompute_rate * (cost.a * length + cost.b)


@register
class BallastPlanner(Planner):
    name = "ballast"

    def _plan(self, lengths: list[int]) -> Plan:
        self._lengths = np.asarray(lengths, dtype=np.int64)
        s = self._lengths.astype(np.float64)
        self._length_list = [int(x) for x in lengths]
        self._quad = self.cost.a * s * s + self.cost.b * s
        self._deg = np.asarray(self.cost.degrees)
        self._row = {int(d): i for i, d in enumerate(self._deg)}
        # [degree index, sequence]: alone at that degree, least checkpointing, without g.
        self._work = self.cost.sequence_times(lengths)
        order = np.argsort(-np.min(self._work, axis=0), kind="stable")
        # Head sizes are compared by their layouts' proxies; only the best are built fully.
        options = []
        for head in self._head_sizes(order):
            parts = [order[:head], order[head:]] if head else [order]
            layouts = [self._layouts(part) for part in parts]
            score = sum(found[0][0] if found else math.inf for found in layouts)
            options.append((score, head, parts, layouts))
        # One wave (head 0) is always built; other head sizes only if their proxies promise.
        options = options[:1] + sorted(options[1:], key=lambda option: option[0])[:HEAD_CANDIDATES - 1]
        best: tuple[float, list[Wave]] | None = None
        for _, _, parts, layouts in options:
            waves = [wave for part, found in zip(parts, layouts)
                     for wave in ([self._finish(part, found)] if found else self._waves(part))]
            t = step_time(Plan(lengths, waves), self.cost)
            if best is None or t < best[0]:
                best = (t, waves)
        waves = best[1]
        if self.options.lockstep:
            waves = [pad_lockstep(wave, lengths, self.cost) for wave in waves]
        return Plan(lengths, waves, lockstep=self.options.lockstep)

    # --- candidates ---------------------------------------------------------------------------
    def _head_sizes(self, order: np.ndarray) -> list[int]:
        """How many of the longest sequences to try in a wave of their own (0 = none)."""
        fastest = np.min(self._work, axis=0)
        area = np.min(self._work * self._deg[:, None], axis=0).sum() / self.cluster.world_size
        # Only worth a wave when the k-th longest alone takes a large part of the step.
        return [0] + [k for k in HEAD_SIZES if k < len(order) and fastest[order[k - 1]] > 0.25 * area]

    def _waves(self, ids: np.ndarray) -> list[Wave]:
        """The best single wave for `ids`, or, if none holds them all, the longest alone first."""
        if len(ids) == 0:
            return []
        layouts = self._layouts(ids)
        if layouts:
            return [self._finish(ids, layouts)]
        assert len(ids) > 1, "a single sequence that fits some degree always makes a wave"
        return self._waves(ids[:1]) + self._waves(ids[1:])

    def _layouts(self, ids: np.ndarray) -> list[tuple[float, list[int]]]:
        """Distinct group layouts for `ids`, one per makespan target, best proxy first."""
        lower = self.cost.lower_bound(self._lengths[ids].tolist())
        choices = []
        for factor in TARGETS:
            # Narrow the widest degree until every class gets ranks: a sequence that would
            # take the whole cluster at its best degree then runs slower beside the others.
            width, layout = self.cluster.world_size, None
            while width >= 1 and layout is None:
                choice = self._degrees(ids, lower * factor, width)
                layout = None if choice is None else self._allocate(ids, choice)
                width //= 2
            choices.append((choice, layout))
        # Uniform layouts too: one degree for all. Wide groups holding many sequences balance
        # by fine grain and need no checkpointing, which wins where all-to-alls are cheap.
        for row in np.nonzero(np.isfinite(self._work[:, ids]).all(axis=1))[0]:
            choice = np.full(len(ids), row)
            choices.append((choice, self._allocate(ids, choice)))
        layouts, seen = [], set()
        for choice, layout in choices:
            if layout is None or (key := (choice.tobytes(), tuple(layout))) in seen:
                continue
            seen.add(key)
            layouts.append((self._proxy(ids, choice, layout), layout))
        return sorted(layouts, key=lambda c: c[0])

    def _finish(self, ids: np.ndarray, layouts: list[tuple[float, list[int]]]) -> Wave:
        """Assign, balance and pack the most promising layouts; the fastest wave."""
        # Assigning is linear in the batch: small batches afford every layout, large ones the best.
        assigned = max(MIN_ASSIGNED, PLACEMENT_BUDGET // len(ids))
        candidates = [self._assign(ids, layout) for _, layout in layouts[:assigned]]
        candidates.sort(key=lambda c: c[0].current().max())
        best: tuple[float, list[Group]] | None = None
        for loads, layout, members in candidates[:EXACT_CANDIDATES]:
            self._improve(loads, members, np.searchsorted(self._deg, layout))
            groups, start = [], 0
            for d, seqs in zip(layout, members):
                groups.append(Group(start, d, self._pack(seqs, d)))
                start += d
            times = [self._mbs_time(g.micro_batches, g.degree) for g in groups]
            for _ in range(REPAIR_MOVES):
                if not self._repair(groups, times):
                    break
            if best is None or max(times) < best[0]:
                best = (max(times), groups)
        return Wave(fill_idle([g for g in best[1] if g.micro_batches], self.cluster.world_size))

    # --- one candidate wave -------------------------------------------------------------------
    def _degrees(self, ids: np.ndarray, target: float, width: int) -> np.ndarray | None:
        """Degree index per sequence: least area within `target`, degrees <= `width`."""
        deg = self._deg
        work = np.where((deg <= width)[:, None], self._work[:, ids], np.inf)
        if not np.isfinite(work).any(axis=0).all():
            return None
        area = work * deg[:, None]
        within = work + self.cost.g <= target
        choice = np.argmin(np.where(within, area, np.inf), axis=0)
        alone = ~within.any(axis=0)
        choice[alone] = np.argmin(work[:, alone], axis=0)
        return choice

    def _proxy(self, ids: np.ndarray, choice: np.ndarray, layout: list[int]) -> float:
        """The wave's time if every class spread its sequences evenly over its groups."""
        rows = np.searchsorted(self._deg, layout)
        groups = np.bincount(rows, minlength=len(self._deg))
        quad = np.bincount(choice, weights=self._quad[ids], minlength=len(self._deg))
        tokens = np.bincount(choice, weights=self._lengths[ids], minlength=len(self._deg))
        used = groups > 0
        loads = _Loads(self.cost, self._deg[used])
        s = self._lengths[ids].astype(np.float64)
        _, forced = loads.terms(s, self._deg[choice])
        forced = np.bincount(choice, weights=forced, minlength=len(self._deg))
        spread = loads.estimate(quad[used] / groups[used], tokens[used] / groups[used],
                                forced[used] / groups[used])
        alone = self._work[choice, ids].max() + self.cost.g
        return max(float(spread.max()), float(alone))

    def _assign(self, ids: np.ndarray, layout: list[int]) -> tuple[_Loads, list[int], list[list[int]]]:
        """Longest first, each sequence to the group whose estimated time grows least.

        Only the least-loaded group of each degree can be the best (within a degree the
        estimate grows with the load), so one heap per degree keeps each placement at
        O(degrees x log groups), linear in the batch for thousands of sequences.
        """
        loads = _Loads(self.cost, np.asarray(layout))
        members: list[list[int]] = [[] for _ in layout]
        heaps: dict[int, list[tuple[float, int]]] = {}
        for j, d in enumerate(layout):
            heaps.setdefault(self._row[d], []).append((0.0, j))
        by_row = sorted(heaps.items())
        # Feasibility is monotone in the degree: the first row where a sequence fits memory.
        first_row = np.argmax(np.isfinite(self._work[:, ids]), axis=0).tolist()
        for s, n, fits_from in zip(ids.tolist(), self._lengths[ids].astype(float).tolist(), first_row):
            best = (math.inf, -1, -1)
            for row, heap in by_row:
                if row >= fits_from:
                    j = heap[0][1]
                    grown = loads.one(j, n)
                    if grown < best[0]:
                        best = (grown, j, row)
            grown, j, row = best
            assert j >= 0, f"sequence {s} fits no group of the layout"
            loads.move(j, n)
            members[j].append(s)
            heapq.heapreplace(heaps[row], (grown, j))
        return loads, layout, members

    def _allocate(self, ids: np.ndarray, choice: np.ndarray) -> list[int] | None:
        """Degrees of the wave's groups, largest first; None if the classes cannot all fit."""
        n, deg = self.cluster.world_size, self._deg
        areas = self._work[choice, ids] * deg[choice]
        class_area = np.bincount(choice, weights=areas, minlength=len(deg))
        members = np.bincount(choice, minlength=len(deg))
        per_rank = class_area.sum() / n
        groups = np.zeros(len(deg), dtype=np.int64)
        for i in np.nonzero(members)[0]:
            ideal = class_area[i] / (per_rank * deg[i]) if per_rank > 0 else 1
            groups[i] = min(members[i], max(1, int(ideal)))
        # Rounding small classes up to one group can overflow: take groups back from the
        # class whose groups stay least loaded without one.
        while (groups * deg).sum() > n:
            shrinkable = [i for i in np.nonzero(groups > 1)[0]]
            if not shrinkable:
                return None
            i = min(shrinkable, key=lambda i: class_area[i] / (groups[i] - 1))
            groups[i] -= 1
        spare = n - int((groups * deg).sum())
        # Spare ranks go, a group at a time, to the class whose groups are most loaded.
        heap = [(-class_area[i] / groups[i], i) for i in np.nonzero(groups)[0]]
        heapq.heapify(heap)
        while heap and spare:
            _, i = heapq.heappop(heap)
            if deg[i] > spare or groups[i] >= members[i]:
                continue
            groups[i] += 1
            spare -= deg[i]
            heapq.heappush(heap, (-class_area[i] / groups[i], i))
        return [int(deg[i]) for i in reversed(range(len(deg))) for _ in range(groups[i])]

    def _improve(self, loads: _Loads, members: list[list[int]], rows: np.ndarray) -> None:
        """Move the sequence off the slowest group that shortens the wave most, while one does."""
        for _ in range(MOVES_PER_GROUP * len(members)):
            times = loads.current()
            slow = int(np.argmax(times))
            best = (times[slow], -1, -1)
            for s in members[slow]:
                n = float(self._lengths[s])
                left = loads.without(slow, n)
                grown = np.where(np.isfinite(self._work[rows, s]), loads.with_added(n), np.inf)
                grown[slow] = np.inf
                j = int(np.argmin(grown))
                after = max(left, grown[j])
                if after < best[0] - 1e-12:
                    best = (after, s, j)
            if best[1] < 0:
                return
            _, s, j = best
            members[slow].remove(s)
            members[j].append(s)
            loads.move(slow, float(self._lengths[s]), -1)
            loads.move(j, float(self._lengths[s]))

    def _repair(self, groups: list[Group], times: list[float]) -> bool:
        """Move one sequence off the slowest group, judged by exact times; False if none helps.

        Moves are incremental (the sequence leaves its micro-batch, joins the receiver's
        lightest one or a new one, each at its least checkpoint level), so a repair costs
        O(sequences x receivers) micro-batch evaluations instead of repacking whole groups.
        """
        slow = int(np.argmax(times))
        donor = groups[slow]
        receivers = sorted((j for j in range(len(groups)) if j != slow), key=lambda j: times[j])[:REPAIR_RECEIVERS]
        for m, mb in enumerate(donor.micro_batches):
            for s in mb.seq_ids:
                for j in receivers:
                    d = groups[j].degree
                    # Adding s costs the receiver at least its compute and all-to-all there.
                    if (not np.isfinite(self._work[self._row[d], s])
                            or times[j] + self._quad[s] / d + self.cost.comm(self._length_list[s], d) >= times[slow]):
                        continue
                    joined, added = self._with_sequence(groups[j].micro_batches, s, d)
                    if times[j] + added >= times[slow]:
                        continue
                    left, saved = self._without_sequence(donor.micro_batches, m, s, donor.degree)
                    if saved > 0:
                        groups[j].micro_batches, times[j] = joined, times[j] + added
                        donor.micro_batches, times[slow] = left, times[slow] - saved
                        return True
        return False

    def _with_sequence(self, mbs: list[MicroBatch], s: int, degree: int) -> tuple[list[MicroBatch], float]:
        """`mbs` with sequence s added to the micro-batch of fewest tokens, or alone if faster,
        and the time that adds."""
        single = MicroBatch([s], self.cost.min_checkpoint(self._length_list[s], degree))
        best = (mbs + [single], self._mb_time(single, degree))
        if mbs:
            i = min(range(len(mbs)), key=lambda i: sum(self._length_list[x] for x in mbs[i].seq_ids))
            ids = mbs[i].seq_ids + [s]
            level = self.cost.min_checkpoint(sum(self._length_list[x] for x in ids), degree)
            if level is not None:
                merged = MicroBatch(ids, level)
                added = self._mb_time(merged, degree) - self._mb_time(mbs[i], degree)
                if added < best[1]:
                    best = (mbs[:i] + [merged] + mbs[i + 1:], added)
        return best

    def _without_sequence(self, mbs: list[MicroBatch], m: int, s: int, degree: int
                          ) -> tuple[list[MicroBatch], float]:
        """`mbs` with sequence s taken out of micro-batch m (dropped if it empties), and the
        time that saves."""
        ids = [x for x in mbs[m].seq_ids if x != s]
        before = self._mb_time(mbs[m], degree)
        if not ids:
            return mbs[:m] + mbs[m + 1:], before
        rest = MicroBatch(ids, self.cost.min_checkpoint(sum(self._length_list[x] for x in ids), degree))
        return mbs[:m] + [rest] + mbs[m + 1:], before - self._mb_time(rest, degree)

    # --- inside a group -----------------------------------------------------------------------
    def _pack(self, seqs: list[int], degree: int) -> list[MicroBatch]:
        """The micro-batch count and checkpoint levels of least time for these sequences."""
        if not seqs:
            return []
        lengths = self._length_list
        seqs = sorted(seqs, key=lambda s: -lengths[s])
        tokens = sum(lengths[s] for s in seqs)
        fewest = max(1, math.ceil(tokens / self.cost.max_tokens(degree, 1.0)))
        no_ckpt = max(fewest, math.ceil(tokens / self.cost.max_tokens(degree, 0.0)))
        # Time against the count is roughly convex (g grows, recomputation shrinks): try the
        # ends, a geometric ladder between them, then the neighbours of the best.
        top = max(fewest, min(no_ckpt, len(seqs)))
        ratio = (top / fewest) ** (1.0 / (LADDER - 1))
        ladder = {fewest, top, *(round(fewest * ratio ** i) for i in range(1, LADDER - 1))}
        timed = {m: self._timed(seqs, degree, m) for m in ladder}
        best = min(filter(None, timed.values()), key=lambda v: v[0], default=None)
        if best is not None:
            centre = len(best[1])
            for m in range(max(fewest, centre - REFINE), min(top, centre + REFINE) + 1):
                if m not in timed and (candidate := self._timed(seqs, degree, m)) and candidate[0] < best[0]:
                    best = candidate
        if best is None:
            # One sequence per micro-batch always fits: the last resort if balancing cannot.
            mbs = self._micro_batches(seqs, degree, len(seqs))
            assert mbs is not None, f"sequences {seqs[:5]} fit no packing at degree {degree}"
            return mbs
        return best[1]

    def _timed(self, seqs: list[int], degree: int, count: int) -> tuple[float, list[MicroBatch]] | None:
        mbs = self._micro_batches(seqs, degree, count)
        return None if mbs is None else (self._mbs_time(mbs, degree), mbs)

    def _micro_batches(self, longest_first: list[int], degree: int, count: int) -> list[MicroBatch] | None:
        """`count` token-balanced micro-batches (LPT on tokens) at their least checkpoint levels."""
        lengths = self._length_list
        heap = [(0, b) for b in range(count)]
        bins: list[list[int]] = [[] for _ in range(count)]
        for s in longest_first:
            load, b = heapq.heappop(heap)
            bins[b].append(s)
            heapq.heappush(heap, (load + lengths[s], b))
        mbs = []
        for load, b in sorted(heap, key=lambda item: item[1]):
            if bins[b]:
                level = self.cost.min_checkpoint(load, degree)
                if level is None:
                    return None
                mbs.append(MicroBatch(bins[b], level))
        return mbs

    def _mb_time(self, mb: MicroBatch, degree: int) -> float:
        lengths = self._length_list
        return self.cost.time_from_sums(sum(lengths[s] * lengths[s] for s in mb.seq_ids),
                                        sum(lengths[s] for s in mb.seq_ids), degree, mb.checkpoint)

    def _mbs_time(self, mbs: list[MicroBatch], degree: int) -> float:
        return sum(self._mb_time(mb, degree) for mb in mbs)
