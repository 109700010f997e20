"""What a text model's Ulysses all-to-alls exchange, and the check that the runs exchanged it.

The profile prices a block's exchange as `shape_bytes_per_token_layer` values per token, each
of the size the runs sent. The count of values is the runtime's contract with the formula;
the size is whatever dtypes the runs exchanged (fp32 on CPUs, bf16 under autocast, or a mix if
some tensor escaped the autocast dtype), so it is read from the bytes and values the runs sent
(`value_bytes`), never assumed. The count is checked on the ranks at the first round of every
point (`check_exchanged_values`), so a runtime that no longer exchanges what the formula counts
fails before the grid is measured, not after.
"""
from __future__ import annotations

from ..vocabulary.model_shape import ModelShape
from .grid import Point


def shape_bytes_per_token_layer(shape: ModelShape, value_bytes: float, degree: int = 1) -> float:
    """All-to-all send bytes per token and block at SP degree `degree`: q+k+v then out in
    forward, both again in backward, `value_bytes` each (4 in fp32, 2 in bf16); k and v with
    the kv heads the degree exchanges (`layouts.HeadLayout.exchanged_kv_heads`; degree 1: the model's own)."""
    kv_dim = shape.pattern.layout.exchanged_kv_heads(shape.kv_heads, degree) * shape.head_dim
    return 2.0 * (2 * shape.hidden + 2 * kv_dim) * value_bytes


def even_single(point: Point) -> bool:
    """One sequence whose tokens every rank of the degree shares equally: its ranks' send buffers
    are exactly `shard_tokens` rows (a packed stream's or an uneven split's largest shard is not
    every rank's), so its count of values can be read exactly."""
    return len(point.lengths) == 1 and point.tokens % point.degree == 0


def expected_values(point: Point, shape: ModelShape, shard_tokens: int) -> float:
    """Values a rank sends through a Ulysses point's all-to-alls: its shard through every
    exchange, a plain block once per direction and pass, a recomputed one's forward pair again
    when it is recomputed."""
    return shard_tokens * (point.layers + point.recompute_layers / 2) * shape_bytes_per_token_layer(shape, 1, point.degree)


def checks_exchange(point: Point) -> bool:
    """Whether a point's exchanged values are read exactly: Ulysses alone, one even sequence."""
    return point.degree > 1 and point.cp == 1 and even_single(point)


def check_exchanged_values(point: Point, shape: ModelShape, shard_tokens: int, values: int) -> None:
    """Raise if a text point's all-to-alls sent another count of values than the formula's."""
    if checks_exchange(point):
        expected = expected_values(point, shape, shard_tokens)
        if values != expected:
            raise ValueError(f"the all-to-alls of {point.label()} sent {values} values of {shape.name!r}'s q, k, v "
                             f"and output, not the {expected:.0f} shape_bytes_per_token_layer counts "
                             f"({values / expected:.3f}x): the runtime no longer exchanges what the profile prices")
