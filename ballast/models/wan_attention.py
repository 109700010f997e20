"""ballast's attention inside a diffusers Wan transformer, through diffusers' own extension
point: one attention processor (`WanAttention.set_processor`, installed on every attention
module by `set_attn_processor`) that keeps the model's projections, q/k norms, RoPE formula and
output projection and replaces only what attends.

Wan's blocks hand their self-attention `rotary_emb` and their cross-attention
`encoder_hidden_states` untouched, so ballast's wrapper (`diffusers_wan.py`) passes its own
values through them: `PackedRotary` (every held token's cos and sin, taken from the model's
RoPE table at the token's own (frame, row, column) in its own clip, and the stream) and
`PackedText` (every clip's text after the model's text embedder, and which clip each held token
belongs to). With them the processor attends
  - self-attention: the installed `AttentionFn` over the packed stream, bidirectional inside
    every clip (the runtime's Ulysses x CP attention, or local attention in one process);
  - cross-attention: every held token to its own clip's text only (`condition_attention`).
Called with anything else (the model's own forward, as diffusers runs it) it is diffusers'
`WanAttnProcessor`, so the model stays what it was for inference and for verify's reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .condition_attention import condition_attention
from .kernels import local_attention
from .protocol import AttentionFn, PackedStream
from .video_conditioning import HeldSamples


@dataclass(frozen=True)
class PackedRotary:
    """A self-attention's `rotary_emb` inside ballast: the held tokens' rotation and stream."""

    cos: Tensor
    """[1, tokens held, 1, head_dim]: cos of every held token's angles (diffusers' layout)."""
    sin: Tensor
    stream: PackedStream
    """The stream the held tokens are laid out in (what the attention function attends over)."""


@dataclass(frozen=True)
class PackedText:
    """A cross-attention's `encoder_hidden_states` inside ballast: every clip's text."""

    tokens: Tensor
    """[text tokens of all clips, hidden]: every clip's text embedding after the model's text
    embedder, clip after clip."""
    bounds: tuple[int, ...]
    """Where each clip's text starts in `tokens`, and the end."""
    held: HeldSamples
    """Which clip each held token belongs to (in the layout of the blocks' stream)."""

    @property
    def rows(self) -> Tensor:
        """Every clip's rows of `tokens`, clip after clip (each clip has its own)."""
        return torch.arange(self.bounds[-1])


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Wan's RoPE on x [..., heads, head_dim]: pairs (2i, 2i + 1) turned by the angle whose cos
    and sin diffusers' table repeats at 2i and 2i + 1 (WanAttnProcessor's formula, value for value)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class BallastWanProcessor:
    """The attention processor of every attention module of a Wan model trained by ballast."""

    def __init__(self) -> None:
        from diffusers.models.transformers.transformer_wan import WanAttnProcessor

        self.attend: AttentionFn = local_attention
        """Swapped by the wrapper's `install_attention` for the sequence-parallel attention."""
        self.stock = WanAttnProcessor()
        """diffusers' own, for every call from outside ballast's wrapper."""

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states=None,
                 attention_mask: Tensor | None = None, rotary_emb=None, **kwargs) -> Tensor:
        if isinstance(rotary_emb, PackedRotary):
            return self.self_attention(attn, hidden_states, rotary_emb)
        if isinstance(encoder_hidden_states, PackedText):
            return self.cross_attention(attn, hidden_states, encoder_hidden_states)
        return self.stock(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb, **kwargs)

    def self_attention(self, attn: nn.Module, x: Tensor, rotary: PackedRotary) -> Tensor:
        """x [1, tokens held, hidden] -> [1, tokens held, hidden]."""
        q, k = attn.norm_q(attn.to_q(x)), attn.norm_k(attn.to_k(x))
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, attn.to_v(x)))
        q, k = rotate(q, rotary.cos, rotary.sin), rotate(k, rotary.cos, rotary.sin)
        out = self.attend(q[0], k[0], v[0], rotary.stream)
        return _output(attn, out[None].flatten(2, 3).type_as(q))

    @staticmethod
    def cross_attention(attn: nn.Module, x: Tensor, text: PackedText) -> Tensor:
        """x [1, tokens held, hidden] -> [1, tokens held, hidden]: each token to its clip's text."""
        q = attn.norm_q(attn.to_q(x)).unflatten(2, (attn.heads, -1))

        def keys_values(tokens: Tensor) -> tuple[Tensor, Tensor]:
            return (attn.norm_k(attn.to_k(tokens)).unflatten(-1, (attn.heads, -1)),
                    attn.to_v(tokens).unflatten(-1, (attn.heads, -1)))

        out = condition_attention(q[0], text.held, text.bounds, text.rows, text.tokens, keys_values)
        return _output(attn, out[None].flatten(2, 3).type_as(q))


def _output(attn: nn.Module, out: Tensor) -> Tensor:
    """The module's output projection (and its dropout, which ballast requires off)."""
    return attn.to_out[1](attn.to_out[0](out))
