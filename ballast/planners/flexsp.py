"""`flexsp`: FlexSP (Wang et al., ASPLOS'25): heterogeneous SP groups chosen per step by a MILP.

A step is M waves; in a wave every SP group runs ONE micro-batch (its sequences packed) and
the wave lasts as long as its slowest group. Per step:

1. Sequence blaster. Sort the batch longest first and cut it into M consecutive chunks, one per
   wave, minimising the largest chunk's tokens (a DP over the sorted order). This is the
   `sort_consec` chunking of FlexSP's released solver (Hetu-Galvatron): waves hold similar
   lengths, so each wave's MILP sees few distinct lengths and forms one kind of group mix.
   M_min is the least M whose every chunk fits the cluster's memory (at full recomputation,
   see 2); the candidates are M_min..M_min+4.
2. Memory. FlexSP's MILP has one memory model, without a recomputation choice. Here each wave
   is capped at one recompute level c_w: the least at which the cluster holds the wave's
   bucketed tokens (+5% for packing) and its longest sequence fits the largest degree, i.e.
   0 (no recomputation) whenever the wave fits without. Recomputation is the fallback that
   lets a wave take more tokens than raw capacity, so fewer waves (each paying g) become
   possible and the search over M weighs that against recomputation. If the MILP finds no
   solution at c_w, it is retried at higher levels. After solving, every group gets the least
   level its real tokens need (<= c_w), so the MILP's times are upper bounds on that score.
3. DP bucketing. The wave's token counts go into `options.buckets` (16) buckets chosen by DP
   for the least padding (bucket max - length); the MILP has integer bucket counts per group
   instead of a binary per sequence. Memory rows use the bucket maximum (always safe), time
   rows the bucket's average (its members' attention units and tokens: exact in sum; see
   flexsp_milp). FlexSP's code grows the bucket count while padding eats half the memory
   headroom; here it doubles (up to 4x) while padding would force a higher recompute level
   than the raw tokens need.
4. MILP per wave (flexsp_milp): how many groups of each degree and which bucket counts each
   gets, minimising the slowest group under the cost model, solved by HiGHS with
   `options.time_limit` seconds (stopping at a 1% gap), started from the best of a few
   list-scheduled layouts (the released code seeds its solver with homogeneous ones; mixed
   ones matter when a long sequence needs a big group). Groups are laid out largest first
   from rank 0, so every block is aligned; `fill_idle` covers unused ranks.
5. The M with the least simulated step time wins. The whole step gets 5 x time_limit: each
   candidate M gets an equal share of what is left, split over its waves (never more than
   time_limit a solve); an M whose waves' lower bounds already exceed the best plan is skipped.

Deviations from the paper: recompute fallback (2); average-length time coefficients (3);
mixed-layout seeds and an area row in the MILP (4), which change its speed, not its optimum;
solves run one after another (FlexSP solves a step's waves in parallel processes), hence the
step budget. Sorted-consecutive chunks beat interleaved ("similar mix") ones on every
multi-wave step we measured (e.g. 1.23x vs 1.37x the lower bound on wikipedia/a100-64).
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..vocabulary.cluster import Cluster
from ..pricing.cost import CostModel
from ..plans.plan import Group, MicroBatch, Plan, Wave, fill_idle
from ..vocabulary.samples import SampleBatch
from ..plans.timeline import step_time
from .base import Planner, PlannerOptions
from .flexsp_buckets import Buckets, dp_buckets
from .flexsp_milp import WaveSolution, solve_wave
from ..pricing.bounds import lower_bound
from .registry import register

EXTRA_WAVES = 4
"""Candidates are M_min..M_min + EXTRA_WAVES waves."""
BUDGET_SOLVES = 5
"""A step's planning budget in units of options.time_limit."""
PACKING_SLACK = 0.05
"""Memory the recompute level leaves free so that sequences can be packed into groups."""
MAX_BUCKET_GROWTH = 4
"""Buckets may grow to this multiple of options.buckets to avoid recomputation for padding."""


