"""Megatron's split layers, each made from the model's own module, built alike on
every rank: the rank keeps its shard of the weights and the module communicates through f and g
(`collectives.py`).

    ColumnParallelLinear   W split by output rows: rank j computes its outputs (its heads of
                           q, k, v; its columns of the MLP's gate and up; its vocabulary entries
                           of the logits) from the whole input; f before it
    RowParallelLinear      W split by input columns: rank j multiplies its inputs (the heads or
                           MLP columns the column-parallel layer before left on it); g after it
                           sums the partial outputs, then the bias (whole on every rank) is added
    VocabParallelEmbedding the table split by vocabulary rows: rank j looks up the tokens in its
                           range, zeros for the others; g sums them into every token's row

Shards are the equal consecutive blocks of `torch.chunk`: rank j of t holds block j, so a GQA
model's rank holds query heads j H/t .. (j + 1) H/t - 1 and exactly the kv heads they read.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from .collectives import copy_to_tensor_parallel, reduce_from_tensor_parallel


def shard(tensor: Tensor, dim: int, degree: int, index: int) -> nn.Parameter:
    """Block `index` of `degree` equal blocks of `tensor` along `dim`, as a parameter of its own."""
    assert tensor.shape[dim] % degree == 0, (tuple(tensor.shape), dim, degree)
    return nn.Parameter(tensor.detach().chunk(degree, dim)[index].clone(), requires_grad=tensor.requires_grad)


class ColumnParallelLinear(nn.Module):
    """y_j = x W_jᵀ + b_j, W_j the index-th block of W's rows (and b's): f, then the local matmul.
    Its output stays split over the group (the next layer, row-parallel or the vocabulary-parallel
    loss, takes it split)."""

    def __init__(self, linear: nn.Linear, group: ProcessGroup, degree: int, index: int,
                 weight: nn.Parameter | None = None):
        super().__init__()
        self.group = group
        self.weight = weight if weight is not None else shard(linear.weight, 0, degree, index)
        self.bias = shard(linear.bias, 0, degree, index) if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(copy_to_tensor_parallel(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = Σ_j x_j W_jᵀ + b, W_j the index-th block of W's columns: the local matmul, then g; the
    bias, whole on every rank, is added once after the sum."""

    def __init__(self, linear: nn.Linear, group: ProcessGroup, degree: int, index: int):
        super().__init__()
        self.group = group
        self.weight = shard(linear.weight, 1, degree, index)
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x: Tensor) -> Tensor:
        out = reduce_from_tensor_parallel(F.linear(x, self.weight), self.group)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """The rows of vocabulary entries start .. start + V/t - 1; a token outside them looks up
    zeros here and its row on the rank that holds it, and g sums the ranks' rows."""

    def __init__(self, embedding: nn.Embedding, group: ProcessGroup, degree: int, index: int):
        super().__init__()
        if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
            raise ValueError("tensor parallelism splits plain embeddings only (no max_norm, scale_grad_by_freq "
                             "or sparse gradients)")
        self.group = group
        self.weight = shard(embedding.weight, 0, degree, index)
        self.start = index * self.weight.shape[0]
        padding = embedding.padding_idx
        # The padding row gets no gradient; it is local where this rank holds it.
        self.padding_idx = padding - self.start if padding is not None and 0 <= padding - self.start < \
            self.weight.shape[0] else None

    def forward(self, tokens: Tensor) -> Tensor:
        local = tokens - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), self.weight, self.padding_idx)
        return reduce_from_tensor_parallel(rows.masked_fill(outside.unsqueeze(-1), 0.0), self.group)

