"""Checkpoints that a crash cannot corrupt, and resuming from the newest one.

A checkpoint is a folder `step-NNNNNNNN` (NNNNNNNN = steps completed) holding
  - model and optimizer state, written by `torch.distributed.checkpoint` (DCP): every rank
    writes its share in parallel and DCP de-duplicates the replicated tensors, so the same
    code serves one host or many, CPU or GPU;
  - `rng-rankR.pt`: rank R's random generators (torch, CUDA, numpy, Python);
  - `meta.json` (rank 0): the step, the model (`model_record`), the data stream's position, the
    planner's state, the world size and the config. Only rank 0 knows the data position: it
    alone draws batches;
  - `sha256.json` (rank 0): every other file's SHA-256 (`checksums.py`).

Atomic: everything is written into `.tmp-step-NNNNNNNN`, and once every rank has finished
(a barrier) rank 0 renames it into place. A rename within a folder is atomic, and `latest`
only looks at committed names, so a crash at any moment leaves the previous checkpoint
usable; a stale temporary folder is replaced by the next save. The folder must be one that
every rank sees (a shared file system across nodes).

Which checkpoint is trusted, and whether it holds the run's model: `checkpoint_files.py`.

ZeRO-1: every rank holds the AdamW state of its own share of the parameters only, so each
saves it under a key of its own (`optimizer.rankR`), and resuming needs the same world size.
Without ZeRO-1 the optimizer state is replicated and a checkpoint resumes on any world size.
FSDP2: model and optimizer state are DTensors, which DCP saves shard by shard and reshards on
load; the checkpoint records that it was sharded and resumes only under FSDP again.
TP: each TP index saves its shards under keys of its own (`model.tpJ`, `optimizer.tpJ`), and
resuming needs the same TP degree (meta.json's "tp").
PP: a stage holds its parameters only, under their whole-model names, so the stages' model
states together are the model's; its optimizer state is saved flat (`FLAT_OPTIMIZER`: a key
per parameter), so each stage's AdamW state is kept whole too.
Strategies (`runtime/strategy.py`): the state of record is the canonical layout, each rank's
flat shards and their AdamW moments, saved under a key of the rank's own (`canonical.rankR`);
resuming needs a strategy run on the same world size (its shards are cut for that many ranks).
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.optim import ZeroRedundancyOptimizer

from ..runtime import is_sharded
from ..runtime.executor import Executor
from ..runtime.strategy import StrategyExecutor
from ..runtime.tensor_parallel import TensorParallel
from . import checksums
from .checkpoint_files import META, check_model, committed, folder_name, read_meta

AnyExecutor = Executor | StrategyExecutor

TMP = ".tmp-"
CANONICAL = "canonical"
"""meta.json's mark of a strategy run's checkpoint: the state is the canonical layout's shards."""
FLAT_OPTIMIZER = "flat_optimizer"
"""meta.json's mark of a checkpoint whose optimizer state is flat: every parameter's state and
hyperparameters (`param_groups.<name>.lr`, ...) under keys of its own. A pipeline stage holds
some parameters only, and the one `param_groups` list of an unflattened state (each stage's
naming its own parameters) would be saved once, from one stage, and loaded by all."""


def _local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """ZeRO-1's AdamW over this rank's share of the parameters, or the optimizer itself."""
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def _model_key(tensor_parallel: TensorParallel | None) -> str:
    """The model's key: under TP one per TP index (`model.tpJ`), whose ranks hold the same shards,
    which DCP then saves once; a key shared by all would keep one TP index's shards alone (DCP
    takes tensors of one name on several ranks for replicas)."""
    return "model" if tensor_parallel is None else f"model.tp{tensor_parallel.index}"


def _state(executor: AnyExecutor, flat: bool = True) -> dict:
    """What DCP saves and loads in place (FQN-keyed, so independent of parameter order). `flat`:
    the optimizer's state and hyperparameters under one key per parameter (`FLAT_OPTIMIZER`),
    as checkpoints are saved since pipeline stages; False: one `param_groups` list, as earlier
    checkpoints hold it."""
    if isinstance(executor, StrategyExecutor):
        return {f"canonical.rank{dist.get_rank()}": executor.checkpoint_state()}
    model, optimizer, tensor_parallel = executor.model, executor.optimizer, executor.tensor_parallel
    sharded = isinstance(optimizer, ZeroRedundancyOptimizer)
    key = f"optimizer.rank{dist.get_rank()}" if sharded else _model_key(tensor_parallel).replace("model", "optimizer")
    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    return {_model_key(tensor_parallel): get_model_state_dict(model),
            key: get_optimizer_state_dict(model, _local_optimizer(optimizer), options=options)}