def blast(lengths: list[int], waves: int) -> list[list[int]]:
    """Sequence ids in `waves` non-empty chunks of the longest-first order, the largest chunk's
    tokens as small as possible: dp[k, i] = min_j max(dp[k-1, j], tokens of order[j:i]), the first
    such j (np.argmin's).

    Solved per k for all i at once, not as a minimum over j for each i: dp[k-1, j] does not
    decrease with j (one more sequence never shortens the largest chunk) and the tokens of
    order[j:i] fall with j (lengths are positive), so the minimum is where they cross: c, the first
    j with dp[k-1, j] + prefix[j] >= prefix[i] (strictly rising in j, so a binary search), or the
    j = c - 1 before it, whose value (the tokens of order[c-1:i]) wins ties, being first. The same
    cuts as the minimum over every j (tests/planners/test_flexsp.py), in O(waves n log n): a
    batch of 8,000 sequences in 70 waves took minutes of numpy calls one (k, i) at a time."""
    n = len(lengths)
    assert 1 <= waves <= n
    order = sorted(range(n), key=lambda i: -lengths[i])
    prefix = np.concatenate([[0.0], np.cumsum([float(lengths[i]) for i in order])])
    dp = np.full((waves + 1, n + 1), np.inf)
    dp[0, 0] = 0.0
    cut = np.zeros((waves + 1, n + 1), dtype=np.int64)
    for k in range(1, waves + 1):
        i = np.arange(k, n + 1)
        rising = dp[k - 1, k - 1:n] + prefix[k - 1:n]  # j = k-1 .. n-1
        c = k - 1 + np.searchsorted(rising, prefix[i], side="left")  # in k-1 .. i
        before = np.maximum(c - 1, k - 1)
        at = np.minimum(c, i - 1)
        value_before = np.maximum(dp[k - 1, before], prefix[i] - prefix[before])
        value_at = np.maximum(dp[k - 1, at], prefix[i] - prefix[at])
        take_before = (c > k - 1) & (value_before <= value_at)
        dp[k, i] = np.where(take_before, value_before, value_at)
        cut[k, i] = np.where(take_before, before, at)
    chunks, i = [], n
    for k in range(waves, 0, -1):
        chunks.append(order[cut[k, i]:i])
        i = int(cut[k, i])
    return chunks[::-1]


def least_chunks(lengths: list[int], capacity: float) -> int:
    """The least M >= ceil(tokens / capacity) whose `blast` chunks all hold at most `capacity`
    tokens (len(lengths) when none below it does). Chunks of the longest-first order within a
    capacity can be cut into more chunks still within it, and no cut gives fewer than filling each
    chunk in turn as far as it goes, so M is that greedy count (at least the tokens' bound); a
    search over M, one `blast` per M, took minutes where M ran into the hundreds."""
    n = len(lengths)
    fewest = max(1, math.ceil(sum(lengths) / capacity))
    if max(lengths, default=0) > capacity:
        return n
    chunks, held = 1, 0
    for length in sorted(lengths, reverse=True):
        if held + length > capacity:
            chunks, held = chunks + 1, 0
        held += length
    return min(max(fewest, chunks), n)


