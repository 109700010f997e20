"""The plan broadcast sends the samples' tensors as tensors: their structure pickled with the
plan, their contents in one flat buffer (gloo here; NCCL puts the buffer on the GPU, which these
CPU ranks do not reach)."""
from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist

from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.runtime import broadcast_plan, run_local
from ballast.runtime.broadcast import with_tensors, without_tensors
from ballast.vocabulary.clip import Clip


def _samples() -> list:
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn(4, 3, 8, 8, generator=generator)
    caption = torch.randn(5, 7, generator=generator).bfloat16()
    return [torch.randint(0, 256, (33,), generator=generator), Clip(latent, caption, key=11),
            Clip(latent[:, :1].clone(), 3, key=12), torch.ones(3, dtype=torch.bool)]


def _plan() -> Plan:
    return Plan([32, 3 * 64, 64, 2], [Wave([Group(0, 2, [MicroBatch([0, 1, 2, 3])])])], planner="test")


def _receive() -> dict:
    """Broadcast rank 0's samples, watching what the object broadcast pickles and which
    tensor broadcasts run."""
    pickled, tensor_bytes = [], []
    real_objects, real_broadcast = dist.broadcast_object_list, dist.broadcast

    def objects(payload, *args, **kwargs):
        if payload[0] is not None:
            pickled.append(len(pickle.dumps(payload)))
        return real_objects(payload, *args, **kwargs)

    def broadcast(tensor, *args, **kwargs):
        tensor_bytes.append(tensor.numel() * tensor.element_size())
        return real_broadcast(tensor, *args, **kwargs)

    dist.broadcast_object_list, dist.broadcast = objects, broadcast
    mine = dist.get_rank() == 0
    plan, samples = broadcast_plan(_plan() if mine else None, _samples() if mine else None)
    return dict(plan=plan.to_dict(), samples=samples, pickled=pickled, tensor_bytes=tensor_bytes)


def _same(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    return (got.key == want.key and _same(got.latent, want.latent)
            and (_same(got.condition, want.condition) if isinstance(want.condition, torch.Tensor)
                 else got.condition == want.condition))


@pytest.mark.slow
def test_samples_tensors_travel_as_one_flat_buffer_not_pickled():
    """Each step's latents were pickled into the plan's object broadcast; now the object carries
    a few hundred bytes of structure and the tensors' bytes go in one tensor broadcast."""
    sender, receiver = run_local(2, _receive)
    want = _samples()
    data = sum(t.numel() * t.element_size() for s in want
               for t in ([s] if isinstance(s, torch.Tensor) else [s.latent, s.condition])
               if isinstance(t, torch.Tensor))
    assert receiver["plan"] == _plan().to_dict()
    assert all(_same(got, w) for got, w in zip(receiver["samples"], want)) and len(receiver["samples"]) == len(want)
    assert sender["tensor_bytes"] == receiver["tensor_bytes"] == [data]
    (pickled,) = sender["pickled"]
    assert pickled < 2000 < data


def test_structure_and_tensors_round_trip():
    tensors: list[torch.Tensor] = []
    structure = without_tensors(_samples(), tensors)
    assert len(tensors) == 5 and len(structure) < 1000
    assert all(_same(got, want) for got, want in zip(with_tensors(structure, tensors), _samples()))
