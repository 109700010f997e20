"""Any planner on a strategy's pipelines (docs/design.md, section 6, *Strategies*): the batch's
sequences assigned to the pipelines, then each pipeline's part planned by its own instance of the
planner over its pool, at its (t, p), so every planner's tables under a strategy compare like with
like.

The assignment is greedy, longest sequence first, each to the pipeline that keeps the slowest
pipeline's estimate least (Hydraulis' stage-1 objective, made deterministic and given pools):

    estimate_i = sum_s w_i(s) / (p_i pool_i) + (p_i - 1) max_s w_i(s) / p_i

with w_i(s) the work sequence s adds alone on one pool rank of pipeline i at the least SP degree
that holds it (`pricing/sequence_times.py`: without a micro-batch's fixed cost; times that
degree: the pool's rank-seconds); a sequence that fits only some
pipelines goes to one of them (a sequence no pipeline holds is refused, naming the largest). The
`hydraulis` planner has its own, randomised, assignment; this one is the rest's.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..plans.plan import Plan
from ..plans.strategy_plan import StrategyPlan
from ..pricing.cost import CostModel
from ..pricing.coefficients import InfeasibleError
from ..pricing.sequence_times import sequence_times
from ..vocabulary.cluster import Cluster
from ..vocabulary.samples import Sample, tokens
from ..vocabulary.strategy import Strategy
from .base import PlannerOptions
from .registry import get_planner


class StrategyPlanner:
    """Planner `name` on every pipeline of `strategy` (module docstring)."""

    def __init__(self, name: str, strategy: Strategy, cluster: Cluster, costs: Sequence[CostModel],
                 options: PlannerOptions | None = None):
        assert len(costs) == len(strategy.pipelines), (len(costs), strategy)
        self.name, self.strategy, self.costs = name, strategy, list(costs)
        pools = [strategy.mesh(i, cluster).pool_cluster(strategy.block_cluster(i, cluster))
                 for i in range(len(strategy.pipelines))]
        self.planners = [get_planner(name, pool, cost, options) for pool, cost in zip(pools, costs)]

    def plan(self, samples: Sequence[Sample]) -> StrategyPlan:
        """The step's plan: the assignment, then each part planned by its pipeline's planner."""
        if not len(samples):
            raise ValueError("cannot plan an empty batch")
        return self.place(samples, self.assign(samples))

    def place(self, samples: Sequence[Sample], ids: list[list[int]]) -> StrategyPlan:
        """The step's plan of an assignment: `ids[i]`, the sequences of pipeline i, planned by its planner."""
        lengths = [tokens(s) for s in samples]
        total = sum(lengths)
        parts = []
        for i, (planner, held) in enumerate(zip(self.planners, ids)):
            layout = self.strategy.pipelines[i]
            part = planner.plan([samples[j] for j in held]) if held else Plan([], [], tp=layout.tp, pp=layout.pp)
            part.tokens = total
            parts.append(part)
        return StrategyPlan(self.strategy, parts, ids, lengths, total, self.name)

    def assign(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Sequence ids per pipeline (module docstring)."""
        work = np.array([_pool_seconds(cost, samples) for cost in self.costs])  # [pipeline, sample]
        stages = np.array([p.pp for p in self.strategy.pipelines], dtype=float)
        ranks = np.array([p.pp * p.pool for p in self.strategy.pipelines], dtype=float)
        summed, longest = np.zeros(len(stages)), np.zeros(len(stages))
        ids: list[list[int]] = [[] for _ in stages]
        # Vectorised over pipelines (a thousand ranks run a hundred of them): the estimate with j on
        # pipeline i against the slowest of the others, the same floats as one estimate at a time.
        for j in sorted(range(len(samples)), key=lambda j: -tokens(samples[j])):
            w = work[:, j]
            fits = np.isfinite(w)
            if not fits.any():
                raise InfeasibleError(f"sequence {j} ({tokens(samples[j])} tokens) fits no pipeline of strategy "
                                      f"{self.strategy}, not even at the largest SP degree of each pool with every "
                                      f"layer recomputed")
            now = summed / ranks + (stages - 1) * longest / stages
            with np.errstate(invalid="ignore"):  # 0 x inf: a one-stage pipeline that cannot hold j (masked below)
                with_j = (summed + w) / ranks + (stages - 1) * np.maximum(longest, w) / stages
            top = int(np.argmax(now))
            others = np.full(len(now), now[top])
            others[top] = np.max(np.delete(now, top), initial=-np.inf)
            worst = np.where(fits, np.maximum(others, with_j), np.inf)
            # The least (worst, its own estimate), the first pipeline on a tie.
            tied = fits & (worst == worst.min())
            best = int(np.flatnonzero(tied & (with_j == with_j[tied].min()))[0])
            ids[best].append(j)
            summed[best] += w[best]
            longest[best] = max(longest[best], w[best])
        return [sorted(held) for held in ids]


def _pool_seconds(cost: CostModel, samples: Sequence[Sample]) -> np.ndarray:
    """Rank-seconds of each sample alone on a pool rank of `cost`'s pipeline, at the least degree
    (and recompute level) that holds it (`sequence_times`: its work, times that degree); inf
    where none does."""
    times = sequence_times(cost, samples)
    held = np.isfinite(times)
    least = held.argmax(axis=0)
    columns = np.arange(times.shape[1])
    return np.where(held.any(axis=0), np.array(cost.degrees)[least] * times[least, columns], np.inf)