@register
class FlexSPPlanner(Planner):
    name = "flexsp"

    def __init__(self, cluster: Cluster, cost: CostModel, options: PlannerOptions | None = None):
        super().__init__(cluster, cost, options)
        if not self.options.time_limit > 0:
            raise ValueError(f"flexsp: time_limit must be > 0 seconds, got {self.options.time_limit}")
        if self.options.buckets < 1:
            raise ValueError(f"flexsp: buckets must be >= 1, got {self.options.buckets}")
        self._solve_s = 0.0  # seconds inside HiGHS during the current step

    # --- memory --------------------------------------------------------------------------------
    def _level(self, tokens: float, longest: int) -> float | None:
        """Least recompute level at which the cluster holds `tokens` (+ packing slack) and the
        largest degree holds the longest sequence; None if even full recomputation cannot."""
        cost = self.cost
        # The slack is a preference: a wave that fits only without it still gets a level.
        whole = cost.min_recompute(math.ceil(tokens * (1 + PACKING_SLACK)), cost.world_size)
        if whole is None:
            whole = cost.min_recompute(math.ceil(tokens), cost.world_size)
        one = cost.min_recompute(longest, cost.degrees[-1])
        return None if whole is None or one is None else max(whole, one)

    def min_waves(self, lengths: list[int]) -> int:
        """Least M whose sequence-blaster chunks all fit the cluster at full recomputation."""
        # The whole cluster's tokens at once, not world x one rank's: a budget may hold a token
        # only across ranks (max_tokens(1, 1.0) == 0).
        capacity = self.cost.max_tokens(self.cost.world_size, 1.0) / (1 + PACKING_SLACK)
        return least_chunks(lengths, capacity)

    def _bucket(self, wave: list[int]) -> tuple[Buckets, float | None]:
        """DP buckets of a wave and the recompute level its padded tokens need."""
        longest = max(wave)
        raw = self._level(sum(wave), longest)
        k = self.options.buckets
        while True:
            buckets = dp_buckets(wave, k)
            padded = sum(u * len(m) for u, m in zip(buckets.upper, buckets.members))
            level = self._level(padded, longest)
            exact = len(buckets.members) == len(set(wave))
            if exact or (level is not None and level <= (raw or 0.0)) or k >= self.options.buckets * MAX_BUCKET_GROWTH:
                if level is None and not exact:  # padding alone overflows memory: bucket exactly
                    buckets = dp_buckets(wave, len(set(wave)))
                    level = raw
                return buckets, level
            k *= 2

    # --- one wave --------------------------------------------------------------------------------
    def _solve(self, batch: SampleBatch, ids: list[int], limit_s: float) -> tuple[WaveSolution, float, int] | None:
        """The best MILP solution of the wave of samples `ids`, its recompute cap and bucket
        count; None if none fits."""
        deadline = time.perf_counter() + limit_s
        wave = [batch.lengths[i] for i in ids]
        buckets, level = self._bucket(wave)
        if level is None:
            return None
        ladder = [level, self._level(1.25 * sum(wave), max(wave)), 1.0]
        for c in sorted({c for c in ladder if c is not None and c >= level}):
            sol = solve_wave(batch.pick(ids), self.cost, c, buckets, max(0.0, deadline - time.perf_counter()))
            self._solve_s += sol.seconds
            if sol.groups is not None:
                return sol, c, len(buckets.members)
        return None

    def _wave(self, ids: list[int], sol: WaveSolution, lengths: list[int]) -> Wave:
        groups, start = [], 0
        for d, local in sorted(sol.groups, key=lambda g: -g[0]):  # largest first: aligned blocks
            seq_ids = [ids[i] for i in local]
            level = self.cost.min_recompute(sum(lengths[i] for i in seq_ids), d)
            assert level is not None, f"the MILP overfilled a group of degree {d}"
            groups.append(Group(start, d, [MicroBatch(seq_ids, level)]))
            start += d
        assert start <= self.cluster.world_size, "the MILP used more ranks than the cluster has"
        wave = Wave(fill_idle(groups, self.cluster.world_size))
        if self.options.lockstep:  # FSDP: idle ranks still join the wave's one forward
            for g in wave.groups:
                g.micro_batches = g.micro_batches or [MicroBatch([], 0.0)]
        return wave

    # --- the step ----------------------------------------------------------------------------------
    def _plan_chunks(self, batch: SampleBatch, chunks: list[list[int]], budget_s: float) -> Plan | None:
        end = time.perf_counter() + budget_s
        waves, facts = [], []
        for w, ids in enumerate(chunks):
            left = max(0.0, end - time.perf_counter())
            solved = self._solve(batch, ids, min(self.options.time_limit, left / (len(chunks) - w)))
            if solved is None:
                return None
            sol, level, k = solved
            waves.append(self._wave(ids, sol, batch.lengths))
            facts.append((sol, level, k))
        return Plan(batch.lengths, waves, lockstep=self.options.lockstep, shapes=batch.shapes, info={
            "waves": len(waves),
            "mip_gap": float(max(sol.gap for sol, _, _ in facts)),
            "predicted_s": float(sum(sol.predicted for sol, _, _ in facts)),
            "recompute_cap": [level for _, level, _ in facts],
            "buckets": [k for _, _, k in facts],
            "status": [sol.status for sol, _, _ in facts]})

    def _plan(self, batch: SampleBatch) -> Plan:
        began, lengths = time.perf_counter(), batch.lengths
        deadline = began + BUDGET_SOLVES * self.options.time_limit
        self._solve_s = 0.0
        m_min = self.min_waves(lengths)
        candidates = list(range(m_min, min(m_min + EXTRA_WAVES, len(lengths)) + 1))
        best: Plan | None = None
        best_time = math.inf
        tried: dict[str, float | None] = {}
        m = m_min
        while m <= len(lengths) and (m in candidates or best is None):
            chunks = blast(lengths, m)
            bound = sum(lower_bound(self.cost, batch.pick(c)) for c in chunks)
            if bound >= best_time:  # no plan with these waves can win
                tried[str(m)] = None
            else:
                later = max(1, len([c for c in candidates if c >= m]))
                plan = self._plan_chunks(batch, chunks, max(0.0, deadline - time.perf_counter()) / later)
                tried[str(m)] = None if plan is None else step_time(plan, self.cost)
                if plan is not None and tried[str(m)] < best_time:
                    best, best_time = plan, tried[str(m)]
            m += 1
        assert best is not None, "one sequence per wave always fits (check_fits)"
        best.info.update({"m_min": m_min, "step_s_by_waves": tried, "solve_s": self._solve_s,
                          "plan_s": time.perf_counter() - began})
        return best
