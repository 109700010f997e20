"""What tensor parallelism changes in a cost model: the coefficients become a TP rank's (one
device of every pool rank's TP group of t), and the group's own all-reduces join the per-token
and fixed terms. The cost model's formulas stay as they are (docs/design.md, section 4): a plan
over the pool is priced by the same `CostModel`, whose coefficients this module shards.

    a, b          x phi / t: a rank computes its heads' attention and its shard of every
                  matmul (the output layer's vocabulary too); phi (`TensorTerms.compute_factor`)
                  1 for the presets, measured by a profile
    b             + the TP all-reduces' seconds per token (4 per block: forward after the
                  output and down projections, backward before q, k, v and before the MLP; 2 for
                  the embedding and the output layer), ring all-reduces of the hidden state over
                  the TP link (`TensorTerms`: the degree's bandwidth inside a node, or measured;
                  `all_reduce_seconds_per_token`)
    r             a recomputed block repeats its 2 forward all-reduces, half of its 4: r is
                  re-weighted so b r prices the matmuls' r and the all-reduces' 1/2
    g, g_r        + the all-reduces' calls at the link's latency (g_r: the 2
                  repeated per recomputed block)
    heads, kv, all-to-all bytes   / t: Ulysses and CP move a rank's heads only
    memory        parameters per TP shard (`parameter_counts`); activations 5 + 12 / t values
                  per hidden per block (`activation_share`); the loss's logits of vocab / t

Sequence-parallel activations are not run (`runtime/tensor_parallel`), so the 5 values a
block keeps whole on every TP rank are priced whole.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..vocabulary.cluster import Cluster
from ..vocabulary.job_mesh import JobMesh
from ..vocabulary.model_shape import ModelShape
from .cost import CostModel
from .device_memory import ParameterCounts

ALL_REDUCES_PER_LAYER = 4
"""A block's TP all-reduces of its hidden state, forward and backward: g after the attention's
output projection and after the MLP's down projection, f's before q, k, v and before the MLP."""
RECOMPUTED_ALL_REDUCES_PER_LAYER = 2
"""Those a recomputed block runs again: its forward's two."""
ROOT_ALL_REDUCES = 2
"""The embedding's g (forward) and the output layer's f (backward), outside every block."""
WHOLE_VALUES_PER_HIDDEN = 5
SPLIT_VALUES_PER_HIDDEN = 12
"""Korthikanti et al. 2022, Table 2: with tensor parallelism and no sequence parallelism a block
saves s b h (10 + 24 / t) bytes in bf16 (without the s^2 term, as flash attention keeps none):
5 values per hidden whole on every TP rank (the norms' and the MLP's inputs, residuals, dropout
masks), 12 split with the heads and MLP columns; 17 at t = 1 (`cost_sources.ACT_VALUES_PER_HIDDEN`)."""


def activation_share(tp: int) -> float:
    """The share of a block's activations per token a TP rank keeps, (5 + 12 / t) / 17."""
    return (WHOLE_VALUES_PER_HIDDEN + SPLIT_VALUES_PER_HIDDEN / tp) / (WHOLE_VALUES_PER_HIDDEN + SPLIT_VALUES_PER_HIDDEN)


def parameter_counts(shape: ModelShape, tp: int) -> ParameterCounts:
    """A TP rank's parameters: its shard of every block's matrices and of the embedding and the
    output layer (split by vocabulary), the norms whole."""
    counts = ParameterCounts.of_shape(shape)
    if tp == 1:
        return counts
    norms = 2 * shape.hidden
    block = shape.layer_matmul_params // tp + norms
    embeddings = (1 if shape.tied_embeddings else 2) * shape.vocab * shape.hidden // tp
    root = embeddings + shape.hidden
    return ParameterCounts(total=shape.layers * block + root, autocast=counts.autocast // tp, block=block, root=root)


@dataclass(frozen=True)
class TensorTerms:
    """What a TP rank of degree t pays besides its whole-layer coefficients: each all-reduce of
    hidden states, seconds = latency + `ring_bytes` / bandwidth per call, and its compute over
    1 / t of the whole layers'. A preset's (`of_cluster`) or measured by `ballast profile`
    (`profile/tensor_terms.py`)."""

    bandwidth: float
    """Bytes/s each rank moves in the ring."""
    latency: float
    """Seconds per call beyond its bytes."""
    value_bytes: float
    """Bytes per value of the all-reduced hidden state (the executor's precision)."""
    compute_factor: float = 1.0
    """A TP rank's compute (a, b) over its shard's share a / t, b / t: 1 where every per-token
    cost splits with the matmuls (FLOPs, the presets); above 1 where some does not (norms,
    residual adds and element-wise work on the whole hidden state, smaller matmuls running
    less efficiently), as a profile measures it."""

    @classmethod
    def of_cluster(cls, cluster: Cluster, tp: int) -> TensorTerms:
        """The cluster's: its all-to-all bandwidth of degree t (the TP group's links inside a node)
        and per-call latency, at its value size; compute split exactly."""
        return cls(cluster.bandwidth[tp], cluster.all_to_all_latency, cluster.value_bytes)


def ring_bytes(tensor_bytes: float, tp: int) -> float:
    """Bytes each rank of a ring all-reduce of `tp` ranks sends: 2 (t - 1) / t of the tensor."""
    return 2 * (tp - 1) / tp * tensor_bytes


def all_reduce_seconds_per_token(shape: ModelShape, terms: TensorTerms, tp: int) -> float:
    """Seconds per token of a micro-batch's TP all-reduces, forward and backward: each moves a
    token's hidden state, `ring_bytes` of it per rank, over the TP group's link (`terms`)."""
    if tp == 1:
        return 0.0
    calls = ALL_REDUCES_PER_LAYER * shape.layers + ROOT_ALL_REDUCES
    return calls * ring_bytes(shape.hidden * terms.value_bytes, tp) / terms.bandwidth


def sharded(cost: CostModel, shape: ModelShape, terms: TensorTerms | None, mesh: JobMesh) -> CostModel:
    """`cost`, priced on the mesh's pool cluster with a TP shard's memory (`cost_sources`), as
    a TP rank's coefficients (module docstring) under `terms` (None without TP)."""
    t = mesh.tp
    if t == 1:
        return dataclasses.replace(cost, mesh=mesh)
    assert terms is not None, "TP prices its all-reduces and compute share from its terms"
    per_token = all_reduce_seconds_per_token(shape, terms, t)
    repeated = per_token * RECOMPUTED_ALL_REDUCES_PER_LAYER * shape.layers / (
        ALL_REDUCES_PER_LAYER * shape.layers + ROOT_ALL_REDUCES)
    # Multiplied by the factor before dividing by t: at a factor of 1 the presets' prices are
    # those of a / t and b / t to the last bit.
    phi = terms.compute_factor
    b = cost.b * phi / t + per_token
    latency = terms.latency
    return dataclasses.replace(
        cost, a=cost.a * phi / t, b=b, recompute=(cost.recompute * cost.b * phi / t + repeated) / b,
        recompute_attention=cost.recompute_attention,
        g=cost.g + (ALL_REDUCES_PER_LAYER * shape.layers + ROOT_ALL_REDUCES) * latency,
        recompute_fixed=cost.recompute_fixed + RECOMPUTED_ALL_REDUCES_PER_LAYER * shape.layers * latency,
        heads=cost.heads // t, kv_heads=cost.kv_heads // t, bytes_per_token=cost.bytes_per_token / t, mesh=mesh)
