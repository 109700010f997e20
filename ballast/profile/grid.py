"""What the profiler measures: grid points (one micro-batch shape each) and their measurements.

A point is one micro-batch: its packed samples (text sequences, or video clips of (frames,
height, width) latent patches), an SP degree, how many of the model's layers are checkpointed,
and the depth of the model it runs on (the profiler runs reduced-depth copies of the model and
extrapolates, as DCP does). The text grid crosses single sequences of every grid length with
every degree and checkpoint level; a few packed micro-batches (several short sequences in one
stream) check that packing costs what the per-sequence sum says, since the runtime attends
sequence by sequence.

A text model whose attention can run context parallelism adds points with a CP part
(`build_context_grid`, `Point.cp`): every (degree, cp) split the heads allow, a few lengths with
and without checkpointing, and packed streams of short and odd documents, whose head-tail
chunks cannot balance exactly (the runtime's CP attention per chunk is what the fit measures).

The video grid (`build_video_grid`) does the same with clips. Which clips depends on what the
fit must separate (`video_clips`): under `full` attention a clip costs by its token count n
alone (2 n^2 units), so clips of several token counts; under `spatial-temporal` a clip of F
frames of S patches costs F S^2 in its spatial blocks and S F^2 in its temporal ones, so at
every token count n = F S clips of few large frames (S >> F), of many small frames (F >> S)
and one in between: the columns n, n S and n F of the fit then have full rank (at one aspect
per token count, F S^2 and S F^2 would be proportional to n^2 and collinear).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..samples import Sample, tokens as sample_tokens
from ..patterns import AttentionPattern, as_pattern

Shape = tuple[int, int, int]


@dataclass(frozen=True)
class Point:
    layers: int
    """Depth of the model the micro-batch runs on."""
    lengths: tuple[int, ...]
    """Sequences packed into the micro-batch's stream."""
    degree: int
    checkpoint_layers: int
    """Blocks recomputed in backward (the runtime checkpoints the first ones)."""
    shapes: tuple[Shape, ...] | None = None
    """The clips' (frames, height, width) in latent patches when the micro-batch holds video
    clips (`lengths` are then their token counts); None for text."""
    cp: int = 1
    """The context-parallel part c of the degree (`plans.Group.cp`; Ulysses over degree / c)."""
    remap: bool = False
    """The wave runs as one remap domain over the world (`plans.Wave.remap`): every group's copy
    of the micro-batch is as long as the others', so the remap layer moves no row and what the
    point costs beyond its plain twin is the layer's own overhead (`CostModel.remap_overhead`)."""

    def __post_init__(self) -> None:
        if self.cp < 1 or self.degree % self.cp:
            raise ValueError(f"point CP part {self.cp} does not divide its degree {self.degree}")
        if self.remap and self.cp > 1:
            raise ValueError("a remap point runs Ulysses groups only (cp 1)")
        if self.shapes is not None:
            shapes = tuple(tuple(int(x) for x in shape) for shape in self.shapes)
            object.__setattr__(self, "shapes", shapes)
            if tuple(math.prod(shape) for shape in shapes) != tuple(self.lengths):
                raise ValueError(f"point shapes {shapes} do not match its lengths {self.lengths}")

    @classmethod
    def of(cls, layers: int, samples: Sequence[Sample], degree: int, checkpoint_layers: int) -> Point:
        """A point of these samples: text lengths, or (frames, height, width) clip shapes."""
        shaped = any(isinstance(x, (tuple, list)) for x in samples)
        return cls(layers, tuple(sample_tokens(x) for x in samples), degree, checkpoint_layers,
                   tuple(tuple(x) for x in samples) if shaped else None)

    @property
    def ulysses(self) -> int:
        """u: the Ulysses part of the degree."""
        return self.degree // self.cp

    @property
    def samples(self) -> list[Sample]:
        """What the cost model prices: the clips' shapes, or the text lengths."""
        return list(self.lengths) if self.shapes is None else list(self.shapes)

    @property
    def spatial_pairs(self) -> float:
        """sum F S^2 over the clips: the (query, key) pairs one spatial block attends (a text
        sequence is one frame)."""
        return float(sum(f * (h * w) ** 2 for f, h, w in self.grids()))

    @property
    def temporal_pairs(self) -> float:
        """sum S F^2 over the clips: the pairs one temporal block attends."""
        return float(sum(h * w * f * f for f, h, w in self.grids()))

    def grids(self) -> tuple[Shape, ...]:
        return self.shapes if self.shapes is not None else tuple((1, 1, s) for s in self.lengths)

    @property
    def checkpoint(self) -> float:
        """The plan's checkpoint level: a fraction of layers."""
        return self.checkpoint_layers / self.layers

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def sum_sq(self) -> float:
        return float(sum(s * s for s in self.lengths))

    def label(self) -> str:
        if self.shapes is None:
            packed = f"{len(self.lengths)}x{self.lengths[0]}" if len(set(self.lengths)) == 1 else "+".join(
                map(str, self.lengths))
        else:  # clips as FxHxW; k copies of one clip as k*(FxHxW)
            names = ["x".join(map(str, shape)) for shape in self.shapes]
            packed = (names[0] if len(names) == 1 else f"{len(names)}*({names[0]})" if len(set(names)) == 1
                      else "+".join(names))
        split = f"d{self.degree}" if self.cp == 1 else f"d{self.degree}={self.ulysses}x{self.cp}cp"
        remap = " remap" if self.remap else ""
        return f"L{self.layers} {packed} {split} ckpt{self.checkpoint_layers}/{self.layers}{remap}"


