"""A Llama-style decoder over a packed token stream.

RMSNorm, rotary positions that restart at every sequence, SwiGLU (or GELU) MLP and
grouped-query attention, sized by a `ballast.vocabulary.model_shape.ModelShape`. The model sees one token
stream of sequences packed end to end (`PackedStream`): no batch dimension, no padding.

Parallel code stays out of the model (torchtitan style): it implements the runtime's model
protocol (`protocol.ParallelModel`). Every `Attention` calls its `attend` attribute, a callable
`(q, k, v, stream) -> out`; the default attends over the tokens this process holds, and
`GPT.install_attention` (which `ballast.runtime.parallelize` calls) swaps in the
sequence-parallel one. The stream object is passed through untouched, so the runtime may hand
the model a subclass that also says how the stream is sharded over a process group.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..vocabulary.model_shape import ModelShape
from .kernels import local_attention
from .next_token import NextTokenObjective
from .protocol import COLWISE, ROWWISE, VOCAB_EMBEDDING, VOCAB_OUTPUT, AttentionFn, PackedStream
from .stage_layers import StageLayers

ROPE_THETA = 10000.0
NORM_EPS = 1e-5
INIT_STD = 0.02


def apply_rotary(x: Tensor, positions: Tensor) -> Tensor:
    """Rotate pairs (i, i + head_dim/2) of x [tokens, heads, head_dim] by position * frequency."""
    half = x.shape[-1] // 2
    freqs = ROPE_THETA ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos()[:, None, :].to(x.dtype), angles.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


class Attention(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.head_dim = shape.head_dim
        self.wq = nn.Linear(shape.hidden, shape.heads * shape.head_dim, bias=False)
        self.wk = nn.Linear(shape.hidden, shape.kv_dim, bias=False)
        self.wv = nn.Linear(shape.hidden, shape.kv_dim, bias=False)
        self.wo = nn.Linear(shape.heads * shape.head_dim, shape.hidden, bias=False)
        self.attend: AttentionFn = local_attention
        """Swapped by `GPT.install_attention` for the sequence-parallel attention."""

    def forward(self, x: Tensor, stream: PackedStream) -> Tensor:
        # Head counts from the projections, not the shape: tensor parallelism leaves a rank its
        # share of the heads (`protocol.TensorParallelModel`).
        q = apply_rotary(self.wq(x).unflatten(-1, (-1, self.head_dim)), stream.positions)
        k = apply_rotary(self.wk(x).unflatten(-1, (-1, self.head_dim)), stream.positions)
        v = self.wv(x).unflatten(-1, (-1, self.head_dim))
        return self.wo(self.attend(q, k, v, stream).flatten(1))


class MLP(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x)) when the shape is gated, else w2(gelu(w1 x))."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.w1 = nn.Linear(shape.hidden, shape.ffn, bias=False)
        self.w2 = nn.Linear(shape.ffn, shape.hidden, bias=False)
        self.w3 = nn.Linear(shape.hidden, shape.ffn, bias=False) if shape.gated_mlp else None

    def forward(self, x: Tensor) -> Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, shape: ModelShape):
        super().__init__()
        self.attention_norm = RMSNorm(shape.hidden)
        self.attention = Attention(shape)
        self.mlp_norm = RMSNorm(shape.hidden)
        self.mlp = MLP(shape)

    def forward(self, x: Tensor, stream: PackedStream) -> Tensor:
        x = x + self.attention(self.attention_norm(x), stream)
        return x + self.mlp(self.mlp_norm(x))


class GPT(NextTokenObjective, nn.Module):
    """Decoder: token embedding, `shape.layers` blocks, final norm, untied output layer."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.shape = shape
        self.embedding = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden)
        self.output = nn.Linear(shape.hidden, shape.vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)

    def blocks(self) -> nn.ModuleList:
        return self.layers

    def install_attention(self, attend: AttentionFn) -> None:
        for block in self.layers:
            block.attention.attend = attend

    def tensor_parallel_plan(self) -> dict[str, str]:
        """Megatron's split (`protocol.TensorParallelModel`): q, k, v and the MLP's w1, w3 by
        output rows, the output projection and w2 by input columns, embedding and output layer
        (where this model or its pipeline stage holds them) by vocabulary."""
        plan = {**{f"layers.*.attention.{w}": COLWISE for w in ("wq", "wk", "wv")},
                "layers.*.attention.wo": ROWWISE, "layers.*.mlp.w1": COLWISE, "layers.*.mlp.w2": ROWWISE}
        if self.shape.gated_mlp:
            plan["layers.*.mlp.w3"] = COLWISE
        if self.holds_embedding:
            plan["embedding"] = VOCAB_EMBEDDING
        if self.holds_head:
            plan["output"] = VOCAB_OUTPUT
        return plan

    @property
    def holds_embedding(self) -> bool:
        return self.embedding is not None

    @property
    def holds_head(self) -> bool:
        return self.output is not None

    def keep_stage(self, layers: range, first: bool, last: bool) -> None:
        """Keep a pipeline stage's part (`protocol.StagedModel.keep_stage`)."""
        self.layers = StageLayers(self.layers, layers)
        if not first:
            self.embedding = None
        if not last:
            self.norm = self.output = None

    def forward(self, inputs: Tensor, stream: PackedStream, recompute_layers: int = 0) -> Tensor:
        """Logits [tokens, vocab] of the tokens this process holds, or the hidden states
        [tokens, hidden] where a pipeline stage holds no output layer.

        inputs: [n] token ids, one per entry of `stream.positions`, or where the model holds no
        embedding (a later pipeline stage) the previous stage's hidden states [n, hidden]. The
        first `recompute_layers` blocks keep only their input and recompute the rest in
        backward (non-reentrant `torch.utils.checkpoint`).
        """
        rank = 1 if self.holds_embedding else 2
        if inputs.dim() != rank or inputs.shape[0] != stream.positions.shape[0]:
            raise ValueError(f"inputs of shape {tuple(inputs.shape)} do not match the stream's "
                             f"{stream.positions.shape[0]} positions ({'token ids' if rank == 1 else 'hidden states'})")
        if not 0 <= recompute_layers <= len(self.layers):
            raise ValueError(f"recompute_layers {recompute_layers} is outside 0..{len(self.layers)}")
        x = self.embedding(inputs) if self.holds_embedding else inputs
        for i, layer in enumerate(self.layers):
            if i < recompute_layers:
                x = checkpoint(layer, x, stream, use_reentrant=False)
            else:
                x = layer(x, stream)
        return self.output(self.norm(x)) if self.holds_head else x


def build_gpt(shape: ModelShape, seed: int = 0) -> GPT:
    """A GPT with weights that depend only on `seed` (every rank builds the same model)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(shape)