def _layout(executor: AnyExecutor) -> dict:
    """What meta.json records of how the state is laid out, which a resumed run must match."""
    if isinstance(executor, StrategyExecutor):
        return {"zero1": False, "fsdp": False, "tp": 1, CANONICAL: True}
    return {"zero1": isinstance(executor.optimizer, ZeroRedundancyOptimizer), "fsdp": is_sharded(executor.model),
            "tp": 1 if executor.tensor_parallel is None else executor.tensor_parallel.degree, CANONICAL: False}


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def save(root: Path, step: int, executor: AnyExecutor, meta: dict | None, keep: int) -> Path:
    """Checkpoint the executor's state after `step` completed steps (collective: every rank calls
    it; rank 0 passes `meta`). Keeps the newest `keep` checkpoints."""
    rank = dist.get_rank()
    tmp, final = root / f"{TMP}{folder_name(step)}", root / folder_name(step)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crash
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(executor), checkpoint_id=tmp)
    torch.save(_rng_state(), tmp / f"rng-rank{rank}.pt")
    dist.barrier()  # every rank's files are in tmp
    digests = checksums.hash_shares(tmp)
    if rank == 0:
        assert meta is not None and digests is not None
        _write_synced(tmp / META, json.dumps({**meta, "step": step, "world": dist.get_world_size(),
                                              FLAT_OPTIMIZER: True, **_layout(executor)}, indent=1))
        _write_synced(tmp / checksums.MANIFEST, checksums.manifest({**digests, META: checksums.digest(tmp / META)}))
        if final.exists():  # the same step saved by an earlier attempt
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in committed(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path, executor: AnyExecutor) -> dict:
    """Restore the executor's state and this rank's RNG from `path` (collective); returns
    meta.json."""
    meta = read_meta(path)
    _check_layout(path, meta, _layout(executor))
    state = _state(executor, flat=meta.get(FLAT_OPTIMIZER, False))
    if isinstance(executor, StrategyExecutor):
        dcp.load(state, checkpoint_id=path)  # in place: the shards and their AdamW state
    else:
        key = _model_key(executor.tensor_parallel)
        check_model(path, state[key], key)
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(executor.model, state[key])
        optimizer_key = next(k for k in state if k.startswith("optimizer"))
        set_optimizer_state_dict(executor.model, _local_optimizer(executor.optimizer), state[optimizer_key])
    rng = path / f"rng-rank{dist.get_rank()}.pt"
    if rng.is_file():  # a rank the saving job did not have starts from its seed
        _set_rng_state(torch.load(rng, weights_only=False))
    return meta


def _check_layout(path: Path, meta: dict, mine: dict) -> None:
    """ValueError naming the setting to resume `path` with when its state's layout is not `mine`."""
    if meta.get(CANONICAL, False) != mine[CANONICAL]:
        raise ValueError(f"checkpoint {path} was saved {'with' if meta.get(CANONICAL) else 'without'} --strategy "
                         f"(its state {'in' if meta.get(CANONICAL) else 'outside'} the canonical layout); resume it "
                         f"{'with' if meta.get(CANONICAL) else 'without'} --strategy")
    if meta.get("tp", 1) != mine["tp"]:
        raise ValueError(f"checkpoint {path} holds TP degree {meta.get('tp', 1)}'s shards; resume it with --tp "
                         f"{meta.get('tp', 1)}, not {mine['tp']}")
    if meta["zero1"] != mine["zero1"]:
        raise ValueError(f"checkpoint {path} was saved {'with' if meta['zero1'] else 'without'} "
                         f"ZeRO-1; resume with the same --zero1 setting")
    if meta["fsdp"] != mine["fsdp"]:
        raise ValueError(f"checkpoint {path} was saved {'with' if meta['fsdp'] else 'without'} "
                         f"FSDP; resume with the same --fsdp setting")
    sharded = "ZeRO-1 optimizer" if mine["zero1"] else "canonical" if mine[CANONICAL] else None
    if sharded and meta["world"] != dist.get_world_size():
        raise ValueError(f"checkpoint {path} holds {sharded} shards of {meta['world']} ranks; "
                         f"resume it on {meta['world']} ranks, not {dist.get_world_size()}")
