"""What a profile measures: its settings (`Settings`, which `command.settings_from` reads from
the command line) and their defaults, the SP degrees a model can run, and the points they make:
the grid at the reduced depths with its full-depth checks (`plan_grid`) and the held-out real
micro-batches (`held_out`). `profiler.profile` measures and fits them."""
from __future__ import annotations

import dataclasses

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import SPATIAL_TEMPORAL, AttentionPattern, as_pattern
from ..vocabulary.precision import Precision
from .context import context_splits
from .grid import (Point, build_context_grid, build_grid, recompute_levels, remap_points, tiny_documents,
                   verification_points)
from .measure import checked_statistic
from .sources import held_out_points, source_packs
from .video_grid import build_video_grid, video_clips, video_packed_clips, video_verification_points


@dataclasses.dataclass(frozen=True)
class Settings:
    """What to measure (`settings_from` reads it from the command line; --quick shrinks it)."""

    lengths: tuple[int, ...]
    depths: tuple[int, ...]
    verify: int
    warmup: int = 1
    repeats: int = 3
    seed: int = 0
    statistic: str = "median"
    """How repeats become one number: `median` or `min` (measure.STATISTICS)."""
    held_out: int = 8
    """Micro-batches of real lengths or clips (`sources.held_out_points`) measured with the grid
    but never fitted: their error is reported apart from the fit's own residuals."""
    precision: Precision = Precision.AUTO
    """The ranks' forward precision (`options.PRECISION`): the bytes the exchanges move follow it."""


def default_lengths(max_len: int, quick: bool) -> tuple[int, ...]:
    """Powers of two from 128 to max_len (max_len itself included); every other one when quick."""
    lengths, s = [], 128
    while s < max_len:
        lengths.append(s)
        s *= 2
    lengths = lengths[::-2][::-1] if quick else lengths
    return tuple(lengths + [max_len])


VIDEO_MAX_TOKENS = 2048
"""Default largest clip (tokens) of a video model's grid: CPU-sized, a few minutes on 2 ranks."""


def default_video_sizes(max_tokens: int, quick: bool, attention: AttentionPattern | str = SPATIAL_TEMPORAL
                        ) -> tuple[int, ...]:
    """Token counts of a video model's grid (`video_grid.video_clips` makes clips of them).

    A pattern with one fit term per span (`split_fit`: spatial-temporal): max_tokens and a
    quarter of it, each made into three clips of different aspects, which separate the spatial
    and temporal terms and the linear one (quick changes nothing: fewer would not). One term
    (`full`): one clip per count, so several counts tell the n^2 term from the linear one:
    powers of two from 256 to max_tokens (the largest three when quick)."""
    if as_pattern(attention).split_fit:
        return tuple(sorted({max(16, max_tokens // 4), max_tokens}))
    sizes = default_lengths(max_tokens, quick=False)
    sizes = tuple(s for s in sizes if s >= 256) or (max_tokens,)
    return sizes[-3:] if quick else sizes


def default_depths(shape: ModelShape) -> tuple[int, ...]:
    """Reduced depths to profile at: 1 and 2 blocks; 2 and 4 for a spatial-temporal model, whose
    blocks come in (spatial, temporal) pairs (its depth must be even): one and two rounds of the
    pattern's spans."""
    step = shape.pattern.depth_step
    return (step, 2 * step)


def is_video(shape: ModelShape) -> bool:
    """Whether the model trains on clips (its grid is of clips, see the module doc)."""
    return shape.pattern.clips


def sp_degrees(shape: ModelShape, world_size: int) -> list[int]:
    """Powers of two up to the world that divide the attention heads."""
    return [1 << i for i in range(world_size.bit_length()) if (1 << i) <= world_size
            and shape.supports_degree(1 << i)]


def plan_grid(shape: ModelShape, world_size: int, settings: Settings) -> tuple[list[Point], list[Point]]:
    """(grid at the reduced depths, full-depth points that check the extrapolation)."""
    if world_size < 1 or world_size & (world_size - 1):
        raise ValueError(f"--world must be a power of two, got {world_size}")
    if not settings.lengths or min(settings.lengths) < 1:
        raise ValueError(f"grid lengths must be positive, got {settings.lengths}")
    if settings.repeats < 1 or settings.warmup < 0 or settings.verify < 0:
        raise ValueError("repeats must be >= 1, warm-up and verify >= 0")
    checked_statistic(settings.statistic)
    if min(settings.depths) < 1:
        raise ValueError(f"profiled depths must be >= 1 block, got {settings.depths}")
    degrees = sp_degrees(shape, world_size)
    depths = sorted({min(d, shape.layers) for d in settings.depths})
    if is_video(shape):
        if any(d % shape.pattern.depth_step for d in depths):
            raise ValueError(f"model {shape.name!r} alternates spatial and temporal blocks, so its copies have an "
                             f"even depth: --depths {','.join(map(str, depths))} has an odd one (default "
                             f"{','.join(map(str, default_depths(shape)))})")
        clips = video_clips(shape.pattern, settings.lengths, degrees)
        grid = [p for depth in depths for p in build_video_grid(depth, clips, degrees)
                + remap_points(depth, clips, video_packed_clips(clips, degrees), world_size)]
        grid += source_packs(shape, depths, degrees, max(settings.lengths), settings.seed)
        checks = ([] if shape.layers in depths else
                  video_verification_points(shape.layers, clips, degrees, settings.verify))
        return grid, checks
    splits = context_splits(shape, world_size)
    grid = [p for depth in depths for p in build_grid(depth, settings.lengths, degrees)
            + build_context_grid(depth, settings.lengths, splits)
            + remap_points(depth, settings.lengths, tiny_documents(settings.lengths), world_size)]
    checks = ([] if shape.layers in depths else
              verification_points(shape.layers, settings.lengths, degrees, settings.verify))
    return grid, checks


def held_out(shape: ModelShape, world_size: int, settings: Settings) -> list[Point]:
    """The profile's held-out points: real micro-batches as large as the grid reaches
    (`sources.grid_reach`) at its deepest reduced depth, at the grid's splits and recompute
    levels."""
    if settings.held_out < 0:
        raise ValueError(f"--held-out must be >= 0, got {settings.held_out}")
    depth = min(max(settings.depths), shape.layers)
    splits = [(d, 1) for d in sp_degrees(shape, world_size)]
    if not is_video(shape):
        splits += context_splits(shape, world_size)
    return held_out_points(shape, depth, splits, recompute_levels(depth), max(settings.lengths), settings.held_out,
                           settings.seed)
