"""Tensor parallelism (Megatron-LM's split), applied to a built model.

    collectives.py    f and g, the TP group's all-reduces as autograd functions
    layers.py         column- and row-parallel linear layers, the vocabulary-parallel embedding
    cross_entropy.py  the loss over a vocabulary split across the group
    apply.py          a model's `tensor_parallel_plan` applied in place; `TensorParallel`

Per block, forward: f before q, k, v (none: the input is whole), g after the output projection
(one all-reduce of [tokens, hidden]), f before the MLP's gate and up, g after its down
projection; backward the mirror image (f all-reduces, g passes through). Two all-reduces of
the hidden state per block each way, plus the embedding's g and the output layer's f.

Between the split regions the hidden state is whole on every rank of the group: no
sequence-parallel activations (Korthikanti et al.'s, which cut the norms' and residuals'
activations t ways by replacing each all-reduce with a reduce-scatter and an all-gather). The
pool's Ulysses and CP groups already shard those activations by tokens, t-fold sequence
parallelism would cut the same rows again inside the TP group, and it would double the TP
collectives' calls, which gloo pays about a millisecond each. The memory model prices what this
keeps (`pricing/tensor_parallel.py`).

Attention runs on a TP rank's share of the heads: q has heads / t heads, k and v kv heads / t,
and the pool's Ulysses and CP exchanges (`attention.py`, `hybrid.py`) move only those, so a
group's Ulysses part must divide heads / t (`JobMesh.split_why_not`).
"""
from .apply import TensorParallel, parallelize_tensors

__all__ = ["TensorParallel", "parallelize_tensors"]
