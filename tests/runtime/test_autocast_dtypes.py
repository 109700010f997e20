"""Under autocast, q, k and v reach the exchanges and the attention kernel in its dtype, whatever
a model's RoPE and norms promote them to (transformers' RoPE builds cos and sin in fp32; an
RMSNorm's fp32 weight promotes q and k).

CPU bf16 autocast shows the promotion and its cast; it runs no CUDA kernel: that the GPU then
picks flash-attn for bf16 tensors is `attention_kernel`'s rule, checked in test_cuda.py on a GPU."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ballast.models import build_model
from ballast.models import kernels
from ballast.models.protocol import PackedStream
from ballast.runtime import sequence_parallel_attention
from ballast.runtime import attention as ulysses, context_parallel
from ballast.runtime.attention import StreamShard
from ballast.runtime.hybrid import HybridShard
from ballast.verify.reference import random_batches
from ballast.vocabulary.model_shape import get_model_shape
from hf_folders import save_model

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module", params=["tiny", "hf-llama-gqa", "stdit-tiny", "dit-tiny"])
def model_and_batch(request, tmp_path_factory):
    name = request.param
    if name == "hf-llama-gqa":
        name = f"hf:{save_model(tmp_path_factory.mktemp('hf') / 'llama', 'LlamaConfig', num_key_value_heads=2)}"
    shape = get_model_shape(name)
    model = build_model(shape, 0)
    model.install_attention(sequence_parallel_attention)
    return model, random_batches(shape, 1, 4, 24, 0)[0].samples


class Stop(Exception):
    """Raised by a recording stand-in once it has seen what it records."""


def _loss(model, samples, stream, local) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.loss(samples, stream, local)


def test_the_kernel_gets_the_autocast_dtype(model_and_batch, monkeypatch):
    model, samples = model_and_batch
    seen = []
    kernel = kernels.KERNELS["sdpa"]

    def recording(q, k, v, bounds, causal):
        seen.append({q.dtype, k.dtype, v.dtype})
        return kernel(q, k, v, bounds, causal)

    monkeypatch.setitem(kernels.KERNELS, "sdpa", recording)
    stream = PackedStream.of([model.sample_shape(s) for s in samples])
    _loss(model, samples, stream, slice(0, stream.bounds[-1]))
    assert seen and all(dtypes == {torch.bfloat16} for dtypes in seen), seen


def test_ulysses_exchanges_the_autocast_dtype(model_and_batch, monkeypatch):
    model, samples = model_and_batch
    seen = []

    def exchange(x, how):
        seen.append(x.dtype)
        raise Stop

    monkeypatch.setattr(ulysses, "all_to_all", exchange)
    stream = StreamShard.create([model.sample_shape(s) for s in samples], None, 2, 0)
    with pytest.raises(Stop):
        _loss(model, samples, stream, stream.local)
    assert seen == [torch.bfloat16]


def test_context_parallelism_gathers_the_autocast_dtype(model_and_batch, monkeypatch):
    model, samples = model_and_batch
    seen = []

    def gather(kv, shard):
        seen.append(kv.dtype)
        raise Stop

    monkeypatch.setattr(context_parallel, "_gather", gather)
    # Pure CP over 2 ranks (u = 1), this being rank 0; no group: the gather is the stand-in.
    stream = HybridShard.create([model.sample_shape(s) for s in samples],
                                SimpleNamespace(cp=2, context=None, ulysses=None), 2, 0)
    with pytest.raises(Stop):
        _loss(model, samples, stream, stream.local)
    assert seen == [torch.bfloat16]
