"""The text models' objective: next-token cross-entropy over a packed stream (GPT and Hugging
Face causal LMs share it; they differ only in the forward that gives the logits).

A text sample is lengths + 1 token ids: inputs t[:-1], targets t[1:]. The stream packs the
inputs; a process holding the tokens `local` of it (a slice, or stream indices under context
parallelism) scores exactly those positions, so the label shift never crosses a shard boundary
and every target is scored by exactly one process.

Under pipeline parallelism (`protocol.StagedModel`) a model keeps one stage's part: its forward
then takes token ids only if it holds the embedding, else the previous stage's hidden states,
and gives logits only if it holds the output layer, else hidden states; `stage_forward` feeds it
and scores what the last stage gives. A whole model is its own first and last stage, so `loss`
is `stage_forward` from the token ids.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .protocol import CrossEntropy, Local, PackedStream, take

Forward = Callable[[Tensor, PackedStream, int], Tensor]
"""(token ids held, or the previous stage's hidden states [held, hidden], stream,
recompute_layers) -> logits [tokens held, vocab], or the stage's hidden states."""


def summed_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy summed, not averaged: a shard holds a part of a batch whose normaliser is global."""
    return F.cross_entropy(logits, targets, reduction="sum")


class NextTokenObjective:
    """The protocol's sample, loss and stage members for a text model whose forward gives the
    logits of the held tokens (`Forward`) and which says whether it holds its embedding and
    output layer (`holds_embedding`, `holds_head`: both, unless cut to a pipeline stage): mixed
    into GPT and HFCausalLM, with the cross-entropy hook of `protocol.TensorParallelModel`."""

    holds_embedding: bool
    holds_head: bool
    cross_entropy: CrossEntropy = staticmethod(summed_cross_entropy)
    """Scores the logits; tensor parallelism installs one over a split vocabulary."""

    def loss(self, samples: Sequence[Tensor], stream: PackedStream, local: Local, recompute_layers: int = 0) -> Tensor:
        """Summed next-token cross-entropy of the held tokens (`protocol.ParallelModel.loss`)."""
        assert self.holds_embedding and self.holds_head, "a pipeline stage runs stage_forward"
        return self.stage_forward(None, samples, stream, local, recompute_layers)

    def stage_forward(self, received: Tensor | None, samples: Sequence[Tensor], stream: PackedStream, local: Local,
                      recompute_layers: int = 0) -> Tensor:
        """This stage's part on the held tokens (`protocol.StagedModel.stage_forward`): from
        their token ids where it holds the embedding, else from `received`; the summed
        cross-entropy where it holds the output layer, else the hidden states."""
        assert (received is None) == self.holds_embedding, "the first stage starts from token ids, no other"
        device = stream.positions.device
        inputs = take(torch.cat([s[:-1] for s in samples]), local).to(device) if received is None else received
        out = self(inputs, stream, recompute_layers)
        if not self.holds_head:
            return out
        return self.cross_entropy(out, take(torch.cat([s[1:] for s in samples]), local).to(device))

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
