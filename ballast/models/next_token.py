"""The text models' objective: next-token cross-entropy over a packed stream (GPT and Hugging
Face causal LMs share it; they differ only in the forward that gives the logits).

A text sample is lengths + 1 token ids: inputs t[:-1], targets t[1:]. The stream packs the
inputs; a process holding the tokens `local` of it (a slice, or stream indices under context
parallelism) scores exactly those positions, so the label shift never crosses a shard boundary
and every target is scored by exactly one process.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .protocol import CrossEntropy, Local, PackedStream, take

Forward = Callable[[Tensor, PackedStream, int], Tensor]
"""(token ids held, stream, recompute_layers) -> logits [tokens held, vocab]."""


def summed_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy summed, not averaged: a shard holds a part of a batch whose normaliser is global."""
    return F.cross_entropy(logits, targets, reduction="sum")


def next_token_loss(forward: Forward, samples: Sequence[Tensor], stream: PackedStream, local: Local,
                    recompute_layers: int, cross_entropy: CrossEntropy = summed_cross_entropy) -> Tensor:
    """Summed cross-entropy of the held tokens' next-token predictions."""
    inputs = take(torch.cat([s[:-1] for s in samples]), local).to(stream.positions.device)
    targets = take(torch.cat([s[1:] for s in samples]), local).to(stream.positions.device)
    return cross_entropy(forward(inputs, stream, recompute_layers), targets)


class NextTokenObjective:
    """The protocol's sample and loss members for a text model whose forward gives the logits
    of the held tokens (`Forward`): mixed into GPT and HFCausalLM, with the cross-entropy hook of
    `protocol.TensorParallelModel`."""

    cross_entropy: CrossEntropy = staticmethod(summed_cross_entropy)
    """Scores the logits; tensor parallelism installs one over a split vocabulary."""

    def loss(self, samples: Sequence[Tensor], stream: PackedStream, local: Local, recompute_layers: int = 0) -> Tensor:
        """Summed next-token cross-entropy of the held tokens (`protocol.ParallelModel.loss`)."""
        return next_token_loss(self, samples, stream, local, recompute_layers, self.cross_entropy)

    def install_cross_entropy(self, cross_entropy: CrossEntropy) -> None:
        self.cross_entropy = cross_entropy

    @staticmethod
    def sample_shape(sample: Tensor) -> int:
        """Trained tokens of a text sample (its token ids but the last)."""
        if not isinstance(sample, Tensor) or sample.dim() != 1 or sample.numel() < 2:
            shape = tuple(sample.shape) if isinstance(sample, Tensor) else type(sample).__name__
            raise ValueError(f"a text sample is a 1-D tensor of at least 2 token ids (inputs and, shifted by "
                             f"one, targets); got {shape}")
        return sample.numel() - 1

    @staticmethod
    def dummy_sample() -> Tensor:
        return torch.zeros(2, dtype=torch.long)
