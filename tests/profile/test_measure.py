"""The profiler's measurement as the GPU path needs it, shown where the CPU can show it: bytes
per value read from what the exchanges held (an HF model under bf16 autocast mixes dtypes),
no host synchronisation around an exchange, one depth's model resident at a time, and the
default device memory chosen by where the ranks compute.

What these CPU runs do not reach: CUDA events (`measure.Stopwatch` on a GPU), NCCL, and the
GPU's own memory (`default_device_memory` reads a stand-in of torch.cuda's properties)."""
from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from ballast.profile import machine, measure
from ballast.profile.exchange import expected_values
from ballast.profile.grid import Point
from ballast.profile.measure import combine, depth_phases, measure_on_ranks
from ballast.profile.profiler import all_to_all_value_bytes
from ballast.runtime import run_local
from ballast.vocabulary.cluster import GPU_RESERVE
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.precision import Precision
from hf_folders import save_model

POINTS = [Point(1, (128,), 2, 0), Point(2, (128,), 2, 1)]


def _spied_measure(*args, **kwargs) -> dict:
    """`measure_on_ranks`, watched: the dtypes every all-to-all sent, the device synchronisations
    of each point, and how many earlier depths' models were alive when each model was built."""
    sent: dict[torch.dtype, int] = {}
    syncs, alive_at_build, built = [], [], []
    real_all_to_all, real_sync = dist.all_to_all_single, measure.synchronize
    real_build, real_point = measure.build_model, measure._measure_point
    count = [0]

    def all_to_all(output, input, *a, **k):
        sent[input.dtype] = sent.get(input.dtype, 0) + input.numel()
        return real_all_to_all(output, input, *a, **k)

    def synchronize(device):
        count[0] += 1
        real_sync(device)

    def build(shape, seed):
        gc.collect()
        alive_at_build.append(sum(ref() is not None for ref in built))
        model = real_build(shape, seed)
        built.append(weakref.ref(model))
        return model

    def point(executor, p, *a):
        before = count[0]
        record = real_point(executor, p, *a)
        syncs.append((p.layers, count[0] - before))
        return record

    dist.all_to_all_single, measure.synchronize = all_to_all, synchronize
    measure.build_model, measure._measure_point = build, point
    result = measure_on_ranks(*args, **kwargs)
    return dict(result, sent={str(d): n for d, n in sent.items()}, syncs=syncs, alive_at_build=alive_at_build)


@pytest.mark.slow
def test_an_hf_model_under_bf16_autocast_profiles_at_its_exchanged_dtypes(tmp_path):
    """A GQA Llama under bf16 autocast on 2 gloo ranks, one depth at a time (the GPU's schedule).
    The profile measured everything and then raised on its 3.3 bytes per value (fp32 q, k, v
    after RoPE's promotion, a bf16 output); now the value size is the dtypes' mix, checked against
    a spy of every send buffer. Each point synchronises the device at its two ends only, whatever
    its depth (it did around every all-to-all: 2 more per call). No model was alive when the next
    depth's was built."""
    shape = get_model_shape("hf:" + str(save_model(tmp_path / "llama", "LlamaConfig", num_key_value_heads=2)))
    per_rank = run_local(2, _spied_measure, shape, POINTS, 1, 1, 0, False, Precision.BF16, True, timeout=600)
    measured = combine(POINTS, per_rank)
    sent = per_rank[0]["sent"]
    sizes = {name: torch.empty(0, dtype=getattr(torch, name.split(".")[1])).element_size() for name in sent}
    mix = sum(sizes[name] * n for name, n in sent.items()) / sum(sent.values())
    assert "torch.bfloat16" in sent  # autocast reached the exchanges
    assert all_to_all_value_bytes(measured, shape) == pytest.approx(mix)
    for m in measured[:2]:
        assert m.comm_values == expected_values(m.point, shape, m.shard_tokens)
    assert {syncs for rank in per_rank for _, syncs in rank["syncs"]} == {2}
    assert per_rank[0]["alive_at_build"] == [0, 0]


def test_depths_are_resident_one_at_a_time_on_gpus_and_together_on_cpus():
    assert depth_phases([2, 1, 8, 2], one_at_a_time=True) == [(1,), (2,), (8,)]
    assert depth_phases([2, 1, 8, 2], one_at_a_time=False) == [(1, 2, 8)]


def test_default_device_memory_is_the_gpus_under_torchrun_on_gpus_else_ram_per_rank(monkeypatch):
    """Under torchrun the profile took host RAM / world for a GPU's memory and carried it into
    `train`. Where the ranks compute decides: the card's memory less the presets' reserve, read
    from LOCAL_RANK's device (a stand-in of torch.cuda's properties here: no GPU)."""
    monkeypatch.setenv("LOCAL_RANK", "3")
    asked = []

    def properties(index):
        asked.append(index)
        return SimpleNamespace(total_memory=80e9)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert machine.default_device_memory(8, on_gpus=True) == 80e9 - GPU_RESERVE
    assert asked == [3]
    assert machine.default_device_memory(8, on_gpus=False) == machine.physical_memory() / 8
