"""Remapping the long poles: ballast's move for steps that a few sequences decide.

When a sequence alone takes about the whole step (its degree capped by the heads, it
recomputes to fit its group's memory), no placement of the others shortens the step. In a
remap domain (`Wave.remap`) the same sequence keeps only attention's q, k, v and output in its
group's layout and the rest on the domain's balanced layout (`remapping.memory`), so
it recomputes less or not at all, and its linear work spreads over the domain.

The move puts the poles (sequences alone within `POLE_SHARE` of the plain plan's step), each
in a group of the degree that runs its attention fastest, at the start of an aligned domain
of `size` ranks at the end of the cluster. The domain's other ranks (helpers) each run one
micro-batch beside the poles, of the other sequences, as long as that adds neither
recomputation nor attention time beyond the poles'; the planner itself plans the rest on the
ranks before the domain (the `plan_rest` it passes). Every domain size whose poles alone would beat the plain step is
built, each slot at the level it needs (`Plan.leveled`), and the fastest plan is kept:
the plain one unless a remapped one is faster under the cost model.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...pricing.cost import CostModel
from ...plans.plan import Group, MicroBatch, Plan, Wave, fill_idle
from ...vocabulary.samples import SampleBatch
from ...plans.timeline import step_time
from ...pricing import remapping
from ...pricing.sequence_times import sequence_times

# A sequence alone within this share of the plain plan's step is a pole.
POLE_SHARE = 0.95


PlanRest = Callable[[SampleBatch, int], list[Wave]]
"""The planner's waves for a batch on ranks 0..ranks-1 (`BallastPlanner.waves`)."""


def remap_poles(cost: CostModel, batch: SampleBatch, waves: list[Wave], plan_rest: PlanRest) -> list[Wave]:
    """`waves`, or a faster plan of `batch` with its poles in a remap domain and the rest planned
    by `plan_rest` on the ranks before it."""
    n = cost.world_size
    best = (step_time(Plan(batch.lengths, waves, shapes=batch.shapes), cost), waves)
    times = sequence_times(cost, batch.samples)
    alone = np.min(times, axis=0) + cost.g
    poles = [int(i) for i in np.argsort(-alone, kind="stable") if alone[i] >= POLE_SHARE * best[0]]
    if not poles:
        return waves
    s = np.asarray(batch.lengths, dtype=np.float64)
    attention = [cost.attention_time(s[poles], batch.units[poles]) / d + cost.comm_per_token(d) * s[poles]
                 for d in cost.degrees]
    degree = cost.degrees[int(np.argmin([a.max() for a in attention]))]
    size = 2
    while size < degree * len(poles):
        size *= 2
    while size <= n:
        if n % size == 0 and (level := _promising(cost, batch, poles, degree, size, best[0])) is not None:
            found = _remapped(cost, plan_rest, batch, times, poles, degree, size, level)
            if found is not None and (t := step_time(Plan(batch.lengths, found, shapes=batch.shapes), cost)) < best[0]:
                best = (t, found)
        size *= 2
    return best[1]


def _promising(cost: CostModel, batch: SampleBatch, poles: list[int], degree: int, size: int,
               plain: float) -> float | None:
    """The level the poles' memory needs alone in the domain, if there they beat `plain`."""
    tokens = [batch.lengths[i] for i in poles]
    level = remapping.min_recompute(cost, -(-max(tokens) // degree), -(-sum(tokens) // size))
    if level is None:
        return None
    pole = max(cost.time([batch.samples[i]], degree, level) for i in poles)
    linear = cost.b * sum(tokens) * (1.0 + level * cost.recompute)
    return level if pole - linear / degree + linear / size < plain else None


def _remapped(cost: CostModel, plan_rest: PlanRest, batch: SampleBatch, times: np.ndarray, poles: list[int],
              degree: int, size: int, level: float) -> list[Wave] | None:
    """Waves with the poles (at `level`) and helpers in the domain of the last `size` ranks and
    the rest planned before it; None if the rest cannot run there (`times`: the batch's
    `sequence_times`) or a slot fits at no level."""
    n = cost.world_size
    start = n - size
    # At the split the poles were priced at (`SplitCatalogue.split`): a remap domain's slots are priced at it.
    split = cost.catalogue.split(degree)
    groups = [Group(start + k * degree, degree, [MicroBatch([i])], split) for k, i in enumerate(poles)]
    rest = sorted(set(range(len(batch))) - set(poles))
    helpers = _helpers(cost, batch, poles, degree, size, level, rest)
    groups += [Group(start + len(poles) * degree + h, 1, [MicroBatch(ids)]) for h, ids in enumerate(helpers) if ids]
    rest = sorted(set(rest) - {i for ids in helpers for i in ids})
    before: list[Wave] = []
    if rest:
        if start == 0:
            return None
        if not np.isfinite(times[[d <= start for d in cost.degrees]][:, rest]).any(axis=0).all():
            return None
        sub = SampleBatch.of(batch.pick(rest), cost)
        before = plan_rest(sub, start)
        for wave in before:
            for g in wave.groups:
                for mb in g.micro_batches:
                    mb.seq_ids = [rest[i] for i in mb.seq_ids]
    first = [g for g in before[0].groups if g.micro_batches] if before else []
    waves = [Wave(fill_idle(first + groups, n), [(start, size)])]
    waves += [Wave(fill_idle([g for g in wave.groups if g.micro_batches], n)) for wave in before[1:]]
    plan = Plan(batch.lengths, waves, shapes=batch.shapes)
    remapped = plan.leveled(0, (start, size), cost)
    if remapped is None:
        return None
    waves[0].groups = fill_idle(first + remapped, n)
    return waves


def _helpers(cost: CostModel, batch: SampleBatch, poles: list[int], degree: int, size: int, level: float,
             rest: list[int]) -> list[list[int]]:
    """Sequences for each helper rank's one micro-batch, longest first to the least loaded
    helper, while neither its attention time outgrows the poles' nor the slot's memory its
    `level`."""
    tokens = [batch.lengths[i] for i in poles]
    pole_rank = -(-max(tokens) // degree)
    s = np.asarray(batch.lengths, dtype=np.float64)
    quadratic = cost.attention_time(s, batch.units) * (1.0 + level * cost.recompute_attention)
    limit = max(quadratic[i] / degree + cost.comm(batch.lengths[i], degree) for i in poles)
    helpers: list[list[int]] = [[] for _ in range(size - degree * len(poles))]
    load = np.zeros(len(helpers))
    held = np.zeros(len(helpers), dtype=np.int64)
    total = sum(tokens)
    for i in sorted(rest, key=lambda i: -quadratic[i]):
        h = int(np.argmin(load)) if len(helpers) else -1
        if h < 0 or load[h] + quadratic[i] > limit:
            continue
        att = max(pole_rank, int(held.max()), int(held[h]) + batch.lengths[i])
        fits = remapping.min_recompute(cost, att, -(-(total + batch.lengths[i]) // size))
        if fits is None or fits > level:
            continue
        helpers[h].append(i)
        load[h] += quadratic[i]
        held[h] += batch.lengths[i]
        total += batch.lengths[i]
    return helpers
