"""`hydraulis` on heterogeneous strategies: a step planned as Hydraulis (Li et al., 2024) plans it in
its repository (Hetu, `examples/hydraulis/strategy/`), over the strategies the run gives (Hetu's
`--multi_tp_pp_list`; `hydraulis_pool.py` proposes them from a length histogram, as its offline
dynamic program does). Hydraulis trains without recomputation (its memory model prices a
sequence's whole activations), so a pipeline holds what one rank holds at no recomputation
(cap_j), and only the strategies whose pipelines hold every sequence so are candidates. For each:

  stage 1, sequences to pipelines. c_ij: the seconds one stage of pipeline j spends on sequence i
    alone, its compute at the pipeline's (t, p) over p (Hydraulis' a s^2 + b s), inf over cap_j. TRIALS seeded shuffles of the batch; in each, the sequences only one pipeline
    holds go to it first, then every other one, in the shuffled order, to the pipeline j that
    holds it and minimises max(M, acc_j + c_ij + max(w_j, (p_j - 1) c_ij)): acc_j its sum of c,
    w_j its (p_j - 1) max c (1F1B's warm-up and cool-down), M the worst acc + w so far; an empty
    pipeline wins a tie, else the first. The trial with the least M wins (the first on a tie).
    Every pipeline whose total stays under M ties at M, so with many unlike pipelines the tie
    rule, not the objective, places most sequences: on 1,024 ranks (docs/results.md, H4) the
    first pipelines fill while long documents raise M and the last get one sequence each.
  stage 2, micro-batches inside each pipeline, for v from ceil(its tokens / cap) up, COUNTS
    values at most: its sequences into v micro-batches minimising the largest one's sum of c
    under the token cap (greedily for every v; for the REFINED best, a MILP solved by HiGHS,
    `scipy.optimize.milp`, within SOLVE_SECONDS, where the greedy is more than GAP above the
    bound), and the v minimising (max + g)(p - 1 + v), 1F1B's makespan at a uniform stage time,
    with g a micro-batch's fixed cost.
  The strategy whose slowest pipeline's stage-2 makespan is least trains the step (the first on
  a tie), its micro-batches largest first.

Deviations, where ballast differs from the repository:
- c and g come from the pipeline's cost model (`pricing`), not from fits of profiled steps.
- v has no lower bound on tokens per micro-batch (Hetu's `utilization_seqlen`, a per-GPU
  constant it measured) and a strategy that leaves a pipeline idle is kept (Hetu rejects it):
  an idle pipeline's ranks wait, which stage 2's makespan already prices.
- Each pipeline is one replica (its pool one rank), as Hydraulis' are: replicas are written as
  pipelines of their own.
- The parameter movement is not in the choice (nor is it in Hydraulis'): every step pays the
  same gather and reduction under any strategy (`pricing/parameter_movement.py`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, vstack

from ..plans.plan import Group, MicroBatch, Plan, Wave
from ..plans.strategy_plan import StrategyPlan
from ..pricing.coefficients import InfeasibleError
from ..pricing.cost import CostModel
from ..vocabulary.samples import Sample, SampleBatch, tokens
from ..vocabulary.strategy import Strategy
from .base import PlannerOptions
from .hydraulis import balance_under_cap
from .strategy_choice import StrategyChoice, own_rule
from .strategy_prices import StrategyPrices, named

TRIALS = 50  # stage 1's shuffles (Hetu's MINI_TRIAL_NUM in dynamic_pulp.py)
COUNTS = 16  # stage 2's micro-batch counts tried per pipeline (Hetu: v_min .. v_min + 15)
SOLVE_SECONDS = 0.5  # HiGHS's limit per stage-2 MILP (Hetu's PuLP timeLimit)
REFINED = 2  # the counts, best by the greedy's makespan, whose packing the MILP may improve
GAP = 0.01
"""A greedy packing within this share of the bound max(largest c, sum c / v) is kept without the
MILP. Measured on a 7B step of 512 wikipedia sequences on 16 H100s (64 packings of 52-372
sequences into 2-19 micro-batches): the greedy came within 0.4% of the bound every time, HiGHS
within its 0.5 s at 0.01-50% above it (worse in 50 of 64). On 60 sequences of 128-30,000 tokens
under three strategies (106 packings) the greedy was 0-34% above the bound, HiGHS 0-34% (better in
48 of 106, by up to 13%). So every count is packed greedily, and only the REFINED best go to
the MILP, where the greedy leaves room: one plan then spends at most REFINED x SOLVE_SECONDS per
pipeline in HiGHS (Hetu solves every count, in a process pool)."""


@own_rule
class HydraulisStrategies(StrategyChoice):
    """Hydraulis' two stages and choice among strategies (module docstring)."""

    name = "hydraulis"

    def __init__(self, prices: StrategyPrices, options: PlannerOptions | None = None):
        for strategy in prices.strategies:
            if any(p.pool > 1 for p in strategy.pipelines):
                raise ValueError(f"planner hydraulis: strategy {strategy} has a pipeline of several replicas; "
                                 f"Hydraulis' pipelines are one replica each: write each replica as a pipeline")
        super().__init__(self.name, prices, options)

    def choose(self, candidates: list[Strategy], samples: Sequence[Sample]) -> StrategyPlan:
        """The plan under the candidate whose slowest pipeline's makespan is least (the first on a tie)."""
        plans = [plan for strategy in candidates if (plan := self.plan_on(strategy, samples)) is not None]
        if not plans:
            raise InfeasibleError(f"planner hydraulis: the batch's longest sequence ({max(map(tokens, samples))} "
                                  f"tokens) fits no pipeline of {named(candidates)} without recomputation, which "
                                  f"Hydraulis runs none of; give a strategy with larger pipelines, or a planner "
                                  f"that recomputes (ballast)")
        return min(plans, key=lambda p: p.info["makespan_s"])

    def plan_on(self, strategy: Strategy, samples: Sequence[Sample]) -> StrategyPlan | None:
        """Stages 1 and 2 on `strategy`, the slowest pipeline's makespan in the plan's info; None
        when a sequence fits none of its pipelines without recomputation."""
        lengths = [tokens(s) for s in samples]
        costs = self.prices.costs[strategy]
        stages = [p.pp for p in strategy.pipelines]
        c = stage_seconds(costs, samples, stages)
        if not np.isfinite(c).any(axis=0).all():
            return None
        ids, _ = dispatch(c, stages, self.options.seed)
        parts, makespans = [], []
        for cost, p, held in zip(costs, stages, ids):
            part, makespan = pack(cost, p, [samples[j] for j in held])
            part.tokens = sum(lengths)
            parts.append(part)
            makespans.append(makespan)
        return StrategyPlan(strategy, parts, ids, lengths, sum(lengths), self.name, {"makespan_s": max(makespans)})


