"""The search of one `ballast` planning call (`planner.py` describes the moves): degrees per
sequence for a range of makespan targets, groups in proportion to work, earliest-finish
assignment with local search, and exact packing of the best candidates."""
from __future__ import annotations

import math

import numpy as np

from ...pricing.bounds import bound_of
from ...pricing.cost import CostModel
from ...plans.plan import Group, Plan, Wave, fill_idle
from ...vocabulary.samples import SampleBatch
from ...plans.timeline import step_time
from .allocation import allocate
from .estimate import GroupEstimates
from .groups import GroupPacker
from ...pricing.sequence_times import sequence_times

# Makespan targets tried, as multiples of the batch's lower bound; inf = least area everywhere.
TARGETS = (0.15, 0.25, 0.35, 0.5, 0.65, 0.8, 0.9, 1.0, 1.05, 1.12, 1.2, 1.35, 1.6, 2.0, 3.0, math.inf)
# Head sizes (longest sequences in a wave of their own) built fully, one wave included: on CP1
# under FSDP2's gathers the third-ranked head was 1.2% faster than the two best by the proxy (0.5%
# ahead of zeppelin's plans, which had been 0.7% ahead), for 1.35x the planning time.
HEAD_CANDIDATES = 3
HEAD_SIZES = (1, 2, 4, 8)
# Sequence placements per wave spent on assigning candidate layouts (best proxy first), and
# the fewest layouts assigned whatever the batch size; the rest are judged by their proxy.
PLACEMENT_BUDGET = 4096
MIN_ASSIGNED = 8
# Candidate waves packed exactly (the rest are judged by their estimate).
EXACT_CANDIDATES = 2
# Exact-repair moves per candidate wave (a count, not a clock, so plans are reproducible).
REPAIR_MOVES = 24
# Local-search moves per group, so planning time stays linear in the cluster size.
MOVES_PER_GROUP = 2
# Least relative gain of a swap: each costs a pass over the wave's sequences, and the many
# swaps worth less than this made planning 7x slower on setting A (430 ms, not 59) for 0.04%
# of step time.
SWAP_GAIN = 1e-3


