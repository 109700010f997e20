"""FlexSP's per-wave MILP over a wave's length buckets (`flexsp_buckets.py`; helpers of `flexsp`).

One wave = one round in which every SP group runs ONE micro-batch (its sequences packed).
Given the wave's samples in length buckets (counts n_j, longest u_j), the MILP picks how many
SP groups of each degree to form and how many sequences of each bucket each group gets:

    minimise T
    sum_p x[p,j] = n_j                                   every sequence placed
    sum_p d_p y_p <= N                                   groups fit the cluster
    sum_j u_j x[p,j] <= cap(d_p, c) y_p                  memory (bucket maximum: always safe)
    W_p = sum_j t(j, d_p) x[p,j] + g y_p <= T            the slowest group sets the wave time
    sum_p d_p (W_p - g y_p) <= N (T - g)                 area: redundant, lifts the LP bound

with a slot p for each group a degree could have (N/d of degree d, fewer if few sequences fit),
y_p binary (slot used), x[p,j] integer. t(j, d) is the time of an average sequence of bucket
j at degree d (a q + b s compute over d, for its attention units q and tokens s, plus its
all-to-all), so summed over a bucket it is exact; FlexSP's code charges every sequence the
bucket's maximum instead, which overstates the work of the wide buckets (with exact buckets
the two coincide). Slots of one degree are interchangeable; explicit symmetry-breaking rows
(y and W descending) made HiGHS weaker on these models, as it detects that symmetry itself,
so there are none.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import highspy as core
import numpy as np

from .flexsp_buckets import Buckets
from .hard_stop import call_with_hard_stop

from ..pricing.cost import CostModel
from ..vocabulary.samples import Sample, tokens

if TYPE_CHECKING:
    from scipy.sparse import csc_matrix


@dataclass
class WaveSolution:
    groups: list[tuple[int, list[int]]] | None
    """(degree, sequence indices) of every non-empty group; None when no solution was found."""
    predicted: float
    """The MILP's objective: its estimate of the wave's time (inf without a solution)."""
    bound: float
    """HiGHS's dual bound on the wave time under the bucketed model."""
    gap: float
    """Relative MIP gap (predicted - bound) / predicted; 0 when proven optimal."""
    seconds: float
    status: str
    """`optimal`, `time limit`, `infeasible`, `no solution` or `greedy`."""


# --- the MILP ------------------------------------------------------------------------------------
@dataclass
class _Model:
    """The wave MILP in column/row form. Column 0 is T; each slot has a y and one x per bucket."""

    slots: list[tuple[int, list[int]]]
    """(degree, buckets it can hold) of every group slot."""
    y: list[int]
    x: list[dict[int, int]]
    """Column of x[p, j] for the buckets j slot p can hold."""
    t: dict[tuple[int, int], float]
    """Time of an average sequence of bucket j at degree d, without the per-micro-batch g."""
    counts: list[int]
    g: float
    matrix: csc_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray

    def work(self, p: int, sol: np.ndarray) -> float:
        """W_p: the time of slot p's micro-batch under the bucketed model (0 if unused)."""
        d, fits = self.slots[p]
        return sum(self.t[d, j] * sol[self.x[p][j]] for j in fits) + self.g * sol[self.y[p]]


def _per_sequence_time(lengths: np.ndarray, units: np.ndarray, members: list[int], d: int,
                       cost: CostModel, recompute: float) -> float:
    total = cost.time_from_sums(float(units[members].sum()), float(lengths[members].sum()), d, recompute,
                                samples=len(members))
    return (total - cost.g) / len(members)


