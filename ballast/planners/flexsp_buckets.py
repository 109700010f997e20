"""FlexSP's length bucketing (`flexsp`): a wave's lengths in at most k buckets, chosen by DP for
the least padding, which keeps its MILP (`flexsp_milp.py`) small: the MILP places counts of each
bucket, priced at the bucket's longest for memory."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Buckets:
    """A wave's sequences in length buckets; indices refer to the lengths given to `dp_buckets`."""

    members: list[list[int]]
    """Sequence indices of each bucket, longest first; buckets in ascending length."""
    upper: list[int]
    """Longest sequence of each bucket: what a group's memory must be able to hold."""
    padding: int
    """sum over sequences of (bucket upper - length): the error the DP minimises."""



def optimal_bucket_ends(values: np.ndarray, counts: np.ndarray, k: int) -> tuple[list[int], int]:
    """Split ascending distinct `values` (with multiplicities) into at most k contiguous buckets
    minimising the padding sum (bucket max - value); returns each bucket's end index (exclusive).

    Contiguous buckets suffice: swapping two values between buckets out of order never lowers
    the padding. dp[b, j] = least padding of values[:j] in b buckets; O(k n^2), vectorised over
    the start of the last bucket.
    """
    n = len(values)
    assert n >= 1 and k >= 1 and len(counts) == n
    k = min(k, n)
    v = values.astype(np.float64)
    cnt = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)])
    tok = np.concatenate([[0.0], np.cumsum(v * counts)])
    dp = np.full((k + 1, n + 1), np.inf)
    dp[0, 0] = 0.0
    start = np.zeros((k + 1, n + 1), dtype=np.int64)
    for b in range(1, k + 1):
        for j in range(b, n + 1):
            cand = dp[b - 1, :j] + v[j - 1] * (cnt[j] - cnt[:j]) - (tok[j] - tok[:j])
            i = int(np.argmin(cand))
            dp[b, j], start[b, j] = cand[i], i
    ends, j = [], n
    for b in range(k, 0, -1):  # more buckets never pad more, so exactly k is optimal
        ends.append(j)
        j = int(start[b, j])
    assert j == 0
    return ends[::-1], int(round(dp[k, n]))


def dp_buckets(lengths: Sequence[int], k: int) -> Buckets:
    """FlexSP's bucketing: at most k buckets of the lengths chosen by DP for the least padding."""
    s = np.asarray(lengths, dtype=np.int64)
    values, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends, padding = optimal_bucket_ends(values, counts, k)
    bucket_of_value = np.searchsorted(np.asarray(ends), np.arange(len(values)), side="right")
    bucket = bucket_of_value[inverse]
    members = [sorted(np.flatnonzero(bucket == b).tolist(), key=lambda i: -s[i]) for b in range(len(ends))]
    upper = [int(values[e - 1]) for e in ends]
    return Buckets(members, upper, padding)