@dataclass
class Measurement:
    """One point as the runtime executed it on every rank, its repeats reduced to one number."""

    point: Point
    seconds: float
    """Forward + backward of the micro-batch (all-to-alls included), mean over ranks."""
    comm_seconds: float
    """Seconds inside all-to-all calls per rank (their latency and any wait for a peer)."""
    comm_calls: int
    comm_bytes: float
    """Bytes of the all-to-all send buffers per rank."""
    activation_bytes: float
    """Bytes saved for backward (ActivationMeter), the largest over ranks."""
    shard_tokens: int
    """Tokens of the largest shard (ceil(tokens / degree))."""
    samples: list[float] = field(default_factory=list)
    """Every repeat's seconds (mean over ranks), for the spread and to reduce them otherwise."""
    comm_samples: list[float] = field(default_factory=list)
    """Every repeat's all-to-all seconds (mean over ranks)."""
    context_seconds: float = 0.0
    """Of `comm_seconds`, those inside the CP collectives (the K, V all-gather and the dK, dV
    reduce-scatter, which the runtime runs as all-to-alls over the CP group)."""
    context_calls: int = 0
    context_bytes: float = 0.0
    """Send-buffer bytes of the CP collectives per rank (the gather sends its rows once per CP
    rank, itself included)."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["point"]["lengths"] = list(self.point.lengths)
        if self.point.shapes is None:
            del out["point"]["shapes"]  # text points as they always were
        else:
            out["point"]["shapes"] = [list(shape) for shape in self.point.shapes]
        if self.point.cp == 1:  # points without CP as they always were
            del out["point"]["cp"]
            for key in ("context_seconds", "context_calls", "context_bytes"):
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        shapes = data["point"].get("shapes")
        point = Point(**{**data["point"], "lengths": tuple(data["point"]["lengths"]),
                         "shapes": None if shapes is None else tuple(map(tuple, shapes))})
        return cls(**{**data, "point": point})


TINY_SPAN_FRACTION = 8
"""The grid's tiny documents are the shortest grid length / this (16 tokens under 128)."""


