"""Joining the world: under NCCL bound to the rank's GPU, so communicators are made at start-up.

The CPU cannot create an NCCL communicator: these tests check what `init_process_group` is
asked for (a stand-in records it), not that NCCL then connects eagerly, which torch documents
for a bound `device_id` (its communicator, and every `new_group` split from it)."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ballast.runtime import world


def test_nccl_binds_the_world_to_local_ranks_gpu_and_gloo_binds_none(monkeypatch):
    asked = []
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: asked.append((args, kwargs)))
    monkeypatch.setattr(world, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(world, "_joined_timeout", None)  # restored after: this process joined no world
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert world.process_device("nccl") == torch.device("cuda", 5)
    assert world.process_device("gloo") is None
    store = dist.HashStore()
    for backend in ("nccl", "gloo"):
        world._init_process_group(backend, store, 5, 8, timedelta(seconds=30))
    assert [(args[0], kwargs["device_id"]) for args, kwargs in asked] == [("nccl", torch.device("cuda", 5)),
                                                                          ("gloo", None)]


def test_local_ranks_are_refused_under_torchrun(monkeypatch):
    """A command that spawns its own gloo ranks, launched by torchrun on GPUs, ran one CPU job per
    GPU and passed: it is an error naming torchrun, before any rank starts."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="does not join torchrun's job"):
        world.run_local(2, print)
