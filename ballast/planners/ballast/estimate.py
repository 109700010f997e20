"""Estimated group times for the `ballast` planner: the `est` of its module docstring.

Cheap enough to evaluate for every group on every placement, close enough to the exact packed
time that assignments judged by it survive packing.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from ...pricing.cost import CostModel


class GroupEstimates:
    """Estimated times of a wave's groups (`est` in planner.py's docstring), updated per sequence.

    A sample enters as its tokens n and its span p = q / n (`SampleBatch.units` per token: the
    causal-equivalent tokens each of its tokens attends to, n for a text sequence), so its
    attention is a p n and its attention per token a p. For text p == n exactly (n n / n is
    exact in float64), and `a * p * n` rounds as `CostModel.attention_time` and the text-only
    `a * n * n` do.

    Each entry (group) is priced at one split of its degree (`cps`): with context parallelism
    (c > 1) its cap is lower (the gathered K and V per token), a recomputation frees more tokens
    (phi below), its exchange is the split's and its attention is f = `context_attention` times
    a p n, which the sums carry (`quad`, `attn`).

    Besides F, a sample longer than `cap` tokens per device must recompute its own excess
    whatever the micro-batch count (it cannot be split); that forced part is tracked per group
    and the larger of the two overheads charged. Recomputing a token costs r rho / (1 - k) plus,
    where the cost model prices attention's recomputation apart (r_attn != r), the difference
    on the attention share of rho: so the sum of a p n is tracked too (`attn`).

    The per-group sums live in Python lists, not arrays: the planner's greedy assignment reads
    and updates one group at a time hundreds of thousands of times per plan, and a numpy scalar
    access costs several times a list's. The vector methods convert them (same float64 values).
    """

    def __init__(self, cost: CostModel, degrees: np.ndarray, cps: list[int]):
        """Entries of `degrees`, each priced at its split `cps` (the CP part of its degree)."""
        free = cost.device_memory - cost.states
        # Per entry: its degree, the tokens per device that fit without recomputation, the
        # recomputation rates per token over that (r and r_attn - r times phi, the tokens a
        # recomputation frees: 1 / (1 - k) without CP; with it a recomputed layer also drops its
        # gathered K, V, so phi = 1 / (1 - `kept_share`)), the CP attention factor f and the
        # exchange seconds per token; then the forced recomputation per excess token and unit of
        # a p, and per excess token: (r + r_attn - r) phi f and r phi b.
        terms: dict[tuple[int, int], tuple] = {}
        for d, cp in set(zip(degrees.tolist(), cps)):
            cap = free / (cost.act_per_token + cost.gathered_per_token(d, cp) * d)
            phi, factor = 1.0 / (1.0 - cost.kept_share(d, cp)), cost.attention_factor(cp)
            # The attention rate is exactly 0.0 under docs/design.md's single r.
            rate, attn_rate = cost.recompute * phi, (cost.recompute_attention - cost.recompute) * phi
            terms[d, cp] = (float(d), cap, rate, attn_rate, factor, cost.comm_per_token(d, cp),
                            (rate + attn_rate) * factor, rate * cost.b)
        rows = [terms[key] for key in zip(degrees.tolist(), cps)]
        self._rows = rows
        # A column every entry shares stays a scalar: no gather per estimate (the common case:
        # only the degree and exchange vary without CP).
        table = np.array(rows)
        self.deg = table[:, 0]
        self._table = [float(column[0]) if (column == column[0]).all() else column for column in table.T]
        self._a, self._b, self._g = cost.a, cost.b, cost.g
        # `swap_floor` holds while the estimate grows with every sum: recomputation rates >= 0.
        self._monotone = all(rate >= 0.0 and rate + attn_rate >= 0.0 for _, _, rate, attn_rate, *_ in rows)
        self.quad = [0.0] * len(degrees)      # sum of f a p n + b n
        self.attn = [0.0] * len(degrees)      # sum of f a p n
        self.tokens = [0.0] * len(degrees)
        self.forced = [0.0] * len(degrees)    # recomputation no packing avoids

    def _columns(self, rows) -> np.ndarray:
        """The columns (degree, cap, rate, attention rate, f, exchange per token, forced per a p,
        forced per token) of entries `rows`."""
        return [column if isinstance(column, float) else column[rows] for column in self._table]

    def estimate(self, quad: np.ndarray, attn: np.ndarray, tokens: np.ndarray, forced: np.ndarray,
                 rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        return self._estimate(quad, attn, tokens, forced, self._columns(rows))

    def _estimate(self, quad, attn, tokens, forced, columns) -> np.ndarray:
        deg, cap, rate, attn_rate, _, comm, _, _ = columns
        g = self._g
        per_token = np.divide(quad, tokens, out=np.zeros_like(quad), where=tokens > 0)
        attn_per_token = np.divide(attn, tokens, out=np.zeros_like(attn), where=tokens > 0)
        slope = np.minimum(rate * per_token + attn_rate * attn_per_token, g / cap)
        over = g + np.maximum(forced, np.maximum(0.0, tokens / deg - cap) * slope)
        t = quad / deg + tokens * comm + over
        return np.where(tokens > 0, t, 0.0)

    def current(self) -> np.ndarray:
        return self.estimate(np.array(self.quad), np.array(self.attn), np.array(self.tokens),
                             np.array(self.forced))

    def terms(self, length, span, rows):
        """(f a p n + b n, f a p n, forced recomputation) of samples of `length` tokens n and
        `span` p in entries `rows` (indices, broadcast against the samples)."""
        return self._terms(length, span, self._columns(rows))

    def _terms(self, length, span, columns):
        deg, cap, _, _, f, _, forced_attention, forced_linear = columns
        attention = self._a * span
        excess = np.maximum(0.0, length / deg - cap)
        quad_attention = f * (attention * length)
        return (quad_attention + self._b * length, quad_attention,
                excess * (forced_attention * attention + forced_linear))

    def changed(self, groups: np.ndarray, removed: tuple = (0.0, 0.0), added: tuple = (0.0, 0.0)) -> np.ndarray:
        """Estimates of `groups` (indices) were each to lose a sample of (tokens, span)
        `removed` and gain one of `added` ((0, 0): none), elementwise; the sums themselves stay
        as they are."""
        columns = self._columns(groups)
        quad_r, attn_r, forced_r = self._terms(*removed, columns)
        quad_a, attn_a, forced_a = self._terms(*added, columns)
        return self._estimate(np.array(self.quad)[groups] - quad_r + quad_a,
                              np.array(self.attn)[groups] - attn_r + attn_a,
                              np.array(self.tokens)[groups] - removed[0] + added[0],
                              np.array(self.forced)[groups] - forced_r + forced_a, columns)

    def may_swap_below(self, slow: int, left: np.ndarray, owners: np.ndarray, ours: tuple, theirs: tuple,
                       limit: float) -> np.ndarray:
        """[s, t]: False where group `slow` giving sample s of `ours` (tokens, span; `left` its
        estimate without s) for sample t of `theirs`, owned by group `owners[t]`, surely leaves
        one of the two at `limit` or above.

        The estimate grows with each of its sums (F with tokens, with the recomputation rate's
        sums and with the forced part), so adding a sample raises it by at least its linear
        part (compute over d, exchange): `slow` ends at no less than left[s] + lin(t), and an
        owner taking s for a t within it in tokens and span at no less than its estimate +
        lin(s) - lin(t). Two additions per pair instead of two estimates: a wave of a few groups
        of hundreds of sequences each tries over a million swaps, few of which come near."""
        if not self._monotone:
            return np.ones((len(left), len(owners)), dtype=bool)
        groups = np.arange(len(self.quad))
        slow_t = self._linear(np.full(len(owners), slow), *theirs)
        owner_t = self._linear(owners, *theirs)
        owner_s = np.broadcast_to(self._linear(groups[None, :], ours[0][:, None], ours[1][:, None]),
                                  (len(left), len(groups)))[:, owners]
        within = (theirs[0][None, :] <= ours[0][:, None]) & (theirs[1][None, :] <= ours[1][:, None])
        return ((left[:, None] + slow_t[None, :] < limit)
                & ((owner_s < (limit - self.current()[owners] + owner_t)[None, :]) | ~within))

    def _linear(self, groups: np.ndarray, length, span) -> np.ndarray:
        """What a sample of (length, span) adds at least to the estimates of `groups`: its
        compute over the degree and its exchange."""
        columns = self._columns(groups)
        quad, _, _ = self._terms(length, span, columns)
        return quad / columns[0] + length * columns[5]

    def fill(self, seqs: list[int], lengths: list[float], spans: list[float], first_rows: list[int],
             rows: list[int]) -> list[list[int]]:
        """Place `seqs` (slowest first) one by one on the group whose estimate grows least;
        the members of each group. Sample k has `lengths[k]` tokens and span `spans[k]`; group j
        has degree row `rows[j]`; sample k fits rows from `first_rows[k]` on (feasibility is
        monotone in the degree).

        Within a row the estimate grows with the load, so only each row's least-loaded group
        can be the best: one heap per row keeps a placement at O(rows x log groups), linear
        in the batch for thousands of sequences. The estimate is `estimate()` in scalar
        arithmetic, inlined: this loop is the planner's hot path.
        """
        a, b, g = self._a, self._b, self._g
        quads, attns, tokens, forceds = self.quad, self.attn, self.tokens, self.forced
        members: list[list[int]] = [[] for _ in rows]
        heaps: dict[int, list[tuple[float, int]]] = {}
        for j, row in enumerate(rows):
            heaps.setdefault(row, []).append((0.0, j))
        # Entries of a row share their degree and split: its terms once per row, not per placement.
        by_row = [(row, heap, *self._rows[heap[0][1]], g / self._rows[heap[0][1]][1])
                  for row, heap in sorted(heaps.items())]
        for s, n, p, fits_from in zip(seqs, lengths, spans, first_rows):
            attn_n, linear_n = a * p * n, b * n
            best, best_j, best_row, best_forced, best_attn = math.inf, -1, -1, 0.0, 0.0
            for row, heap, d, cap, rate, attn_rate, f, comm, forced_attention, forced_linear, limit in by_row:
                if row < fits_from:
                    continue
                j = heap[0][1]
                quad_n = attn_n * f
                quad = quads[j] + quad_n + linear_n
                tok = tokens[j] + n
                forced = forceds[j]
                added = 0.0
                if n > d * cap:
                    added = (n / d - cap) * (forced_attention * a * p + forced_linear)
                    forced += added
                # Conditional expressions rather than min()/max(): same values, a third faster.
                slope = (rate * quad + attn_rate * (attns[j] + quad_n)) / tok
                slope = slope if slope <= limit else limit
                excess = tok / d - cap
                memory = excess * slope if excess > 0.0 else 0.0
                grown = quad / d + tok * comm + (g + (memory if memory > forced else forced))
                if grown < best:
                    best, best_j, best_row, best_forced, best_attn = grown, j, row, added, quad_n
            assert best_j >= 0, f"sequence {s} fits no group of the layout"
            quads[best_j] += best_attn + linear_n
            attns[best_j] += best_attn
            tokens[best_j] += n
            if best_forced:
                forceds[best_j] += best_forced
            members[best_j].append(s)
            heapq.heapreplace(heaps[best_row], (best, best_j))
        return members

    def move(self, j: int, length: float, span: float, sign: int = 1) -> None:
        quad, attn, forced = self._terms(length, span, self._rows[j])
        self.quad[j] += sign * quad
        self.attn[j] += sign * attn
        self.tokens[j] += sign * length
        self.forced[j] += sign * forced
