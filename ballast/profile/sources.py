"""Where the profile's held-out points, a video grid's source packs and `--check`'s batches come
from: the real lengths or clips a model trains on (`stdlib` code files for a text model, DCP's
video buckets for a video model), a video source scaled down to what a CPU can run."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

from ..dataset.clip_sources import ClipSource, scale_shapes
from ..dataset.length_stream import BatchSpec, LengthStream
from ..dataset.lengths import LengthSource, get_length_source
from ..vocabulary.model_shape import ModelShape
from ..vocabulary.samples import Sample, tokens
from .grid import Point


def default_source(shape: ModelShape) -> str:
    """The length source a model's check and held-out points draw from by default."""
    return "video" if shape.pattern.clips else "stdlib"


def scaled_clips(source: ClipSource, max_tokens: int) -> ClipSource:
    """`source` shrunk so that its largest clip has at most `max_tokens` tokens, with the
    source's weights: every clip's frames, height and width times one factor, as
    `video-synthetic` scales DCP's buckets (`clips.scale_shapes`). Clips keep their aspect, long
    clips stay long and wide ones wide."""
    return ClipSource(f"{source.name} scaled to {max_tokens} tokens", scale_shapes(source.shapes, max_tokens)[0],
                      source.p)


def check_source(spec: str, shape: ModelShape, max_len: int) -> LengthSource:
    """The length source `spec` in `shape`'s geometry; clip sources scaled to `max_len` tokens."""
    source = get_length_source(spec, shape.video_geometry)
    return scaled_clips(source, max_len) if isinstance(source, ClipSource) else source


def held_out_points(shape: ModelShape, depth: int, splits: Sequence[tuple[int, int]], levels: Sequence[int],
                    max_tokens: int, count: int, seed: int) -> list[Point]:
    """`count` micro-batches the fit never sees, each one batch from the model's default source
    (`default_source`: real lengths or clips) at `depth` blocks, a random (degree, cp) split of
    `splits` and a random number of recomputed blocks of `levels`, of a budget drawn
    log-uniformly between an eighth of `max_tokens` and the most a grid micro-batch of that
    degree holds (`grid_reach`; text split at the budget, clips packed into it: `packed_clips`).
    The profile measures them in the same rounds as the grid and reports their error apart from
    the fit's residuals: the model's error on real micro-batches with no change of the machine
    between fit and test."""
    source = check_source(default_source(shape), shape, max_tokens)
    rng = np.random.default_rng(seed)
    points = []
    for i in range(count):
        position = rng.random()
        degree, cp = splits[rng.integers(len(splits))]
        reach = grid_reach(shape, degree, max_tokens)
        budget = int(round(reach * (reach / (max_tokens / 8)) ** -position))
        if isinstance(source, ClipSource):
            batch = packed_clips(source, budget, max_tokens, seed + i)
        else:  # text is split at the budget
            batch = LengthStream(source, BatchSpec(tokens_per_step=budget, max_len=budget), seed + i).next_batch()
        point = Point.of(depth, batch, degree, int(levels[rng.integers(len(levels))]))
        points.append(dataclasses.replace(point, cp=cp))
    return points


HELD_OUT_POOL = 4
"""A held-out pack of clips chooses from this many budgets' worth of the source's draws (or of
the largest clip's, for budgets below it)."""


def packed_clips(source: ClipSource, budget: int, max_tokens: int, seed: int) -> list[Sample]:
    """Clips of `source` (the grid's largest, `max_tokens`, bounds every one) packed into
    `budget` tokens as a planner packs a micro-batch: each draw in turn joins if it fits what is
    left. A clip cannot be cut below a frame, so taking draws until the first that overflows
    (`LengthStream.next_batch`) would end most batches far short of their budget, at whichever
    large clip came up: micro-batches of a few dozen tokens, not the ones training runs."""
    spec = BatchSpec(tokens_per_step=HELD_OUT_POOL * max(budget, max_tokens), max_len=max_tokens)
    batch, room = [], budget
    for clip in LengthStream(source, spec, seed).next_batch():
        if (size := tokens(clip)) <= room:
            batch.append(clip)
            room -= size
    return batch


def grid_reach(shape: ModelShape, degree: int, max_tokens: int) -> int:
    """The most tokens a grid micro-batch of `degree` holds: a video grid's largest source pack
    (`SOURCE_PACK_SHARES`), a text grid's longest sequence."""
    return degree * SOURCE_PACK_SHARES[-1] * max_tokens if shape.pattern.clips else max_tokens


SOURCE_PACK_SEED = 1000
"""Seeds of the source packs' draws start here: apart from the held-out points' (the profile's
seed + i) and the check's (its seed), so neither measures a batch the fit saw."""
SOURCE_PACK_SHARES = (1, 2)
"""A source pack's tokens per rank, in grid's largest clips: a planner packs clips up to what a
rank's share of the step holds, past the longest clip. The video check's default step (4 x
--max-len) gives each of 2 ranks 2 x --max-len, and its plans' degree-1 micro-batches held 3,700
to 5,600 tokens of 2,048-token clips: a grid that stops at one clip's tokens per rank would price
them by extrapolation. (Measured on 2 CPU ranks: refitting a profile without the larger packs
moved its check by about 2 points either way, less than the host's noise between runs.)"""


def source_packs(shape: ModelShape, depths: Sequence[int], degrees: Sequence[int], max_tokens: int,
                 seed: int) -> list[Point]:
    """A video grid's micro-batches of the model's own clips (`default_source`, scaled to the
    grid's largest clip): at every depth, degree d and share of `SOURCE_PACK_SHARES`, one batch of
    d x share x `max_tokens` tokens with no and with every block recomputed.

    A clip source is a mix of a few dozen bucket shapes, most of them small: a real micro-batch
    holds tens of clips of many sizes, which neither the grid's large clips nor its packs of tiny
    ones resemble, and on a CPU such micro-batches cost more per token and per clip than the fit
    of those alone predicts (likely the two busy ranks' contention for caches and memory, which
    differs with the work's grain: alone in one process the same micro-batch ran 25-40% faster).
    Fitting a few of them prices the mix the check and training run (other draws of the same
    source: `SOURCE_PACK_SEED`)."""
    source = check_source(default_source(shape), shape, max_tokens)
    assert isinstance(source, ClipSource), "text grids are of the data's own kind: sequences of any length"
    points = []
    for draw, (depth, degree, share) in enumerate(itertools.product(depths, degrees, SOURCE_PACK_SHARES)):
        spec = BatchSpec(tokens_per_step=degree * share * max_tokens, max_len=max_tokens)
        batch = LengthStream(source, spec, seed + SOURCE_PACK_SEED + draw).next_batch()
        points += [Point.of(depth, batch, degree, level) for level in (0, depth)]
    return points
