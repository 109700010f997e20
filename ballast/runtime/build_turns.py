"""How many of a host's ranks may build the whole model on it at once (`in_turns`, for
`parallelize` given a `ModelBuild` and for the strategy executor's model of record).

Every rank builds the model whole on its host (its seed's weights, or an hf: folder's), keeps its
stage's part and TP shard and moves that to its device. Built by all the host's ranks at once, a
model of P parameters takes 4 P bytes of host memory per rank: Llama-3-70B, 280 GB, times eight
ranks is more than most GPU nodes have. So the ranks of a host take turns: as many at a time as
its available memory holds whole models (HOST_SHARE of it), each freeing its whole copy before
the next turn builds. One turn wherever the model is small against the host (every CPU test,
every model up to ~30B on a 2 TB node of eight GPUs), so nothing waits then.

Rank 0 counts for everyone (its host's memory; every host of a job is alike), so all ranks agree
on the number of turns, which they meet at a barrier after each.

A model whose weights a rank can read a tensor at a time (`ModelBuild.part`: a Hugging Face
folder's safetensors) takes no turns: each rank builds it without weights, keeps its part and
reads only that (`placement.py`).
"""
from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import torch.distributed as dist

from ..models.protocol import ParallelModel, PartLoad
from ..pricing.device_memory import ParameterCounts
from ..vocabulary.model_shape import ModelShape

T = TypeVar("T")

HOST_SHARE = 0.8
"""Of the host's available memory, the share whole models may take (the rest: the data, the
tokenizer, the libraries, a model loader's transient copies)."""
BYTES_PER_PARAMETER = 4
"""A model is built in fp32 on the host."""


@dataclass(frozen=True)
class ModelBuild:
    """A model for `parallelize` to build on the host, in turns: its shape (what the turns count,
    and what the mesh is checked against before anything is built) and what builds it."""

    shape: ModelShape
    build: Callable[[], ParallelModel]
    part: PartLoad | None = None
    """How a rank reads only its part of the weights instead (`models.part_load`), where it can."""


@dataclass(frozen=True)
class BuildTurns:
    """Turns in which a host's ranks build the whole model: `count` turns of `size` ranks."""

    size: int
    count: int

    def mine(self) -> int:
        """The turn this process builds in: its index among its host's ranks over the turn size."""
        return local_rank() // self.size


def local_rank() -> int:
    """This process's index among its host's ranks (torchrun's LOCAL_RANK; local gloo ranks all
    share one host: the global rank)."""
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))


def local_ranks() -> int:
    """How many ranks this host runs (torchrun's LOCAL_WORLD_SIZE; local gloo ranks: the world)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))


def available_host_bytes() -> int | None:
    """The host's available memory (/proc/meminfo's MemAvailable), None where it is not known."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def turns_for(parameters: int, ranks: int, available: int | None) -> BuildTurns:
    """Turns for `ranks` ranks of a host with `available` bytes (None: all at once) to build a
    model of `parameters` parameters whole."""
    assert parameters > 0 and ranks > 0, (parameters, ranks)
    if available is None:
        return BuildTurns(ranks, 1)
    size = max(1, min(ranks, int(HOST_SHARE * available // (BYTES_PER_PARAMETER * parameters))))
    return BuildTurns(size, math.ceil(ranks / size))


def in_turns(shape: ModelShape, work: Callable[[], T], src: int = 0, group=None) -> T:
    """`work()` (which builds a model of `shape` whole on the host and keeps only its part) run
    in this rank's turn, the turns meeting at a barrier of `group` (the job's ranks, `src` its
    first); what it returned. The whole copy is collected before the next turn builds."""
    turns = build_turns(ParameterCounts.of_shape(shape).total, src, group)
    out = None
    for turn in range(turns.count):
        if turn == turns.mine():
            out = work()
            gc.collect()
        if turns.count > 1:
            dist.barrier(group=group)
    return out


def build_turns(parameters: int, src: int, group=None) -> BuildTurns:
    """The job's turns, as global rank `src` (the job's first) counts them for its host (a
    collective of `group`, the job's ranks)."""
    counted = [turns_for(parameters, local_ranks(), available_host_bytes()) if dist.get_rank() == src else None]
    dist.broadcast_object_list(counted, src=src, group=group)
    return counted[0]