class WaveSearch:
    """One call's search for the fastest waves of `batch` on ranks 0..ranks-1 (the rest of the
    cluster idle): the batch's per-sequence arrays, computed once, and the moves of
    `planner.py`'s docstring over them. Made afresh for every call, so the planner holding
    only its configuration can plan a part of a batch (`poles.py`) while planning the whole."""

    def __init__(self, cost: CostModel, batch: SampleBatch, ranks: int):
        self.cost, self.batch, self.ranks = cost, batch, ranks
        self.tokens = s = np.asarray(batch.lengths, dtype=np.float64)
        # Attention units per token (`GroupEstimates`' span): exactly s for a text sequence.
        self.span = batch.units / s
        self.attn = self.cost.attention_time(s, batch.units)
        self.quad = self.attn + self.cost.b * s
        self.deg = np.asarray([d for d in self.cost.degrees if d <= ranks])
        self.row = {int(d): i for i, d in enumerate(self.deg)}
        # [degree index, sequence]: alone at that degree at its best split, least recomputation,
        # without g; over every degree for the lower bound (`_bound`), up to `ranks` for the rest.
        self.alone = sequence_times(self.cost, batch.samples, every_split=True)
        self.work = self.alone[:len(self.deg)]
        # The split each degree's groups are estimated at (`_estimate_split`); the packer then
        # gives each group the split it runs fastest at.
        self.cps = {int(d): self._estimate_split(int(d)) for d in self.deg}
        # The proxy's estimates over all degree rows, and each sequence's forced recomputation
        # at each row (recomputation no packing avoids), computed once per batch.
        self.estimates = self._estimates(self.deg)
        _, _, self.forced = self.estimates.terms(s[None, :], self.span[None, :], np.arange(len(self.deg))[:, None])
        self.packer = GroupPacker(self.cost, batch, self.work, self.quad, self.row)

    def best(self, heads: int = HEAD_CANDIDATES) -> tuple[float, list[Wave]]:
        """The fastest waves and their step time: one wave, or the longest sequences in a wave of
        their own first; of the head sizes, `heads` built fully (one: the proxy's best alone, one
        wave included)."""
        batch = self.batch
        order = np.argsort(-np.min(self.work, axis=0), kind="stable")
        # Head sizes are compared by their layouts' proxies; only the best are built fully.
        options = []
        for head in self._head_sizes(order):
            parts = [order[:head], order[head:]] if head else [order]
            layouts = [self._layouts(part) for part in parts]
            score = sum(found[0][0] if found else math.inf for found in layouts)
            options.append((score, head, parts, layouts))
        # One wave (head 0) is always built; other head sizes only if their proxies promise.
        if heads > 1:
            options = options[:1] + sorted(options[1:], key=lambda option: option[0])[:heads - 1]
        else:
            options = [min(options, key=lambda option: option[0])]
        best: tuple[float, list[Wave]] | None = None
        for _, _, parts, layouts in options:
            waves = [wave for part, found in zip(parts, layouts)
                     for wave in ([self._finish(part, found)] if found else self._waves(part))]
            t = step_time(Plan(batch.lengths, waves, shapes=batch.shapes), self.cost)
            if best is None or t < best[0]:
                best = (t, waves)
        return best

    # --- candidates ---------------------------------------------------------------------------
    def _head_sizes(self, order: np.ndarray) -> list[int]:
        """How many of the longest sequences to try in a wave of their own (0 = none)."""
        fastest = np.min(self.work, axis=0)
        area = np.min(self.work * self.deg[:, None], axis=0).sum() / self.ranks
        # Worth a wave when the k-th longest alone takes a large part of the step ...
        sizes = {k for k in HEAD_SIZES if k < len(order) and fastest[order[k - 1]] > 0.25 * area}
        # ... or as Zeppelin splits by length class: the sequences that need wide groups at the
        # lower bound get the whole cluster first, so they run wider and recompute less.
        choice = self._degrees(self.work[:, order], self._bound(np.arange(len(order))),
                               self.ranks)
        if choice is not None:
            degrees = self.deg[choice]
            sizes |= {int(k) for d in self.deg[1:] if 0 < (k := np.count_nonzero(degrees >= d)) < len(order)}
        return [0, *sorted(sizes)]

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
        lower = self._bound(ids)
        work = self.work[:, ids]
        allocations: dict[bytes, list[int] | None] = {}

        def allocate(choice: np.ndarray) -> list[int] | None:
            # Several targets and floors often give the same degrees: allocate each once.
            key = choice.tobytes()
            if key not in allocations:
                allocations[key] = self._allocate(ids, choice)
            return allocations[key]

        choices = []
        for factor in TARGETS:
            # Narrow the widest degree until every class gets ranks: a sequence that would
            # take the whole cluster at its best degree then runs slower beside the others.
            width, layout = self.ranks, None
            while width >= 1 and layout is None:
                choice = self._degrees(work, lower * factor, width)
                layout = None if choice is None else allocate(choice)
                width //= 2
            choices.append((choice, layout))
        # Floored layouts too: every sequence at least at one degree (one degree for all at
        # the widest floors). Wide groups holding many sequences balance by fine grain, pay g
        # once for many sequences and need no recomputation, which wins where all-to-alls are
        # cheap; the longest keep the wider degree their target gave them.
        found = {choice.tobytes(): (choice, layout) for choice, layout in choices if layout is not None}
        fits = np.isfinite(work)
        more = [np.maximum(choice, row) for choice, _ in found.values() for row in range(1, len(self.deg))]
        more += [np.full(len(ids), row) for row in range(len(self.deg))]
        for choice in more:
            if choice.tobytes() not in found and fits[choice, np.arange(len(ids))].all():
                found[choice.tobytes()] = (choice, allocate(choice))
        # The assignment sees only the layout: of choices giving the same one, the best proxy.
        best: dict[tuple[int, ...], float] = {}
        for choice, layout in found.values():
            if layout is not None:
                shape = tuple(layout)
                best[shape] = min(best.get(shape, math.inf), self._proxy(ids, choice, layout))
        return sorted(((proxy, list(shape)) for shape, proxy in best.items()), key=lambda c: c[0])

    def _finish(self, ids: np.ndarray, layouts: list[tuple[float, list[int]]]) -> Wave:
        """Assign, balance and pack the most promising layouts; the fastest wave."""
        # Assigning is linear in the batch: small batches afford every layout, large ones the best.
        assigned = max(MIN_ASSIGNED, PLACEMENT_BUDGET // len(ids))
        candidates = [self._assign(ids, layout) for _, layout in layouts[:assigned]]
        candidates.sort(key=lambda c: c[0].current().max())
        best: tuple[float, list[Group]] | None = None
        for loads, layout, members in candidates[:EXACT_CANDIDATES]:
            self._improve(loads, members, np.searchsorted(self.deg, layout))
            groups, times, start = [], [], 0
            for d, seqs in zip(layout, members):
                time, mbs, cp = self.packer.pack(seqs, d)
                groups.append(Group(start, d, mbs, cp))
                times.append(time)
                start += d
            donors = set()
            for _ in range(REPAIR_MOVES):
                donor = self.packer.repair(groups, times)
                if donor is None:
                    break
                donors.add(donor)
            for i in donors:
                times[i] = self.packer.repack(groups[i], times[i])
            for group in groups:  # a receiver's new micro-batch joined at its end
                group.micro_batches = self.packer.ordered(group.micro_batches, group.degree, group.cp)
            if best is None or max(times) < best[0]:
                best = (max(times), groups)
        return Wave(fill_idle([g for g in best[1] if g.micro_batches], self.ranks))

    # --- one candidate wave -------------------------------------------------------------------
    def _bound(self, ids: np.ndarray) -> float:
        """`lower_bound` of sequences `ids`, from the arrays of the whole batch."""
        return bound_of(self.cost, self.tokens[ids], self.batch.units[ids], self.alone[:, ids])

    def _degrees(self, work: np.ndarray, target: float, width: int) -> np.ndarray | None:
        """Degree index per sequence (columns of `work`, a slice of `_work`): least area within
        `target`, degrees <= `width`."""
        deg = self.deg
        work = np.where((deg <= width)[:, None], work, np.inf)
        if not np.isfinite(work).any(axis=0).all():
            return None
        area = work * deg[:, None]
        within = work + self.cost.g <= target
        choice = np.argmin(np.where(within, area, np.inf), axis=0)
        alone = ~within.any(axis=0)
        choice[alone] = np.argmin(work[:, alone], axis=0)
        return choice

    def _proxy(self, ids: np.ndarray, choice: np.ndarray, layout: list[int]) -> float:
        """The wave's time if every class spread its sequences evenly over its groups (through the
        pipeline, where there is one, as the packer prices it)."""
        rows = np.searchsorted(self.deg, layout)
        groups = np.bincount(rows, minlength=len(self.deg))
        quad = np.bincount(choice, weights=self.quad[ids], minlength=len(self.deg))
        attn = np.bincount(choice, weights=self.attn[ids], minlength=len(self.deg))
        tokens = np.bincount(choice, weights=self.tokens[ids], minlength=len(self.deg))
        used = groups > 0
        forced = np.bincount(choice, weights=self.forced[choice, ids], minlength=len(self.deg))
        spread = self.estimates.estimate(quad[used] / groups[used], attn[used] / groups[used],
                                          tokens[used] / groups[used],
                                          forced[used] / groups[used], used)
        seconds = self.work[choice, ids] + self.cost.g
        stages = self.packer.stages
        if stages > 1:  # a class's groups through the pipeline: a bubble of its longest (`pipelined_seconds`)
            longest = np.zeros(len(self.deg))
            np.maximum.at(longest, choice, seconds)
            spread = spread + (stages - 1) * longest[used]
        return max(float(spread.max()), stages * float(seconds.max()))

    def _assign(self, ids: np.ndarray, layout: list[int]) -> tuple[GroupEstimates, list[int], list[list[int]]]:
        """Slowest first, each sequence to the group whose estimated time grows least."""
        loads = self._estimates(np.asarray(layout))
        first_rows = np.argmax(np.isfinite(self.work[:, ids]), axis=0).tolist()
        members = loads.fill(ids.tolist(), self.tokens[ids].tolist(), self.span[ids].tolist(), first_rows,
                             [self.row[d] for d in layout])
        return loads, layout, members

    def _estimates(self, degrees: np.ndarray) -> GroupEstimates:
        """Estimates of groups of these degrees, each at its degree's estimate split."""
        return GroupEstimates(self.cost, degrees, [self.cps[int(d)] for d in degrees])

    def _estimate_split(self, degree: int) -> int:
        """The split a group of `degree` is estimated at: of the splits the rule allows, the one
        whose estimate is least for a group holding its share (degree / ranks) of the batch,
        which weighs the splits' exchanges against their memory (gathered K and V) at this
        batch's load."""
        parts = self.cost.catalogue.context_parts(degree)
        if len(parts) == 1:
            return parts[0]
        share = degree / self.ranks
        estimates = GroupEstimates(self.cost, np.full(len(parts), degree), parts)
        terms = estimates.terms(self.tokens[None, :], self.span[None, :], np.arange(len(parts))[:, None])
        quad, attn, forced = (np.broadcast_to(x, (len(parts), len(self.tokens))).sum(axis=1) * share for x in terms)
        times = estimates.estimate(quad, attn, np.full(len(parts), self.tokens.sum() * share), forced)
        return parts[int(np.argmin(times))]

    def _allocate(self, ids: np.ndarray, choice: np.ndarray) -> list[int] | None:
        """Degrees of the wave's groups, largest first; None if the classes cannot all fit."""
        return allocate(self.work[choice, ids], choice, self.deg.tolist(), self.ranks)

    def _improve(self, loads: GroupEstimates, members: list[list[int]], rows: np.ndarray) -> None:
        """Move a sequence off the slowest group, or, where no move helps, swap one of its
        sequences for a lighter one of another group; the change that shortens the wave most,
        while one does. (Moves alone stall where every group holds a long sequence:
        slowest-first placement can leave two long ones together and the short ones elsewhere.)"""
        everyone = np.arange(len(members))
        for _ in range(MOVES_PER_GROUP * len(members)):
            times = loads.current()
            slow = int(np.argmax(times))
            mine = np.array(members[slow])
            # Moves: each s to the group it grows least.
            left = loads.changed(np.full(len(mine), slow), removed=self._pair(mine))
            grown = np.where(np.isfinite(self.work[rows][:, mine].T),
                             loads.changed(everyone[None, :], added=self._pair(mine[:, None])), np.inf)
            grown[:, slow] = np.inf
            target = np.argmin(grown, axis=1)
            after = np.maximum(left, grown[np.arange(len(mine)), target])
            k = int(np.argmin(after))
            if after[k] < times[slow] - 1e-12:
                self._exchange(loads, members, slow, int(mine[k]), int(target[k]), -1)
                continue
            # Swaps: s for a t of less work (`quad`) in another group, where both groups can
            # hold what they get. Alike samples swap alike, so only the first of each kind
            # (per group) is tried: the same choice, and a batch of thousands of one- and
            # two-token clips no longer makes the search quadratic.
            owner = np.array([j for j, seqs in enumerate(members) if j != slow for _ in seqs], dtype=np.int64)
            others = np.array([t for j, seqs in enumerate(members) if j != slow for t in seqs], dtype=np.int64)
            if not len(others):
                return
            kinds = self._first_of_kind(mine)
            mine, left = mine[kinds], left[kinds]
            keep = self._first_of_kind(others, owner)
            owner, others = owner[keep], others[keep]
            limit = times[slow] * (1.0 - SWAP_GAIN)
            ours, theirs = self._pair(mine), self._pair(others)
            # Only the pairs that may end below the limit (`GroupEstimates.may_swap_below`; the
            # margin covers rounding) are priced, in the same order.
            s, t = np.nonzero(loads.may_swap_below(slow, left, owner, ours, theirs, limit * (1.0 + 1e-9)))
            keep = ((self.quad[others[t]] < self.quad[mine[s]])
                    & np.isfinite(self.work[rows[slow], others[t]])
                    & np.isfinite(self.work[rows[owner[t]], mine[s]]))
            s, t = s[keep], t[keep]
            after = np.maximum(loads.changed(np.full(len(s), slow), self._pair(mine[s]), self._pair(others[t])),
                               loads.changed(owner[t], self._pair(others[t]), self._pair(mine[s])))
            if not len(after) or not after[k := int(np.argmin(after))] < limit:
                return
            self._exchange(loads, members, slow, int(mine[s[k]]), int(owner[t[k]]), int(others[t[k]]))

    def _exchange(self, loads: GroupEstimates, members: list[list[int]], slow: int, s: int, j: int,
                  t: int) -> None:
        """Sequence s from group `slow` to group j and, unless t < 0, sequence t back."""
        for seq, src, dst in ((s, slow, j), (t, j, slow)):
            if seq >= 0:
                members[src].remove(seq)
                members[dst].append(seq)
                n, p = float(self.tokens[seq]), float(self.span[seq])
                loads.move(src, n, p, -1)
                loads.move(dst, n, p)

    def _first_of_kind(self, ids: np.ndarray, owner: np.ndarray | None = None) -> np.ndarray:
        """Ascending indices into `ids` of the first sample of each (tokens, span) (and owner):
        what a swap's effect depends on."""
        keys = [self.tokens[ids], self.span[ids]] + ([owner] if owner is not None else [])
        return np.sort(np.unique(np.stack(keys, axis=1), axis=0, return_index=True)[1])

    def _pair(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, span) of samples `ids`, shaped as `ids`: what `GroupEstimates.changed` takes."""
        return self.tokens[ids], self.span[ids]
