"""What the profiler measures: grid points (one micro-batch shape each) and their measurements.

A point is one micro-batch: its packed samples (text sequences, or video clips of (frames,
height, width) latent patches), an SP degree, how many of the model's layers are recomputed,
and the depth of the model it runs on (the profiler runs reduced-depth copies of the model and
extrapolates, as DCP does). The text grid crosses single sequences of every grid length with
every degree and recompute level; a few packed micro-batches (several short sequences in one
stream) check that packing costs what the per-sequence sum says, since the runtime attends
sequence by sequence.

A text model whose attention can run context parallelism adds points with a CP part
(`build_context_grid`, `Point.cp`): every (degree, cp) split the heads allow, a few lengths with
and without recomputation, and packed streams of short and odd documents, whose head-tail
chunks cannot balance exactly (the runtime's CP attention per chunk is what the fit measures).

The video grid is `video_grid.py`'s.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..vocabulary.samples import Sample, tokens as sample_tokens

Shape = tuple[int, int, int]


@dataclass(frozen=True)
class Point:
    layers: int
    """Depth of the model the micro-batch runs on."""
    lengths: tuple[int, ...]
    """Sequences packed into the micro-batch's stream."""
    degree: int
    recompute_layers: int
    """Blocks recomputed in backward (the runtime recomputes the first ones)."""
    shapes: tuple[Shape, ...] | None = None
    """The clips' (frames, height, width) in latent patches when the micro-batch holds video
    clips (`lengths` are then their token counts); None for text."""
    cp: int = 1
    """The context-parallel part c of the degree (`plans.Group.cp`; Ulysses over degree / c)."""
    remap: bool = False
    """The wave runs as one remap domain over the world (`plans.Wave.remap`): every group's copy
    of the micro-batch is as long as the others', so the remap layer moves no row and what the
    point costs beyond its plain twin is the layer's own overhead (`remapping.remap_overhead`)."""

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
    def of(cls, layers: int, samples: Sequence[Sample], degree: int, recompute_layers: int) -> Point:
        """A point of these samples: text lengths, or (frames, height, width) clip shapes."""
        shaped = any(isinstance(x, (tuple, list)) for x in samples)
        return cls(layers, tuple(sample_tokens(x) for x in samples), degree, recompute_layers,
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
    def recompute(self) -> float:
        """The plan's recompute level: a fraction of layers."""
        return self.recompute_layers / self.layers

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
        return f"L{self.layers} {packed} {split} recomp{self.recompute_layers}/{self.layers}{remap}"


OLD_POINT_KEYS = {"checkpoint_layers": "recompute_layers"}
"""Point fields renamed since profiles were recorded (old name -> new): older profile JSONs load."""


@dataclass
class Measurement:
    """One point as the runtime executed it on every rank, its repeats reduced to one number."""

    point: Point
    seconds: float
    """Forward + backward of the micro-batch (all-to-alls included), the slowest rank's
    (`measure.slowest_rank`)."""
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
    """Every repeat's seconds (the slowest rank's), for the spread and to reduce them otherwise."""
    comm_samples: list[float] = field(default_factory=list)
    """Every repeat's all-to-all seconds (mean over ranks)."""
    context_seconds: float = 0.0
    """Of `comm_seconds`, those inside the CP collectives (the K, V all-gather and the dK, dV
    reduce-scatter, which the runtime runs as all-to-alls over the CP group)."""
    context_calls: int = 0
    context_bytes: float = 0.0
    """Send-buffer bytes of the CP collectives per rank (the gather sends its rows once per CP
    rank, itself included)."""
    comm_values: float = 0.0
    """Values (elements) of the all-to-all send buffers per rank: `comm_bytes` / `comm_values` is
    the bytes per value the runs exchanged, whatever their dtypes (0 in records made before it
    was measured)."""
    context_values: float = 0.0
    """Of `comm_values`, those of the CP collectives."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["point"]["lengths"] = list(self.point.lengths)
        if self.point.shapes is None:
            del out["point"]["shapes"]  # text points as they always were
        else:
            out["point"]["shapes"] = [list(shape) for shape in self.point.shapes]
        if self.point.cp == 1:  # points without CP as they always were
            del out["point"]["cp"]
            for key in ("context_seconds", "context_calls", "context_bytes", "context_values"):
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        fields = {OLD_POINT_KEYS.get(key, key): value for key, value in data["point"].items()}
        shapes = fields.get("shapes")
        point = Point(**{**fields, "lengths": tuple(fields["lengths"]),
                         "shapes": None if shapes is None else tuple(map(tuple, shapes))})
        return cls(**{**data, "point": point})


TINY_SPAN_FRACTION = 8
"""The grid's tiny documents are the shortest grid length / this (16 tokens under 128)."""


def recompute_levels(layers: int) -> list[int]:
    """Recomputed layer counts to profile: none, all, and one in between when there is one."""
    return sorted({0, layers // 2, layers})


def build_grid(layers: int, lengths: Sequence[int], degrees: Sequence[int]) -> list[Point]:
    """Single sequences of every length x degree x recompute level, plus packed micro-batches.

    Packed ones hold k copies of a short length filling about a quarter of the longest one, at
    every degree without recomputation: the two shortest grid lengths, and documents an eighth
    of the shortest long (TINY_SPAN_FRACTION), dozens of them, whose cost is mostly per span:
    they separate the span term (`CostModel.span_seconds`) from the per-token and per-micro-batch ones.
    """
    lengths = sorted(set(lengths))
    points = [Point(layers, (s,), d, c) for s in lengths for d in degrees for c in recompute_levels(layers)]
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
    and with every block recomputed (a recomputed block repeats its forward exchanges), and
    one packed stream of many samples. None on one rank (no domain)."""
    if world_size < 2:
        return []
    ordered = sorted(dict.fromkeys(singles), key=lambda x: (sample_tokens(x), x))
    chosen = dict.fromkeys([ordered[-1], ordered[len(ordered) // 2]])
    points = [dataclasses.replace(Point.of(layers, [x], 1, c), remap=True) for x in chosen for c in (0, layers)]
    return points + [dataclasses.replace(Point.of(layers, list(packed), 1, 0), remap=True)]


def build_context_grid(layers: int, lengths: Sequence[int], splits: Sequence[tuple[int, int]]) -> list[Point]:
    """Points with a context-parallel part, per (degree, cp) split: single sequences of the
    shortest and a middle length without and with every layer recomputed (the CP attention
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
    length, alternating the extreme degrees and recompute levels."""
    lengths = sorted(set(lengths))
    choices = [(lengths[-1], degrees[0], 0), (lengths[-1], degrees[-1], layers),
               (lengths[len(lengths) // 2], degrees[-1], 0), (lengths[len(lengths) // 2], degrees[0], layers),
               (lengths[-1], degrees[-1], layers // 2), (lengths[0], degrees[0], 0)]
    return [Point(layers, (s,), d, c) for s, d, c in dict.fromkeys(choices)][:count]
