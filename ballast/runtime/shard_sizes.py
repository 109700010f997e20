"""The one even cut of the runtime: n rows over d ranks, contiguous, sizes differing by at most one.

Ulysses' shards (`attention.StreamShard`), a remap domain's balanced layout, the CP chunks'
split over a Ulysses sub-group, the routed exchange's chunks over a node's NICs all cut so;
a leaf module, so that every one of them can import it (`routing` and `attention` import each
other's work the one way only).
"""
from __future__ import annotations


def shard_sizes(tokens: int, degree: int) -> tuple[int, ...]:
    """Contiguous shard sizes of a stream of `tokens` over `degree` ranks: the first
    tokens % degree ranks hold one token more."""
    return tuple(tokens // degree + (i < tokens % degree) for i in range(degree))
