"""The layers the video DiTs (`stdit.py`, `dit.py`) share, over a packed stream of clips.

There is no batch dimension: every per-sample value (a clip's timestep modulation, its
condition tokens) reaches a token through the sample index of `stream.positions[:, 0]`, and is
looked up again after every `arrange`, since arrange may move tokens between ranks.

    (video_conditioning.py: the timestep and condition embeddings, and which sample each held
    token belongs to)
    VideoBlock         adaLN-zero self-attention of one pattern (with RoPE), cross-attention
                       to the condition, adaLN-zero MLP
    FinalLayer         adaLN-modulated LayerNorm + linear to a token's patch values

adaLN-zero (DiT; STDiT3's and Wan's form): one projection shared by all blocks turns the time
embedding into 6 x hidden values per sample; each block adds its own learned [6, hidden] table
and splits the sum into shift, scale and gate for attention and MLP. The shared projection and
the tables start at zero, so every gate is zero and every block starts as the identity (the
cross-attention, which has no gate, starts with a zero output projection, as in STDiT3).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ..vocabulary.model_shape import ModelShape
from ..vocabulary.patterns import FULL, SPATIAL, TEMPORAL, Span
from .condition_attention import condition_attention
from .gpt import MLP, RMSNorm
from .kernels import local_attention
from .protocol import AttentionFn, PackedStream
from .video_conditioning import Conditioning, HeldSamples

ROPE_THETA = 10000.0
NORM_EPS = 1e-6
ROPE_AXES = {TEMPORAL: (1,), SPATIAL: (2, 3), FULL: (1, 2, 3)}
"""Columns of a video stream's positions (sample, frame, row, column) each pattern's RoPE
rotates by: the coordinates that vary inside one of its attention spans."""


def rope_pairs(head_dim: int, axes: int) -> tuple[int, ...]:
    """Rotation pairs of a head given to each axis. Wan's 3-D split: of c = head_dim / 2 pairs,
    row and column get c // 3 each and frame the rest; a 2-D split halves c (row gets the odd
    one); 1-D takes all."""
    pairs = head_dim // 2
    if head_dim % 2 or pairs < axes:
        raise ValueError(f"head_dim {head_dim}: RoPE over {axes} axes needs an even head_dim of at least {2 * axes}")
    if axes == 3:
        return (pairs - 2 * (pairs // 3), pairs // 3, pairs // 3)
    if axes == 2:
        return (pairs - pairs // 2, pairs // 2)
    return (pairs,)


def rope_angles(coordinates: Tensor, pairs: Sequence[int]) -> tuple[Tensor, Tensor]:
    """(cos, sin) [tokens, 1, sum(pairs)] of the rotation of each pair: axis a's p pairs turn by
    coordinate_a * theta ** (-i / p), i < p, each axis with its own frequency ladder (Wan)."""
    angles = []
    for axis, count in enumerate(pairs):
        freqs = ROPE_THETA ** (-torch.arange(count, device=coordinates.device, dtype=torch.float32) / count)
        angles.append(coordinates[:, axis].to(torch.float32)[:, None] * freqs[None, :])
    angle = torch.cat(angles, dim=1)[:, None, :]
    return angle.cos(), angle.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs (2i, 2i + 1) of x [tokens, heads, head_dim] (Wan's pairing)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    x1, x2 = pairs[..., 0], pairs[..., 1]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).to(x.dtype)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


def layer_norm(width: int) -> nn.LayerNorm:
    """LayerNorm without affine weights: adaLN's shift and scale replace them."""
    return nn.LayerNorm(width, eps=NORM_EPS, elementwise_affine=False)


class SelfAttention(nn.Module):
    """q/k/v/o projections, per-head q/k RMSNorm (STDiT3, Wan), RoPE over the pattern's axes;
    the attention itself is `attend` (the runtime installs the sequence-parallel one)."""

    def __init__(self, shape: ModelShape, pattern: Span):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.axes = ROPE_AXES[pattern]
        self.pairs = rope_pairs(shape.head_dim, len(self.axes))
        self.q = nn.Linear(shape.hidden, shape.heads * shape.head_dim)
        self.k = nn.Linear(shape.hidden, shape.kv_dim)
        self.v = nn.Linear(shape.hidden, shape.kv_dim)
        self.o = nn.Linear(shape.heads * shape.head_dim, shape.hidden)
        self.q_norm, self.k_norm = RMSNorm(shape.head_dim), RMSNorm(shape.head_dim)
        self.attend: AttentionFn = local_attention
        """Swapped by the model's `install_attention` for the sequence-parallel attention."""

    def forward(self, x: Tensor, stream: PackedStream) -> Tensor:
        n = x.shape[0]
        cos, sin = rope_angles(stream.positions[:, self.axes], self.pairs)
        q = apply_rope(self.q_norm(self.q(x).view(n, self.heads, self.head_dim)), cos, sin)
        k = apply_rope(self.k_norm(self.k(x).view(n, self.kv_heads, self.head_dim)), cos, sin)
        v = self.v(x).view(n, self.kv_heads, self.head_dim)
        return self.o(self.attend(q, k, v, stream).reshape(n, self.heads * self.head_dim))