def stage_seconds(costs: Sequence[CostModel], samples: Sequence[Sample], stages: Sequence[int],
                  recompute: float = 0.0) -> np.ndarray:
    """c[j, i]: one stage of pipeline j on sample i alone, without recomputation (inf where the
    pipeline does not hold it at the `recompute` level: Hydraulis' none)."""
    s = np.array([tokens(x) for x in samples], dtype=np.float64)
    out = np.empty((len(costs), len(s)))
    for j, (cost, p) in enumerate(zip(costs, stages)):
        held = s <= cost.max_tokens(1, recompute)
        out[j] = np.where(held, cost.work(s, cost.units(samples)) / p, np.inf)
    return out


def dispatch(c: np.ndarray, stages: Sequence[int], seed: int) -> tuple[list[list[int]], float]:
    """Stage 1 (module docstring): sequence ids per pipeline, ascending, and the winning M. The
    TRIALS shuffles run side by side, a sequence of each at a time (the same floats and ties as
    one trial after another: a Python loop over sequences, not over trials and sequences)."""
    pipelines, n = c.shape
    warm = np.asarray(stages, dtype=np.float64) - 1.0
    fits = np.isfinite(c)
    forced = fits.sum(axis=0) == 1
    rng = np.random.default_rng(seed)
    orders = np.empty((TRIALS, n), dtype=np.int64)
    for t in range(TRIALS):
        order = rng.permutation(n)
        orders[t] = np.concatenate([order[forced[order]], order[~forced[order]]])
    rows = np.arange(TRIALS)
    acc, w, worst = np.zeros((TRIALS, pipelines)), np.zeros((TRIALS, pipelines)), np.zeros(TRIALS)
    owner = np.empty((TRIALS, n), dtype=np.int64)
    for k in range(n):
        i = orders[:, k]
        ci, fi = c[:, i].T, fits[:, i].T  # [trial, pipeline]
        with np.errstate(invalid="ignore"):  # 0 x inf: a one-stage pipeline that cannot hold i
            value = np.where(fi, np.maximum(worst[:, None], acc + ci + np.maximum(w, warm * ci)), np.inf)
        ties = value == value.min(axis=1, keepdims=True)
        empty = ties & (acc == 0.0)
        # The last empty pipeline among the ties, else the first tie.
        j = np.where(empty.any(axis=1), pipelines - 1 - np.argmax(empty[:, ::-1], axis=1), np.argmax(ties, axis=1))
        cj = ci[rows, j]
        acc[rows, j] += cj
        w[rows, j] = np.maximum(w[rows, j], warm[j] * cj)
        worst = np.maximum(worst, acc[rows, j] + w[rows, j])
        owner[rows, i] = j
    best = int(np.argmin(worst))  # the first trial on a tie
    return [np.flatnonzero(owner[best] == j).tolist() for j in range(pipelines)], float(worst[best])


