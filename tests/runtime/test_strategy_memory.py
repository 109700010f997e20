"""What a device holds under a strategy (`runtime/strategy.py`): the model of record is built once
on the host and a compute model without weights (meta), so the device gets only the canonical
shards and its stage's TP shard, never the whole model; and `parallelize` moves a host-built
model to the device only after cutting it.

On CPU the host and the device are one, so these tests cannot show bytes on a GPU: they show
what decides them, which tensors are built where (meta for the compute model, the host for the
model of record) and which parameters a rank's compute model holds after the cut. That the
weights gathered into a meta-built model and its restored buffers are right is the exactness
tests' (`test_strategy_runtime.py`: the Hugging Face Llama's RoPE frequencies are buffers).
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from runtime_cases import SHAPE

from ballast.models import build_model
from ballast.runtime import parallelize, run_local
from ballast.runtime.placement import broadcast_weights
from ballast.runtime.strategy import StrategyExecutor
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.strategy import Strategy


def _recording_build(calls: list[str], weights: bool = True):
    model = build_model(SHAPE, 0, weights=weights)
    calls.append({p.device.type for p in model.parameters()}.pop())
    return model


def _worker() -> dict:
    torch.set_num_threads(1)
    calls: list[str] = []
    executor = StrategyExecutor(functools.partial(_recording_build, calls), get_cluster("cpu", 2), lr=1e-3)
    _, pipeline, _ = executor.executor(Strategy.parse("1x2"))
    held = {name for name, _ in pipeline.model.named_parameters()}
    devices = {p.device.type for p in pipeline.model.parameters()}
    return dict(calls=calls, held=held, devices=devices, shard=sum(s.numel() for s in executor.canonical.shards))


@pytest.mark.slow
def test_a_compute_model_is_built_without_weights_and_holds_only_its_stage():
    ranks = run_local(2, _worker, timeout=120)
    whole = dict(build_model(SHAPE, 0).named_parameters())
    total = sum(p.numel() for p in whole.values())
    for rank, out in enumerate(ranks):
        # The shape from a meta build (what the build turns count), the model of record on the
        # host once, each compute model on the meta device.
        assert out["calls"] == ["meta", "cpu", "meta"] and out["devices"] == {"cpu"}
        # A 2-stage pipeline: each rank holds its half of the blocks, the embedding on the first
        # stage and the output layer on the last, and about half of the state in its shards.
        blocks = {name.split(".")[1] for name in out["held"] if name.startswith("layers.")}
        assert blocks == {str(i) for i in range(rank * SHAPE.layers // 2, (rank + 1) * SHAPE.layers // 2)}
        assert set(out["held"]) < set(whole) and total // 2 <= out["shard"] < total // 2 + 2 * len(whole)


def _meta_worker() -> None:
    parallelize(build_model(SHAPE, 0, weights=False), get_cluster("cpu", 1))


def test_a_model_without_weights_is_refused_a_broadcast():
    with pytest.raises(ValueError, match="built without weights"):
        run_local(1, _meta_worker, timeout=60)


def _broadcast_worker() -> list[torch.Tensor]:
    model = build_model(SHAPE, dist.get_rank())  # different weights on each rank
    broadcast_weights(model, bucket_bytes=4096)  # many buckets, several tensors alone in theirs
    return [p.detach() for p in model.parameters()]


@pytest.mark.slow
def test_weights_broadcast_a_bucket_at_a_time_are_rank_0s():
    ranks = run_local(2, _broadcast_worker, timeout=120)
    expected = [p.detach() for p in build_model(SHAPE, 0).parameters()]
    for got in ranks:
        assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
