"""Step 2 of the `ballast` planner: ranks to degree classes, as whole groups.

Given each sequence's degree (its class) and its time alone at that degree, a class gets
groups in proportion to its area (devices x seconds), at least one; spare ranks go a group at a
time to the class whose groups are most loaded; then ranks move between classes while that
shortens the slowest (`_rebalance`). A class's load is `class_load`, a lower bound on its
slowest group that counts granularity.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

# Rank moves between degree classes after the proportional allocation (`_rebalance`).
REBALANCE_MOVES = 16


def class_load(total: float, times: list[float], groups: int) -> float:
    """A lower bound on the slowest of `groups` groups sharing items of these times (longest
    first, summing to `total`): the mean, the longest item, and, by pigeonhole, two of the
    `groups` + 1 longest in one group. Granularity matters: 3 equal sequences on 2 groups
    take 2 units, not 1.5."""
    pair = times[groups - 1] + times[groups] if len(times) > groups else 0.0
    return max(total / groups, times[0], pair)


def allocate(times: np.ndarray, choice: np.ndarray, deg: list[int], world_size: int) -> list[int] | None:
    """Degrees of the wave's groups, largest first, for sequences of these `times` at degree
    rows `choice` (indices into `deg`); None if the classes cannot all fit."""
    n = world_size
    class_area = np.bincount(choice, weights=times * np.asarray(deg)[choice], minlength=len(deg))
    per_rank = float(class_area.sum()) / n
    # Each class's times longest first and their total: class_load's inputs, in Python
    # scalars because the loops below evaluate it a few hundred times per plan.
    order = np.lexsort((-times, choice))
    starts = np.searchsorted(choice[order], np.arange(len(deg) + 1)).tolist()
    classes = {i: times[order[starts[i]:starts[i + 1]]] for i in range(len(deg)) if starts[i + 1] > starts[i]}
    totals = {i: float(t.sum()) for i, t in classes.items()}
    longest = {i: t.tolist() for i, t in classes.items()}

    def load(i: int, count: int) -> float:
        return class_load(totals[i], longest[i], count)

    groups = [0] * len(deg)
    for i in classes:
        ideal = float(class_area[i]) / (per_rank * deg[i]) if per_rank > 0 else 1
        groups[i] = min(len(longest[i]), max(1, int(ideal)))
    # Rounding small classes up to one group can overflow: take groups back from the
    # class whose groups stay least loaded without one.
    while sum(k * d for k, d in zip(groups, deg)) > n:
        shrinkable = [i for i in classes if groups[i] > 1]
        if not shrinkable:
            return None
        i = min(shrinkable, key=lambda i: load(i, groups[i] - 1))
        groups[i] -= 1
    spare = n - sum(k * d for k, d in zip(groups, deg))
    # Spare ranks go, a group at a time, to the class whose groups are most loaded.
    heap = [(-load(i, groups[i]), i) for i in classes]
    heapq.heapify(heap)
    while heap and spare:
        _, i = heapq.heappop(heap)
        if deg[i] > spare or groups[i] >= len(longest[i]):
            continue
        groups[i] += 1
        spare -= deg[i]
        heapq.heappush(heap, (-load(i, groups[i]), i))
    _rebalance(groups, {i: len(t) for i, t in longest.items()}, deg, spare, load)
    return [deg[i] for i in reversed(range(len(deg))) for _ in range(groups[i])]


def _rebalance(groups: list[int], sizes: dict[int, int], deg: list[int], spare: int,
               load: Callable[[int, int], float]) -> None:
    """Move ranks to the most loaded class (of `sizes[i]` sequences) from the class that stays
    least loaded without them, while that lowers the larger of the two loads. Whole-group
    rounding by area can starve a class of few long sequences: two 38K-token sequences sharing
    one degree-4 group while 52 degree-1 groups wait at half that load."""
    for _ in range(REBALANCE_MOVES):
        i = max(sizes, key=lambda c: load(c, groups[c]))
        if groups[i] >= sizes[i]:
            return
        need = max(0, deg[i] - spare)
        donors = [(load(j, groups[j] - k), j, k) for j in sizes if j != i
                  for k in [-(-need // deg[j])] if groups[j] - k >= 1]
        if not donors:
            return
        after, j, k = min(donors)
        if max(after, load(i, groups[i] + 1)) >= load(i, groups[i]) - 1e-12:
            return
        groups[j] -= k
        groups[i] += 1
        spare += k * deg[j] - deg[i]