class CrossAttention(nn.Module):
    """Every held token attends to its own sample's condition tokens (Wan's normed input;
    `condition_attention` batches the samples)."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.norm = nn.LayerNorm(shape.hidden, eps=NORM_EPS)
        self.q = nn.Linear(shape.hidden, shape.heads * shape.head_dim)
        # No key bias: it would add the same q . b to all of a query's scores, which softmax
        # ignores (its gradient is 0; self-attention's keys are normalised after it, so keep it).
        self.k = nn.Linear(shape.hidden, shape.kv_dim, bias=False)
        self.v = nn.Linear(shape.hidden, shape.kv_dim)
        self.o = nn.Linear(shape.heads * shape.head_dim, shape.hidden)

    def keys_values(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        return tuple(proj(tokens).view(-1, self.kv_heads, self.head_dim) for proj in (self.k, self.v))

    def forward(self, x: Tensor, held: HeldSamples, condition: Conditioning) -> Tensor:
        n = x.shape[0]
        q = self.q(self.norm(x)).view(n, self.heads, self.head_dim)
        out = condition_attention(q, held, condition.bounds, condition.rows, condition.tokens, self.keys_values)
        return self.o(out.reshape(n, self.heads * self.head_dim))


class VideoBlock(nn.Module):
    """arrange for `pattern` (unless the block before had the same one: `arranges` False);
    adaLN-zero self-attention; cross-attention; adaLN-zero MLP."""

    def __init__(self, shape: ModelShape, pattern: Span, arranges: bool = True):
        super().__init__()
        self.pattern, self.arranges = pattern, arranges
        self.attention_norm = layer_norm(shape.hidden)
        self.attention = SelfAttention(shape, pattern)
        self.cross_attention = CrossAttention(shape)
        self.mlp_norm = layer_norm(shape.hidden)
        self.mlp = MLP(shape)
        self.modulation = nn.Parameter(torch.zeros(6, shape.hidden))
        """This block's table added to the shared projection: shift, scale, gate of attention, then of the MLP."""

    def forward(self, x: Tensor, stream: PackedStream, condition: Conditioning) -> tuple[Tensor, PackedStream]:
        if self.arranges:
            x, stream = stream.arrange(x, self.pattern)
        held = HeldSamples.of(stream)
        # Per token, gathered from its sample: the stream has no batch dimension to broadcast over.
        # index_select, not [held.index]: its backward is an index_add, not advanced indexing's
        # accumulating index_put (which sorts the index: ~0.7 ms a block for 2k tokens on CPU).
        modulation = self.modulation + condition.modulation.index_select(0, held.index)
        shift, scale, gate, mlp_shift, mlp_scale, mlp_gate = modulation.unbind(1)
        x = x + gate * self.attention(modulate(self.attention_norm(x), shift, scale), stream)
        x = x + self.cross_attention(x, held, condition)
        x = x + mlp_gate * self.mlp(modulate(self.mlp_norm(x), mlp_shift, mlp_scale))
        return x, stream


class FinalLayer(nn.Module):
    """LayerNorm modulated by the time embedding and a learned [2, hidden] table, then a linear
    to a token's patch values (zero-initialised: the model starts predicting 0)."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.norm = layer_norm(shape.hidden)
        self.modulation = nn.Parameter(torch.zeros(2, shape.hidden))
        self.linear = nn.Linear(shape.hidden, shape.vocab)

    def forward(self, x: Tensor, stream: PackedStream, condition: Conditioning) -> Tensor:
        time = condition.time.index_select(0, stream.positions[:, 0])  # not [...]: see VideoBlock
        shift, scale = (self.modulation + time[:, None]).unbind(1)
        return self.linear(modulate(self.norm(x), shift, scale))