def pack(cost: CostModel, stages: int, samples: Sequence[Sample]) -> tuple[Plan, float]:
    """Stage 2 (module docstring): the pipeline's plan (one group of its one rank, micro-batches
    largest first) and its makespan; an idle pipeline's plan is empty."""
    if not samples:
        return Plan([], [], tp=cost.mesh.tp, pp=stages, planner=HydraulisStrategies.name), 0.0
    batch = SampleBatch.of(samples, cost)
    s = np.asarray(batch.lengths, dtype=np.float64)
    c = cost.work(s, batch.units) / stages
    cap = cost.max_tokens(1, 0.0)

    def makespan(bins: list[list[int]]) -> float:
        return (max(c[b].sum() for b in bins) + cost.g) * (stages - 1 + len(bins))

    least = max(1, math.ceil(s.sum() / cap))
    greedy = [bins for v in range(least, min(len(s), least + COUNTS - 1) + 1)
              if (bins := greedy_balance(c, s, v, cap)) is not None]
    assert greedy, "one micro-batch per sequence always fits the cap"
    greedy.sort(key=makespan)
    best = greedy[0]
    for bins in greedy[:REFINED]:
        if (better := refine(c, s, bins, cap)) is not None and makespan(better) < makespan(best):
            best = better
    best = sorted(best, key=lambda b: -s[b].sum())
    mbs = [MicroBatch(b, 0.0) for b in best]
    plan = Plan(batch.lengths, [Wave([Group(0, 1, mbs)])], shapes=batch.shapes, planner=HydraulisStrategies.name,
                tp=cost.mesh.tp, pp=stages)
    return plan, makespan(best)


def greedy_balance(c: np.ndarray, s: np.ndarray, v: int, cap: int) -> list[list[int]] | None:
    """Sequence ids into at most v micro-batches of at most `cap` tokens, heaviest c first to the
    lightest micro-batch with room (`hydraulis.balance_under_cap`); None if one finds no room."""
    items = sorted(range(len(c)), key=lambda i: -c[i])
    return balance_under_cap(items, s.astype(int).tolist(), dict(enumerate(c.tolist())), v, cap)


def refine(c: np.ndarray, s: np.ndarray, bins: list[list[int]], cap: int) -> list[list[int]] | None:
    """The MILP's packing into as many micro-batches as `bins`, where the greedy's is more than GAP
    above the bound max(largest c, sum c / v) and HiGHS finds a better one in time; else None."""
    v, heaviest = len(bins), max(c[b].sum() for b in bins)
    if heaviest <= max(c.max(), c.sum() / v) * (1 + GAP):
        return None
    solved = solve_balance(c, s, v, cap)
    return solved if solved is not None and max(c[b].sum() for b in solved) < heaviest else None


def solve_balance(c: np.ndarray, s: np.ndarray, v: int, cap: int) -> list[list[int]] | None:
    """min z s.t. every sequence in one of v micro-batches, each holding at most `cap` tokens and
    sum c <= z (Hydraulis' stage-2 program; the heaviest sequence fixed to micro-batch 0 against
    the bins' symmetry). None when HiGHS finds no packing within SOLVE_SECONDS."""
    n = len(c)
    x = np.arange(n * v).reshape(n, v)  # x[i, k]: sequence i in micro-batch k
    rows_n, rows_v = np.repeat(np.arange(n), v), np.tile(np.arange(v), n)
    one = coo_matrix((np.ones(n * v), (rows_n, x.ravel())), shape=(n, n * v + 1))
    load = coo_matrix((np.concatenate([np.repeat(c, v), -np.ones(v)]),
                       (np.concatenate([rows_v, np.arange(v)]), np.concatenate([x.ravel(), np.full(v, n * v)]))),
                      shape=(v, n * v + 1))
    room = coo_matrix((np.repeat(s, v), (rows_v, x.ravel())), shape=(v, n * v + 1))
    constraints = LinearConstraint(vstack([one, load, room]), np.concatenate([np.ones(n), np.full(2 * v, -np.inf)]),
                                   np.concatenate([np.ones(n), np.zeros(v), np.full(v, float(cap))]))
    lower, upper = np.zeros(n * v + 1), np.concatenate([np.ones(n * v), [np.inf]])
    lower[x[int(np.argmax(c)), 0]] = 1.0
    objective = np.zeros(n * v + 1)
    objective[-1] = 1.0
    result = milp(objective, constraints=constraints, integrality=np.concatenate([np.ones(n * v), [0]]),
                  bounds=Bounds(lower, upper), options={"time_limit": SOLVE_SECONDS, "disp": False})
    if result.x is None:
        return None
    chosen = result.x[:-1].reshape(n, v).argmax(axis=1)
    return [b for b in (np.flatnonzero(chosen == k).tolist() for k in range(v)) if b]