def _build(lengths: np.ndarray, units: np.ndarray, buckets: Buckets, cost: CostModel,
           recompute: float) -> _Model:
    # Imported where a MILP is built: every planning process would pay ~0.3 s at start.
    from scipy.sparse import csc_matrix

    counts = [len(m) for m in buckets.members]
    slots: list[tuple[int, list[int]]] = []
    for d in cost.degrees:
        cap = cost.max_tokens(d, recompute)
        fits = [j for j, u in enumerate(buckets.upper) if u <= cap]
        # A used group holds at least one sequence: more slots than fitting sequences are useless.
        slots += [(d, fits)] * min(cost.world_size // d, sum(counts[j] for j in fits))
    y, x, n_var = [], [], 1
    for _, fits in slots:
        y.append(n_var)
        x.append({j: n_var + 1 + k for k, j in enumerate(fits)})
        n_var += 1 + len(fits)
    t = {(d, j): _per_sequence_time(lengths, units, buckets.members[j], d, cost, recompute)
         for d in {d for d, _ in slots} for j in range(len(counts))}

    def work(p: int, sign: float = 1.0) -> dict[int, float]:
        d, fits = slots[p]
        return {**{x[p][j]: sign * t[d, j] for j in fits}, y[p]: sign * cost.g}

    rows: list[tuple[dict[int, float], float, float]] = []  # (coefficients, lower, upper)
    for j, n in enumerate(counts):
        rows.append(({xp[j]: 1.0 for xp in x if j in xp}, n, n))
    rows.append(({y[p]: float(d) for p, (d, _) in enumerate(slots)}, -np.inf, cost.world_size))
    area = {0: -float(cost.world_size)}
    for p, (d, fits) in enumerate(slots):
        # Scaled to about 1; the half token keeps HiGHS's feasibility tolerance (1e-7) from
        # letting an integer token count exceed the capacity.
        cap = cost.max_tokens(d, recompute) + 0.5
        rows.append(({**{x[p][j]: buckets.upper[j] / cap for j in fits}, y[p]: -1.0}, -np.inf, 0.0))
        # Sequences only in a used group. The capacity row above says so too, but where a bucket's
        # tokens are a tiny share of a large capacity its coefficient falls below HiGHS's
        # feasibility tolerance and an unused slot (y = 0) could take sequences: ranks the
        # cluster does not have.
        rows.append(({**{x[p][j]: 1.0 for j in fits}, y[p]: -float(sum(counts[j] for j in fits))}, -np.inf, 0.0))
        rows.append(({**work(p), 0: -1.0}, -np.inf, 0.0))
        area.update({x[p][j]: d * t[d, j] for j in fits})
    # Area: a used group's work beyond its g is at most T - g, and used groups are disjoint, so
    # sum_p d_p (W_p - g y_p) <= N (T - g). Redundant for integer points, but it lifts the LP
    # bound from about g (fractional y) to g + the cluster's average load: prunes, honest gaps.
    rows.append((area, -np.inf, -cost.world_size * cost.g))
    r = [i for i, (coef, _, _) in enumerate(rows) for _ in coef]
    c = [k for coef, _, _ in rows for k in coef]
    v = [val for coef, _, _ in rows for val in coef.values()]
    col_lower, col_upper = np.zeros(n_var), np.zeros(n_var)
    # No wave is faster than its hardest bucket's average sequence on that bucket's best degree.
    col_lower[0] = max(min(t[d, j] for d, fits in slots if j in fits) for j in range(len(counts))) + cost.g
    col_upper[0] = np.inf
    for p, (_, fits) in enumerate(slots):
        col_upper[y[p]] = 1
        for j in fits:
            col_upper[x[p][j]] = counts[j]
    return _Model(slots, y, x, t, counts, cost.g, csc_matrix((v, (r, c)), shape=(len(rows), n_var)),
                  np.array([row[1] for row in rows], float), np.array([row[2] for row in rows], float),
                  col_lower, col_upper)


def _group_sets(world: int, degrees: list[int]) -> list[list[int]]:
    """Candidate group layouts for the seeds: one degree everywhere, or n (a power of two)
    groups of a large degree D with the remaining ranks in groups of one smaller degree."""
    sets = [[d] * (world // d) for d in degrees]
    for D in degrees:
        n = 1
        while n * D < world:
            sets += [[D] * n + [d] * ((world - n * D) // d) for d in degrees if d < D]
            n *= 2
    return sets


def _eft(model: _Model, buckets: Buckets, degrees: list[int], caps: dict[int, int]) -> tuple[float, np.ndarray] | None:
    """Longest sequence first onto the group where it finishes earliest (with memory room);
    (makespan, counts[group, bucket]) or None if some sequence finds no room."""
    deg = np.asarray(degrees)
    cap = np.array([caps[d] for d in degrees], dtype=np.float64)
    load, mem = np.zeros(len(deg)), np.zeros(len(deg))
    cnt = np.zeros((len(deg), len(model.counts)), dtype=np.int64)
    for j in sorted(range(len(model.counts)), key=lambda j: -buckets.upper[j]):
        t = np.array([model.t.get((d, j), np.inf) for d in degrees])
        for _ in range(model.counts[j]):
            finish = np.where(mem + buckets.upper[j] <= cap, load + t, np.inf)
            k = int(np.argmin(finish))
            if not np.isfinite(finish[k]):
                return None
            load[k], mem[k] = finish[k], mem[k] + buckets.upper[j]
            cnt[k, j] += 1
    used = cnt.sum(axis=1) > 0
    return float((load + model.g)[used].max()), cnt


def _seed(model: _Model, buckets: Buckets, cost: CostModel, recompute: float) -> np.ndarray | None:
    """The best of a few list-scheduled layouts (one degree, or a few large groups plus small
    ones), as a MILP point to start HiGHS from. FlexSP's code seeds its solver with balanced
    homogeneous solutions; HiGHS's own heuristics rarely find any feasible point of this model
    within seconds, and long sequences need the mixed layouts."""
    degrees = sorted({d for d, _ in model.slots})
    caps = {d: cost.max_tokens(d, recompute) for d in degrees}
    best: tuple[float, list[int], np.ndarray] | None = None
    for layout in _group_sets(cost.world_size, degrees):
        found = _eft(model, buckets, layout, caps)
        if found is not None and (best is None or found[0] < best[0]):
            best = (found[0], layout, found[1])
    if best is None:
        return None
    makespan, layout, cnt = best
    point = np.zeros(len(model.col_lower))
    point[0] = makespan
    free = {d: [p for p, (dd, _) in enumerate(model.slots) if dd == d] for d in degrees}
    for d, row in zip(layout, cnt):
        if row.any():
            p = free[d].pop(0)  # a used group holds a sequence, so its degree has a slot left
            point[model.y[p]] = 1
            for j in np.flatnonzero(row):
                point[model.x[p][int(j)]] = row[j]
    return point


def _highs(model: _Model, start: np.ndarray | None, time_limit: float,
           mip_rel_gap: float) -> tuple[np.ndarray | None, float, str]:
    """Run HiGHS from `start`; (best point or None, dual bound, status). In a child process
    killed shortly past `time_limit` (`hard_stop.py`: HiGHS's presolve does not always check
    it), whose overrun counts as a solve that found nothing ("killed")."""
    finished, found = call_with_hard_stop(_run_highs, time_limit, model, start, time_limit, mip_rel_gap)
    return found if finished else (None, np.nan, "killed")


def _run_highs(model: _Model, start: np.ndarray | None, time_limit: float,
               mip_rel_gap: float) -> tuple[np.ndarray | None, float, str]:
    """`_highs` in this process.

    scipy.optimize.milp cannot take a starting point, so this talks to HiGHS's own Python
    bindings (`highspy`, a dependency).
    """
    # The bindings' solver class itself: highspy's `Highs` wrapper adds Python callbacks (unused
    # here) whose installation prints HiGHS's banner to stdout, before any option can turn
    # output off, into `ballast simulate`'s table.
    highs = core._Highs()
    n_row, n_col = model.matrix.shape
    lp = core.HighsLp()
    lp.num_col_, lp.num_row_ = n_col, n_row
    lp.col_cost_ = np.eye(1, n_col).ravel()
    lp.col_lower_, lp.col_upper_ = model.col_lower, model.col_upper
    lp.row_lower_, lp.row_upper_ = model.row_lower, model.row_upper
    lp.a_matrix_.format_ = core.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_col, n_row
    lp.a_matrix_.start_, lp.a_matrix_.index_ = model.matrix.indptr, model.matrix.indices
    lp.a_matrix_.value_ = model.matrix.data
    lp.integrality_ = [core.HighsVarType.kContinuous] + [core.HighsVarType.kInteger] * (n_col - 1)
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("time_limit", float(time_limit))
    highs.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    # RENS solves a sub-MIP whose presolve (HPresolve::strengthenInequalities) does not check
    # the time limit: with highspy 1.16 one of setting A's batches ran there for 10+ minutes
    # past a 10 s limit (HiGHS issues #1501, #2226 describe the class). Without RENS the same
    # batch solves to optimality in 6 s; our own start point stands in for the heuristic.
    highs.setOptionValue("mip_heuristic_run_rens", False)
    highs.passModel(lp)
    if start is not None:
        solution = core.HighsSolution()
        solution.col_value = list(start)
        highs.setSolution(solution)
    highs.run()
    status, info = highs.getModelStatus(), highs.getInfo()
    bound = float(info.mip_dual_bound)
    if status == core.HighsModelStatus.kInfeasible:
        return None, bound, "infeasible"
    # Stopped at the time limit, HiGHS may hold no integer-feasible point and still report the
    # root LP's objective; its columns are then fractional and, rounded, may use more ranks than
    # the cluster has. Only a point HiGHS calls feasible is a solution.
    if (info.objective_function_value >= core.kHighsInf
            or info.primal_solution_status != core.kSolutionStatusFeasible):
        return None, bound, "no solution"
    x = np.array(highs.getSolution().col_value)
    return x, bound, "optimal" if status == core.HighsModelStatus.kOptimal else "time limit"


def solve_wave(samples: Sequence[Sample], cost: CostModel, recompute: float, buckets: Buckets,
               time_limit: float, mip_rel_gap: float = 1e-2) -> WaveSolution:
    """FlexSP's MILP for one wave under a wall-clock limit, its bucket counts mapped to samples
    (`buckets` of their token counts).

    Every group's memory is capped at recompute level `recompute` (the caller's choice)."""
    s = np.fromiter(map(tokens, samples), dtype=np.int64, count=len(samples))
    q = cost.units(samples)
    model = _build(s, q, buckets, cost, recompute)
    if not model.slots or any(not any(j in fits for _, fits in model.slots) for j in range(len(model.counts))):
        return WaveSolution(None, np.inf, np.inf, 1.0, 0.0, "infeasible")
    began = time.perf_counter()
    start = _seed(model, buckets, cost, recompute)
    if time_limit > 0:
        x, bound, status = _highs(model, start, time_limit, mip_rel_gap)
    else:  # out of budget: the seed alone
        x, bound, status = None, np.nan, "no solution"

    if x is None and start is not None and status != "infeasible":
        x, status = start, "greedy"
    seconds = time.perf_counter() - began
    if x is None:
        return WaveSolution(None, np.inf, bound, 1.0, seconds, status)
    x = np.round(x)
    works = [model.work(p, x) for p in range(len(model.slots))]
    predicted = max(works)
    gap = max(0.0, (predicted - bound) / predicted) if np.isfinite(bound) else 1.0
    quotas = [(d, {j: int(x[model.x[p][j]]) for j in fits}) for p, (d, fits) in enumerate(model.slots)]
    groups = _assign(s, q, buckets, [quota for quota in quotas if sum(quota[1].values())], cost, recompute)
    return WaveSolution(groups, predicted, bound, gap, seconds, status)


def _assign(s: np.ndarray, q: np.ndarray, buckets: Buckets, quotas: list[tuple[int, dict[int, int]]],
            cost: CostModel, recompute: float) -> list[tuple[int, list[int]]]:
    """Concrete sequences for the MILP's bucket counts: within each bucket, longest first, each
    sequence goes to the group (with quota left for the bucket) whose real time is least so
    far, so the spread inside a bucket evens out instead of piling up in one group."""
    seqs: list[list[int]] = [[] for _ in quotas]
    units, tok = np.zeros(len(quotas)), np.zeros(len(quotas))
    left = [dict(quota) for _, quota in quotas]
    for j in reversed(range(len(buckets.members))):
        for i in buckets.members[j]:
            open_ = [p for p in range(len(quotas)) if left[p].get(j, 0) > 0]
            assert open_, f"bucket {j}: the MILP's counts do not cover its sequences"
            p = min(open_, key=lambda p: cost.time_from_sums(units[p], tok[p], quotas[p][0], recompute,
                                                             samples=len(seqs[p])))
            seqs[p].append(int(i))
            left[p][j] -= 1
            units[p] += q[i]
            tok[p] += float(s[i])
    assert all(v == 0 for quota in left for v in quota.values()), "the MILP placed more sequences than exist"
    return [(d, ids) for (d, _), ids in zip(quotas, seqs)]