def checkpoint_levels(layers: int) -> list[int]:
    """Checkpointed layer counts to profile: none, all, and one in between when there is one."""
    return sorted({0, layers // 2, layers})


def build_grid(layers: int, lengths: Sequence[int], degrees: Sequence[int]) -> list[Point]:
    """Single sequences of every length x degree x checkpoint level, plus packed micro-batches.

    Packed ones hold k copies of a short length filling about a quarter of the longest one, at
    every degree without checkpointing: the two shortest grid lengths, and documents an eighth
    of the shortest long (TINY_SPAN_FRACTION), dozens of them, whose cost is mostly per span:
    they separate the span term (`CostModel.span_seconds`) from the per-token and per-micro-batch ones.
    """
    lengths = sorted(set(lengths))
    points = [Point(layers, (s,), d, c) for s in lengths for d in degrees for c in checkpoint_levels(layers)]
    fill = max(lengths) // 4
    for s in [tiny_documents(lengths)[0]] + lengths[:2]:
        if fill // s >= 2:
            points += [Point(layers, (s,) * (fill // s), d, 0) for d in degrees]
    return list(dict.fromkeys(points))


def tiny_documents(lengths: Sequence[int]) -> list[int]:
    """The text grid's packed stream of tiny documents (`build_grid`): an eighth of the shortest
    length each, filling a quarter of the longest (at least two)."""
    s = max(1, min(lengths) // TINY_SPAN_FRACTION)
    return [s] * max(2, max(lengths) // 4 // s)


def remap_points(layers: int, singles: Sequence[Sample], packed: Sequence[Sample], world_size: int) -> list[Point]:
    """Degree-1 points run as one remap domain over the world (`Point.remap`), for the remap
    layer's overhead per token and per slot: the longest and a middle single sample, without
    and with every block checkpointed (a recomputed block repeats its forward exchanges), and
    one packed stream of many samples. None on one rank (no domain)."""
    if world_size < 2:
        return []
    ordered = sorted(dict.fromkeys(singles), key=lambda x: (sample_tokens(x), x))
    chosen = dict.fromkeys([ordered[-1], ordered[len(ordered) // 2]])
    points = [dataclasses.replace(Point.of(layers, [x], 1, c), remap=True) for x in chosen for c in (0, layers)]
    return points + [dataclasses.replace(Point.of(layers, list(packed), 1, 0), remap=True)]


def build_context_grid(layers: int, lengths: Sequence[int], splits: Sequence[tuple[int, int]]) -> list[Point]:
    """Points with a context-parallel part, per (degree, cp) split: single sequences of the
    shortest and a middle length without and with every layer checkpointed (the CP attention
    factor, the recomputed gather, the per-micro-batch latency) and of the longest without (the
    recomputation factors are the other points': the longest CP points cost most, so once is
    enough), and two packed streams a quarter of the longest length long: copies of the shortest
    length, and documents of half of it plus one token, odd, so that no 2c chunks of one are
    equal (the balance the runtime reaches on short documents, measured rather than assumed)."""
    lengths = sorted(set(lengths))
    singles = {(s, c) for s in (lengths[0], lengths[len(lengths) // 2]) for c in (0, layers)} | {(lengths[-1], 0)}
    fill = max(lengths) // 4
    points = []
    for degree, cp in splits:
        points += [Point(layers, (s,), degree, c, cp=cp) for s, c in sorted(singles)]
        odd = lengths[0] // 2 + 1
        points += [Point(layers, (s,) * (fill // s), degree, 0, cp=cp) for s in (lengths[0], odd) if fill // s >= 2]
    return points


def verification_points(layers: int, lengths: Sequence[int], degrees: Sequence[int], count: int) -> list[Point]:
    """A few full-depth points that check the depth extrapolation: the longest and a middle
    length, alternating the extreme degrees and checkpoint levels."""
    lengths = sorted(set(lengths))
    choices = [(lengths[-1], degrees[0], 0), (lengths[-1], degrees[-1], layers),
               (lengths[len(lengths) // 2], degrees[-1], 0), (lengths[len(lengths) // 2], degrees[0], layers),
               (lengths[-1], degrees[-1], layers // 2), (lengths[0], degrees[0], 0)]
    return [Point(layers, (s,), d, c) for s, d, c in dict.fromkeys(choices)][:count]


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
    """Single clips x degree x checkpoint level, plus packed micro-batches at every degree
    without checkpointing: the clips of the smallest token count together (several copies of it
    when there is only one), to see that a stream of several clips costs their sum; and dozens
    of tiny clips filling a quarter of the largest, whose cost is mostly per span, clip and
    kernel call, twice: copies of a few shapes (`tiny_clips`: few calls) and as many distinct
    shapes (`distinct_tiny_clips`: a call per clip, as in a real batch). They separate the span,
    sample and call terms from the others and from each other (`columns.separates_calls`)."""
    clips = sorted(dict.fromkeys(tuple(c) for c in clips), key=lambda c: (math.prod(c), c))
    points = [Point.of(layers, [c], d, k) for c in clips for d in degrees for k in checkpoint_levels(layers)]
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
    every aspect, then a middle one, alternating the extreme degrees and checkpoint levels."""
    clips = sorted(dict.fromkeys(tuple(c) for c in clips), key=lambda c: (math.prod(c), c))
    largest = [c for c in clips if math.prod(c) == math.prod(clips[-1])]
    middle = clips[len(clips) // 2]
    choices = [(largest[0], degrees[0], 0), (largest[-1], degrees[-1], layers),
               (middle, degrees[-1], 0), (largest[len(largest) // 2], degrees[0], layers),
               (largest[0], degrees[-1], layers // 2), (clips[0], degrees[0], 0)]
    return [Point.of(layers, [c], d, k) for c, d, k in dict.fromkeys(choices)][:count]
