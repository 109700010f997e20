"""The pipeline vocabulary the runtime and the pricing share: which layers a stage holds, and the
order in which 1F1B runs a stage's forward and backward passes.

A pipeline of p stages cuts the model's L blocks into p equal runs (the first stage also holds
the embedding, the last the final norm, output layer and loss). Every stage runs the step's m
micro-batches in the non-interleaved 1F1B order (PipeDream-Flush, Megatron-LM's default): stage
k first runs min(p - k - 1, m) forwards (the warm-up), then alternates one forward and one
backward, then runs the backwards left (the cool-down). So stage k never holds more than
min(p - k, m) micro-batches' activations, the first stage the most.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .model_shape import ModelShape


@dataclass(frozen=True)
class Pass:
    """One pass of a stage: micro-batch `micro_batch`'s forward, or its backward."""

    forward: bool
    micro_batch: int

    def __str__(self) -> str:
        return f"{'F' if self.forward else 'B'}{self.micro_batch}"


def check_stages(stages: int, layers: int, name: str = "the model") -> None:
    """ValueError unless `stages` is a stage count that cuts `layers` blocks (of model `name`)
    into equal runs."""
    if stages < 1:
        raise ValueError(f"PP degree must be at least 1, got {stages}")
    if layers % stages:
        raise ValueError(f"PP degree {stages} does not divide {name}'s {layers} layers: every stage holds as many "
                         f"blocks")


def check_pipeline_shape(shape: ModelShape, stages: int) -> None:
    """ValueError unless a model of `shape` can be cut into `stages` stages: equal runs of its
    blocks, a text model (a pipeline's last stage holds the output layer and the loss), its
    embedding and output weights not tied (the first and last stage would each hold a copy)."""
    check_stages(stages, shape.layers, f"model {shape.name!r}")
    if stages == 1:
        return
    if shape.pattern.clips:
        raise ValueError(f"model {shape.name!r} cannot be cut into pipeline stages (text models can): run it "
                         f"without --pp")
    if shape.tied_embeddings:
        raise ValueError(f"model {shape.name!r} ties its embedding and output weights, which pipeline stages cannot "
                         f"split (the first and last stage would each hold a copy): run it without --pp")


def stage_layers(stage: int, stages: int, layers: int) -> range:
    """The blocks stage `stage` of `stages` holds, of a model of `layers` blocks."""
    check_stages(stages, layers)
    assert 0 <= stage < stages, (stage, stages)
    per = layers // stages
    return range(stage * per, (stage + 1) * per)


def recomputed_blocks(level: float, blocks: int) -> int:
    """The blocks a stage of `blocks` recomputes for a micro-batch at recompute `level`: at least
    that share of them, so that it fits what the plan priced; the slack absorbs a level's float
    rounding (3 x (1/3) blocks is 1, not 2)."""
    return math.ceil(level * blocks - 1e-9)


def warmup(stage: int, stages: int, micro_batches: int) -> int:
    """Forwards stage `stage` runs before its first backward (beyond the one before it)."""
    return min(stages - stage - 1, micro_batches)


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Pass]:
    """Stage `stage`'s passes over `micro_batches` micro-batches, in 1F1B order."""
    assert 0 <= stage < stages and micro_batches >= 0, (stage, stages, micro_batches)
    ahead = warmup(stage, stages, micro_batches)
    passes = [Pass(True, i) for i in range(ahead)]
    for i in range(micro_batches - ahead):
        passes += [Pass(True, ahead + i), Pass(False, i)]
    return passes + [Pass(False, i) for i in range(micro_batches - ahead, micro_batches)]


def in_flight(stage: int, stages: int, micro_batches: int) -> list[list[int]]:
    """After each forward of stage `stage` (in 1F1B order), the micro-batches whose activations
    it holds: every one whose forward has run and backward not yet."""
    held: list[int] = []
    out = []
    for p in one_f_one_b(stage, stages, micro_batches):
        if p.forward:
            held.append(p.micro_batch)
            out.append(list(held))
        else:
            held.remove(p.micro_batch)
    return out
