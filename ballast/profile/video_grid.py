"""What the profiler measures of a video model: clips (`grid.Point`s of (frames, height, width)
latent patches) chosen so that the fit can separate its terms.

The video grid (`build_video_grid`) crosses clips with every degree and recompute level, as the
text grid does sequences. Which clips depends on what the fit must separate (`video_clips`):
under `full` attention a clip costs by its token count n alone (2 n^2 units), so clips of
several token counts; under `spatial-temporal` a clip of F frames of S patches costs F S^2 in
its spatial blocks and S F^2 in its temporal ones, so at every token count n = F S clips of few
large frames (S >> F), of many small frames (F >> S) and one in between: the columns n, n S and
n F of the fit then have full rank (at one aspect per token count, F S^2 and S F^2 would be
proportional to n^2 and collinear).
"""
from __future__ import annotations

import math
from typing import Sequence

from ..vocabulary.patterns import AttentionPattern, as_pattern
from .grid import Point, Shape, recompute_levels


def clip_shape(tokens: int, frames: int) -> Shape:
    """A clip of about `tokens` patches in `frames` frames (at least one patch per frame), its
    frames as square as the patches per frame allow: (F, H, W) with H <= W."""
    frames = max(1, min(frames, tokens))
    per_frame = max(1, round(tokens / frames))
    height = max(h for h in range(1, math.isqrt(per_frame) + 1) if per_frame % h == 0)
    return frames, height, per_frame // height


def video_clips(attention: AttentionPattern | str, sizes: Sequence[int], degrees: Sequence[int]) -> list[Shape]:
    """The clips of the video grid, by token count (see the module doc).

    `full`: one clip per size, frames and patches per frame alike (the shape does not matter).
    `spatial-temporal`: per size n, few large frames (F = max(2, largest degree)), many small
    ones (S = max(4, largest degree) patches per frame) and F ~ S ~ sqrt(n); both layouts of the
    2D sequence parallelism (whole frames, whole patch columns per rank) then have at least one
    frame or column per rank.
    """
    pattern = as_pattern(attention)
    if not pattern.clips:
        raise ValueError(f"no video grid for attention {pattern!r}")
    clips: list[Shape] = []
    widest = max(degrees)
    for n in sorted(set(sizes)):
        balanced = 1 << (max(n, 1).bit_length() - 1) // 2
        frames = ([balanced] if not pattern.split_fit else
                  [max(2, widest), balanced, max(1, n // max(4, widest))])
        clips += [clip_shape(n, f) for f in frames]
    return list(dict.fromkeys(clips))


def build_video_grid(layers: int, clips: Sequence[Shape], degrees: Sequence[int]) -> list[Point]:
    """Single clips x degree x recompute level, plus packed micro-batches at every degree
    without recomputation: the clips of the smallest token count together (several copies of it
    when there is only one), to see that a stream of several clips costs their sum; and dozens
    of tiny clips filling a quarter of the largest, whose cost is mostly per span, clip and
    kernel call, twice: copies of a few shapes (`tiny_clips`: few calls) and as many distinct
    shapes (`distinct_tiny_clips`: a call per clip, as in a real batch). They separate the span,
    sample and call terms from the others and from each other (`columns.separates_calls`)."""
    clips = sorted(dict.fromkeys(tuple(c) for c in clips), key=lambda c: (math.prod(c), c))
    points = [Point.of(layers, [c], d, k) for c in clips for d in degrees for k in recompute_levels(layers)]
    smallest = [c for c in clips if math.prod(c) == math.prod(clips[0])]
    packed = [smallest if len(smallest) > 1 else smallest * 4] + tiny_packs(clips, degrees)
    return points + [Point.of(layers, p, d, 0) for p in packed for d in degrees]


def tiny_packs(clips: Sequence[Shape], degrees: Sequence[int]) -> list[list[Shape]]:
    """The video grid's two packs of tiny clips filling a quarter of the largest clip: copies of
    `tiny_clips`, and as many tokens of `distinct_tiny_clips`; none where that quarter holds fewer
    than two copies."""
    tiny = tiny_clips(degrees)
    copies = max(map(math.prod, clips)) // 4 // sum(map(math.prod, tiny))
    if copies < 2:
        return []
    return [tiny * copies, distinct_tiny_clips(degrees, copies * sum(map(math.prod, tiny)))]


def video_packed_clips(clips: Sequence[Shape], degrees: Sequence[int]) -> list[Shape]:
    """The packed stream of a video model's remap points: the tiny clips of distinct shapes
    (`tiny_packs`), or four copies of the smallest clip where the grid has no tiny packs."""
    packs = tiny_packs(clips, degrees)
    return packs[-1] if packs else [min(clips, key=lambda c: (math.prod(c), tuple(c)))] * 4


def tiny_clips(degrees: Sequence[int]) -> list[Shape]:
    """Tiny clips of TINY_SHAPES shapes, the smallest every degree's layout can split (as many
    frames and patches per frame as the widest degree has ranks: one frame or patch column each,
    2D video SP) and a little longer or wider. Several shapes, because a kernel runs the spans of
    one shape together: a stream of one tiny shape would show a clip's cost as nearly nothing,
    where a real batch of clips holds many shapes."""
    widest = max(max(degrees), 2)
    return [(widest + i // 2, 1, widest + (i + 1) // 2) for i in range(TINY_SHAPES)]


def distinct_tiny_clips(degrees: Sequence[int], tokens: int) -> list[Shape]:
    """Tiny clips of pairwise distinct token counts, at least `tokens` of them in all: the
    smallest (frames, 1, width) grids the widest degree's layout can split, one per product,
    frames and width swapped every other clip so that frame sizes and frame counts vary too.
    Every clip is a kernel call of its own on the CPU path (`models.kernels`), as in a real batch
    of clips of many shapes."""
    widest = max(max(degrees), 2)
    out, total, n = [], 0, widest * widest
    while total < tokens:
        pairs = [(f, n // f) for f in range(widest, math.isqrt(n) + 1) if n % f == 0 and n // f >= widest]
        if pairs:
            f, w = pairs[len(out) % len(pairs)]
            out.append((f, 1, w) if len(out) % 2 == 0 else (w, 1, f))
            total += n
        n += 1
    return out


TINY_SHAPES = 6
"""Distinct shapes among the video grid's tiny clips (`tiny_clips`)."""


def video_verification_points(layers: int, clips: Sequence[Shape], degrees: Sequence[int],
                              count: int) -> list[Point]:
    """Full-depth points that check the depth extrapolation on clips: the largest clips of
    every aspect, then a middle one, alternating the extreme degrees and recompute levels."""
    clips = sorted(dict.fromkeys(tuple(c) for c in clips), key=lambda c: (math.prod(c), c))
    largest = [c for c in clips if math.prod(c) == math.prod(clips[-1])]
    middle = clips[len(clips) // 2]
    choices = [(largest[0], degrees[0], 0), (largest[-1], degrees[-1], layers),
               (middle, degrees[-1], 0), (largest[len(largest) // 2], degrees[0], layers),
               (largest[0], degrees[-1], layers // 2), (clips[0], degrees[0], 0)]
    return [Point.of(layers, [c], d, k) for c, d, k in dict.fromkeys(choices)][:count]
