"""What the runtime needs of a model: the protocol every model ballast trains implements.

The runtime (`ballast.runtime`) depends on this, not on a model: ballast's GPT and Hugging Face
causal LMs (`hf.py`) implement it, and video DiTs will. A model is plain single-device code; the
runtime hands it a stream object that says which tokens this process holds and how they sit in
the packed micro-batch, and installs the sequence-parallel attention through the model's own
hook. No runtime, planner or CLI code names a model family.

    PackedStream      sequences packed end to end: cu_seqlens of the whole stream, and the
                      position inside its own sequence of every token this process holds
    AttentionFn       (q, k, v, stream) -> out, each [tokens held, heads, head_dim]; causal per
                      sequence over the whole stream however it is sharded
    ParallelModel     shape (what the cost model prices), forward of this process's tokens,
                      blocks (checkpointing and FSDP units), install_attention
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor, nn

from ..model_shape import ModelShape


@dataclass(frozen=True)
class PackedStream:
    """Sequences packed one after another into one token stream."""

    bounds: tuple[int, ...]
    """cu_seqlens of the whole stream as Python ints: (0, s1, s1 + s2, ..., tokens)."""
    positions: Tensor
    """Position of every token this process holds inside its own sequence (0 at its start):
    the rotary position a model applies."""

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], device: torch.device | str | None = None) -> PackedStream:
        """The whole stream of sequences of these lengths, held by one process."""
        return cls(tuple(itertools.accumulate(lengths, initial=0)), sequence_positions(lengths, device))


def sequence_positions(lengths: Sequence[int], device: torch.device | str | None = None) -> Tensor:
    """0..s-1 for every sequence length s, concatenated."""
    counts = torch.tensor(list(lengths), dtype=torch.long)
    starts = torch.cumsum(counts, 0) - counts
    total = int(counts.sum())
    return (torch.arange(total) - torch.repeat_interleave(starts, counts)).to(device)


AttentionFn = Callable[[Tensor, Tensor, Tensor, PackedStream], Tensor]


@runtime_checkable
class ParallelModel(Protocol):
    """A model the runtime can run under any plan: an `nn.Module` (the runtime also uses its
    `parameters()` and `modules()`) with these members."""

    shape: ModelShape
    """What the cost model prices; `shape.layers` blocks, `shape.heads` that every SP degree
    must divide."""

    def __call__(self, tokens: Tensor, stream: PackedStream, checkpoint_layers: int = 0) -> Tensor:
        """Logits [tokens held, vocab] of the tokens this process holds (one per entry of
        `stream.positions`); the first `checkpoint_layers` blocks keep only their input and
        are recomputed in backward (non-reentrant `torch.utils.checkpoint`)."""
        ...

    def blocks(self) -> Sequence[nn.Module]:
        """The repeated blocks in order: what checkpointing counts and what FSDP shards one by one
        (the rest, embedding and head, is sharded as the root)."""
        ...

    def install_attention(self, attend: AttentionFn) -> None:
        """Route every self-attention of the model through `attend` (the runtime passes the
        sequence-parallel one)."""
        ...
