"""WLB-LLM's outlier queue: which of a step's candidates wait for a later step.

WLB-LLM (OSDI 2025, its section 4) keeps the documents of at least L_1 tokens in a multi-level
queue (level i holds L_i <= length < L_(i+1)) and lets a level in only when it holds N of them,
N the step's micro-batches, so each micro-batch gets one and no pipeline stalls behind a lone
outlier; the others wait for later steps. `wlb-llm` counts N over its data-parallel replicas,
`ballast` over its pool's ranks (each a pipeline under PP); `held.DeferredSamples` carries the
waiting ones across steps and bounds their wait.
"""
from __future__ import annotations

import math
from typing import Sequence

OUTLIER_LEVELS = (1 / 4, 1 / 2)
"""L_1 < L_2, the outlier queues' least lengths as fractions of max_len. Ours: the paper tunes
them on a sample of the data; two queues are what its Table 2 finds balanced."""


def micro_batch_count(tokens: int, max_len: int, replicas: int) -> int:
    """N: the micro-batches fixed-length packing at `max_len` makes of `tokens`, rounded up to
    a multiple of the replicas (each runs as many)."""
    return replicas * max(1, math.ceil(tokens / (replicas * max_len)))


def release_outliers(lengths: Sequence[int], max_len: int, count: int) -> tuple[list[int], list[int]]:
    """(ids that train now, ids that wait): documents below L_1 and, of every queue level holding
    at least `count` outliers, its first `count` (the earliest drawn); the rest of the queues wait."""
    bounds = [level * max_len for level in OUTLIER_LEVELS]
    queues: list[list[int]] = [[] for _ in bounds]
    first = []
    for i, s in enumerate(lengths):
        level = sum(s >= bound for bound in bounds) - 1
        (first if level < 0 else queues[level]).append(i)
    delayed = []
    for queue in queues:
        if len(queue) >= count:
            first += queue[:count]
            queue = queue[count:]
        delayed += queue
    return sorted(first), sorted(delayed)


def waiting_outliers(lengths: Sequence[int], max_len: int, replicas: int) -> list[int]:
    """The candidates (`lengths`, earliest drawn first) that wait: N is the micro-batch count of
    the documents that train, which the release itself changes, so it is sought from the count
    of all of them down, to the first count whose release makes at least that many micro-batches
    (each try's count is smaller, never below the replicas, where any release holds)."""
    count = micro_batch_count(sum(lengths), max_len, replicas)
    while True:
        first, delayed = release_outliers(lengths, max_len, count)
        fewer = micro_batch_count(sum(lengths[i] for i in first), max_len, replicas)
        if fewer >= count:
            return delayed
        count = fewer
