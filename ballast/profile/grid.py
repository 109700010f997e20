"""What the profiler measures: grid points (one micro-batch shape each) and their measurements.

A point is one micro-batch: the lengths of its packed sequences, an SP degree, how many of the
model's layers are checkpointed, and the depth of the model it runs on (the profiler runs
reduced-depth copies of the model and extrapolates, as DCP does). The grid crosses single
sequences of every grid length with every degree and checkpoint level; a few packed
micro-batches (several short sequences in one stream) check that packing costs what the
per-sequence sum says, since the runtime attends sequence by sequence.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class Point:
    layers: int
    """Depth of the model the micro-batch runs on."""
    lengths: tuple[int, ...]
    """Sequences packed into the micro-batch's stream."""
    degree: int
    checkpoint_layers: int
    """Blocks recomputed in backward (the runtime checkpoints the first ones)."""

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
        packed = f"{len(self.lengths)}x{self.lengths[0]}" if len(set(self.lengths)) == 1 else "+".join(
            map(str, self.lengths))
        return f"L{self.layers} {packed} d{self.degree} ckpt{self.checkpoint_layers}/{self.layers}"


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

    def to_dict(self) -> dict:
        out = asdict(self)
        out["point"]["lengths"] = list(self.point.lengths)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        point = Point(**{**data["point"], "lengths": tuple(data["point"]["lengths"])})
        return cls(**{**data, "point": point})


def checkpoint_levels(layers: int) -> list[int]:
    """Checkpointed layer counts to profile: none, all, and one in between when there is one."""
    return sorted({0, layers // 2, layers})


def build_grid(layers: int, lengths: Sequence[int], degrees: Sequence[int]) -> list[Point]:
    """Single sequences of every length x degree x checkpoint level, plus packed micro-batches.

    Packed ones hold k copies of a short length filling about a quarter of the longest one, at
    every degree without checkpointing: enough to see a per-sequence cost if there is one.
    """
    lengths = sorted(set(lengths))
    points = [Point(layers, (s,), d, c) for s in lengths for d in degrees for c in checkpoint_levels(layers)]
    fill = max(lengths) // 4
    for s in lengths[:2]:
        if fill // s >= 2:
            points += [Point(layers, (s,) * (fill // s), d, 0) for d in degrees]
    return points


def verification_points(layers: int, lengths: Sequence[int], degrees: Sequence[int], count: int) -> list[Point]:
    """A few full-depth points that check the depth extrapolation: the longest and a middle
    length, alternating the extreme degrees and checkpoint levels."""
    lengths = sorted(set(lengths))
    choices = [(lengths[-1], degrees[0], 0), (lengths[-1], degrees[-1], layers),
               (lengths[len(lengths) // 2], degrees[-1], 0), (lengths[len(lengths) // 2], degrees[0], layers),
               (lengths[-1], degrees[-1], layers // 2), (lengths[0], degrees[0], 0)]
    return [Point(layers, (s,), d, c) for s, d, c in dict.fromkeys(choices)][:count]
