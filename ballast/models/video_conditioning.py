"""What the video DiTs read of their samples: timestep embeddings, condition tokens and which
sample each held token belongs to. There is no batch dimension: a per-sample value reaches a
token through the sample index of `stream.positions[:, 0]`.

    TimestepEmbedding  t -> sinusoids of t * 1000 -> MLP (DiT, Open-Sora, Wan)
    ConditionEncoder   a clip's condition -> its condition tokens: a class label picks
                       CONDITION_TOKENS learned tokens, a caption embedding [L, caption_dim] goes
                       through an MLP (STDiT3's CaptionEmbedder, Wan's text_embedding)
    Conditioning       what every block reads of the samples: their adaLN modulation, time
                       embedding and condition tokens
    HeldSamples        which samples the held tokens belong to, after an arrange
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from ..vocabulary.model_shape import ModelShape
from .flow import TIMESTEP_SCALE
from .protocol import PackedStream

LABELS = 16
"""Class labels a label-conditioned clip carries (0..15): the video models' label table, and
what the Gaussian clips draw."""
CONDITION_TOKENS = 4
"""Condition tokens a class label becomes (learned, per label)."""
FREQUENCY_DIM = 256
"""Sinusoids of the timestep embedding (DiT's, Open-Sora's and Wan's 256)."""

class TimestepEmbedding(nn.Module):
    """t in (0, 1) [samples] -> [samples, hidden]: sinusoids of t * 1000, then Linear, SiLU, Linear."""

    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQUENCY_DIM, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        half = FREQUENCY_DIM // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        angles = (t.float() * TIMESTEP_SCALE)[:, None] * freqs[None, :]
        return self.mlp(torch.cat([angles.cos(), angles.sin()], dim=1).to(self.mlp[0].weight.dtype))


def condition_tokens(condition: Any, caption_dim: int, where: str) -> int:
    """How many condition tokens `condition` gives a model of this caption_dim (0: labels only);
    ValueError naming `where` (the sample) if the model cannot take it."""
    if caption_dim == 0:
        label = condition.item() if isinstance(condition, Tensor) and condition.dim() == 0 else condition
        if isinstance(label, bool) or not isinstance(label, int):
            shape = f"a tensor of shape {tuple(condition.shape)}" if isinstance(condition, Tensor) else repr(condition)
            raise ValueError(f"{where}: the model is conditioned on class labels (caption_dim 0), got {shape}")
        if not 0 <= label < LABELS:
            raise ValueError(f"{where}: label {label} is outside the model's {LABELS} classes (0..{LABELS - 1})")
        return CONDITION_TOKENS
    if not isinstance(condition, Tensor) or condition.dim() != 2 or not condition.is_floating_point():
        got = f"a tensor of shape {tuple(condition.shape)}" if isinstance(condition, Tensor) else repr(condition)
        raise ValueError(f"{where}: the model is conditioned on caption embeddings [tokens, {caption_dim}] "
                         f"(float), got {got}")
    if condition.shape[1] != caption_dim or condition.shape[0] < 1:
        raise ValueError(f"{where}: caption embedding of shape {tuple(condition.shape)}; the model takes "
                         f"[tokens >= 1, {caption_dim}]")
    return condition.shape[0]


class ConditionEncoder(nn.Module):
    """Every sample's condition -> its condition tokens [tokens, hidden], packed sample after
    sample. A model reads one kind: class labels (caption_dim 0) or caption embeddings. Every
    rank encodes every sample's condition (an arrange may bring it tokens of any sample), so
    the encoder's weights get a gradient on every rank, as FSDP2's reduce-scatter needs."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.caption_dim = shape.caption_dim
        if self.caption_dim == 0:
            self.labels = nn.Embedding(LABELS * CONDITION_TOKENS, shape.hidden)
        else:
            self.caption = nn.Sequential(nn.Linear(self.caption_dim, shape.hidden), nn.GELU(approximate="tanh"),
                                         nn.Linear(shape.hidden, shape.hidden))

    def forward(self, conditions: Sequence[Any], device: torch.device) -> tuple[Tensor, tuple[int, ...], Tensor]:
        """(distinct condition tokens [rows, hidden], bounds of every sample's tokens in the
        packed sequence of all samples' tokens, the row of `tokens` of each of those [sum of
        tokens]). Samples of one label share their rows: a micro-batch of hundreds of clips
        has at most LABELS x CONDITION_TOKENS of them to project in every block."""
        counts = [condition_tokens(c, self.caption_dim, f"sample {i} of the micro-batch")
                  for i, c in enumerate(conditions)]
        bounds = tuple(itertools.accumulate(counts, initial=0))
        if self.caption_dim == 0:
            labels = torch.tensor([int(c) for c in conditions], dtype=torch.long)
            distinct, which = torch.unique(labels, return_inverse=True)
            slots = torch.arange(CONDITION_TOKENS)
            rows = (distinct[:, None] * CONDITION_TOKENS + slots).reshape(-1)
            return self.labels(rows.to(device)), bounds, (which[:, None] * CONDITION_TOKENS + slots).reshape(-1)
        weight = self.caption[0].weight
        captions = [c.to(weight.dtype) for c in conditions] or [weight.new_zeros(0, self.caption_dim)]
        return self.caption(torch.cat(captions).to(device)), bounds, torch.arange(bounds[-1])


@dataclass(frozen=True)
class Conditioning:
    """What the blocks read of the micro-batch's samples (every sample, in stream order)."""

    modulation: Tensor
    """[samples, 6, hidden]: the shared adaLN projection of each sample's time embedding."""
    time: Tensor
    """[samples, hidden]: each sample's time embedding (the final layer's modulation)."""
    tokens: Tensor
    """[rows, hidden]: the distinct condition tokens of the samples (`rows` picks them)."""
    bounds: tuple[int, ...]
    """Where each sample's condition tokens start in `rows`, and the end."""
    rows: Tensor
    """[sum of condition tokens] (CPU, int64): every sample's condition tokens, sample after
    sample, as rows of `tokens`."""


@dataclass(frozen=True)
class HeldSamples:
    """The samples of the tokens a process holds in one layout. Tokens are grouped by sample in
    stream order in every layout (the protocol's guarantee), so each sample is one run of rows."""

    index: Tensor
    """[tokens held]: the sample of every held token."""
    samples: Tensor
    """[runs] (CPU, int64): the sample of every run of rows, one per sample with held tokens."""
    counts: Tensor
    """[runs] (CPU, int64): the rows of every run; the runs follow one another from row 0."""

    @classmethod
    def of(cls, stream: PackedStream) -> HeldSamples:
        index = stream.positions[:, 0]
        runs = _RUNS.get(stream.positions)
        if runs is None:
            samples, counts = torch.unique_consecutive(index, return_counts=True)
            runs = _RUNS[stream.positions] = samples.cpu(), counts.cpu()
        return cls(index, *runs)


_RUNS = WeakIdKeyDictionary()
"""`HeldSamples`' runs of a positions tensor (which a layout's streams share for the whole
micro-batch: `arrange` hands the same one to every block of a pattern), so that finding them,
a copy to the host that waits for the device, runs once per layout and micro-batch, not once
per block; an entry goes with its tensor."""
