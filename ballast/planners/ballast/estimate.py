"""Estimated group times for the `ballast` planner: the `est` of its module docstring.

Cheap enough to evaluate for every group on every placement, close enough to the exact packed
time that assignments judged by it survive packing.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from ...cost import CostModel


class GroupEstimates:
    """Estimated times of a wave's groups (`est` in planner.py's docstring), updated per sequence.

    A sample enters as its tokens n and its span p = q / n (`Batch.units` per token: the
    causal-equivalent tokens each of its tokens attends to, n for a text sequence), so its
    attention is a p n and its attention per token a p. For text p == n exactly (n n / n is
    exact in float64), and `a * p * n` rounds as `CostModel.attention_time` and the text-only
    `a * n * n` do.

    Besides F, a sample longer than `cap` tokens per device must recompute its own excess
    whatever the micro-batch count (it cannot be split); that forced part is tracked per group
    and the larger of the two overheads charged. Recomputing a token costs r rho / (1 - k) plus,
    where the cost model prices attention's recomputation apart (r_attn != r), the difference
    on the attention share of rho: so the sum of a p n is tracked too (`attn`).

    The per-group sums live in Python lists, not arrays: the planner's greedy assignment reads
    and updates one group at a time hundreds of thousands of times per plan, and a numpy scalar
    access costs several times a list's. The vector methods convert them (same float64 values).
    """

    def __init__(self, cost: CostModel, degrees: np.ndarray):
        self.cost, self.deg = cost, degrees.astype(np.float64)
        self._deg = self.deg.tolist()
        self._comm = [cost.comm_per_token(int(d)) for d in degrees]
        self.comm_per_token = np.array(self._comm)
        self.cap = (cost.device_memory - cost.states) / cost.act_per_token
        self.recompute_rate = cost.recompute / (1.0 - cost.kept)
        # Exactly 0.0 under docs/design.md's single r, which leaves every estimate as it was.
        self.attention_rate = (cost.recompute_attention - cost.recompute) / (1.0 - cost.kept)
        self._a, self._b, self._g = cost.a, cost.b, cost.g
        self.quad = [0.0] * len(degrees)      # sum of a p n + b n
        self.attn = [0.0] * len(degrees)      # sum of a p n
        self.tokens = [0.0] * len(degrees)
        self.forced = [0.0] * len(degrees)    # recomputation no packing avoids

    def estimate(self, quad: np.ndarray, attn: np.ndarray, tokens: np.ndarray, forced: np.ndarray,
                 rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        cost, deg = self.cost, self.deg[rows]
        per_token = np.divide(quad, tokens, out=np.zeros_like(quad), where=tokens > 0)
        attn_per_token = np.divide(attn, tokens, out=np.zeros_like(attn), where=tokens > 0)
        slope = np.minimum(self.recompute_rate * per_token + self.attention_rate * attn_per_token,
                           cost.g / self.cap)
        over = cost.g + np.maximum(forced, np.maximum(0.0, tokens / deg - self.cap) * slope)
        t = quad / deg + tokens * self.comm_per_token[rows] + over
        return np.where(tokens > 0, t, 0.0)

    def current(self) -> np.ndarray:
        return self.estimate(np.array(self.quad), np.array(self.attn), np.array(self.tokens),
                             np.array(self.forced))

    def terms(self, length, span, deg):
        """(a p n + b n, a p n, forced recomputation) of samples of `length` tokens n and
        `span` p at degrees `deg`."""
        a, b = self._a, self._b
        excess = np.maximum(0.0, length / deg - self.cap)
        forced = excess * self.recompute_rate * (a * span + b) + excess * self.attention_rate * a * span
        return a * span * length + b * length, a * span * length, forced

    def changed(self, groups: np.ndarray, removed: tuple = (0.0, 0.0), added: tuple = (0.0, 0.0)) -> np.ndarray:
        """Estimates of `groups` (indices) were each to lose a sample of (tokens, span)
        `removed` and gain one of `added` ((0, 0): none), elementwise; the sums themselves stay
        as they are."""
        deg = self.deg[groups]
        quad_r, attn_r, forced_r = self.terms(*removed, deg)
        quad_a, attn_a, forced_a = self.terms(*added, deg)
        return self.estimate(np.array(self.quad)[groups] - quad_r + quad_a,
                             np.array(self.attn)[groups] - attn_r + attn_a,
                             np.array(self.tokens)[groups] - removed[0] + added[0],
                             np.array(self.forced)[groups] - forced_r + forced_a, groups)

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
        a, b, g, cap, rate, attn_rate = self._a, self._b, self._g, self.cap, self.recompute_rate, self.attention_rate
        quads, attns, tokens, forceds = self.quad, self.attn, self.tokens, self.forced
        degs, comms = self._deg, self._comm
        slope_limit = g / cap
        members: list[list[int]] = [[] for _ in rows]
        heaps: dict[int, list[tuple[float, int]]] = {}
        for j, row in enumerate(rows):
            heaps.setdefault(row, []).append((0.0, j))
        by_row = sorted(heaps.items())
        for s, n, p, fits_from in zip(seqs, lengths, spans, first_rows):
            quad_n, linear_n = a * p * n, b * n
            best, best_j, best_row = math.inf, -1, -1
            for row, heap in by_row:
                if row < fits_from:
                    continue
                j = heap[0][1]
                d = degs[j]
                quad = quads[j] + quad_n + linear_n
                tok = tokens[j] + n
                forced = forceds[j]
                if n > d * cap:
                    forced += (n / d - cap) * rate * (a * p + b) + (n / d - cap) * attn_rate * a * p
                # Conditional expressions rather than min()/max(): same values, a third faster.
                slope = (rate * quad + attn_rate * (attns[j] + quad_n)) / tok
                slope = slope if slope <= slope_limit else slope_limit
                excess = tok / d - cap
                memory = excess * slope if excess > 0.0 else 0.0
                grown = quad / d + tok * comms[j] + (g + (memory if memory > forced else forced))
                if grown < best:
                    best, best_j, best_row = grown, j, row
            assert best_j >= 0, f"sequence {s} fits no group of the layout"
            d = degs[best_j]
            quads[best_j] += quad_n + linear_n
            attns[best_j] += quad_n
            tokens[best_j] += n
            if n > d * cap:
                forceds[best_j] += (n / d - cap) * rate * (a * p + b) + (n / d - cap) * attn_rate * a * p
            members[best_j].append(s)
            heapq.heapreplace(heaps[best_row], (best, best_j))
        return members

    def move(self, j: int, length: float, span: float, sign: int = 1) -> None:
        quad, attn, forced = self.terms(length, span, self._deg[j])
        self.quad[j] += sign * quad
        self.attn[j] += sign * attn
        self.tokens[j] += sign * length
        self.forced[j] += sign * forced
