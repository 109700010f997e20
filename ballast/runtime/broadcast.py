"""Rank 0's plan for a step (a `Plan`, or a `StrategyPlan`), on every rank: the one plan broadcast of
the runtime.

Which plan: rank 0 plans and broadcasts. Letting every rank plan for itself would need
bit-for-bit deterministic planners, which ballast does not demand: FlexSP's MILP stops at a
wall-clock time limit, Hydraulis shuffles at random, and a float tie may break differently.
Ranks holding different plans would not fail: they would wait in mismatched collectives until
the timeout. A plan is a few KB, so one small broadcast per step is cheap, and only rank 0
spends CPU on planning (it can plan one step ahead while the others train).

The batch's samples (token ids, clips) may ride along (the trainer's ranks hold no data; verify's and bench's
ranks hold the batches already and send only the plan). Their structure and the shapes and
dtypes of their tensors go with the plan, pickled (a few KB); the tensors' contents go after it
as tensors, one flat byte buffer in one `broadcast` on the backend's device (NCCL: the GPU):
a step's video latents are megabytes, which pickling would copy through Python bytes objects on
every rank. The receivers get them back on the CPU, as rank 0 holds them.

A rank 0 that could not plan (its planner raised, its data ran dry) broadcasts its error
instead: it raises it, and every other rank raises `PeerFailed`, so the job stops at once with
rank 0's message instead of leaving the others in a broadcast whose sender is gone.
"""
from __future__ import annotations

import io
import math
import pickle
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ..plans.plan import Plan
from ..plans.strategy_plan import StrategyPlan
from .world import PeerFailed


AnyPlan = Plan | StrategyPlan


def broadcast_plan(plan: AnyPlan | BaseException | None, samples: Sequence[Any] | None = None, src: int = 0
                   ) -> tuple[AnyPlan, list[Any] | None]:
    """Rank `src` passes its plan (and, if the ranks lack them, the samples) or the error that
    kept it from planning; the others pass None. Every rank gets (the plan, the samples or None)
    in one broadcast of the plan and one of the samples' tensors, or raises the error
    (`PeerFailed` on the other ranks)."""
    mine = dist.get_rank() == src
    if mine and plan is None:
        raise ValueError(f"rank {src} must pass the plan to broadcast")
    tensors: list[Tensor] = []
    if not mine:
        payload = [None]
    elif isinstance(plan, BaseException):
        payload = [("error", PeerFailed.describe(src, plan))]
    else:
        structure = None if samples is None else without_tensors(list(samples), tensors)
        specs = [(tuple(t.shape), t.dtype) for t in tensors]
        payload = [("plan", ((type(plan).__name__, plan.to_dict()), structure, specs))]
    dist.broadcast_object_list(payload, src=src)
    kind, content = payload[0]
    if kind == "error":
        PeerFailed.raise_for(content, plan if mine else None)
    (kind, plan_data), structure, specs = content
    plan = (StrategyPlan if kind == StrategyPlan.__name__ else Plan).from_dict(plan_data)
    if structure is None:
        return plan, None
    if mine:
        _broadcast_tensors(tensors, specs, src)
        return plan, list(samples)
    return plan, with_tensors(structure, _broadcast_tensors(None, specs, src))


class _TensorsApart(pickle.Pickler):
    """Pickles everything but tensors, which it collects in order and names by their index."""

    def __init__(self, file: io.BytesIO, tensors: list[Tensor]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj: Any) -> int | None:
        if isinstance(obj, Tensor):
            self.tensors.append(obj)
            return len(self.tensors) - 1
        return None


class _TensorsBack(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[Tensor]):
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, index: int) -> Tensor:
        return self.tensors[index]


def without_tensors(value: Any, tensors: list[Tensor]) -> bytes:
    """`value` pickled with its tensors left out, appended to `tensors` in the order
    `with_tensors` puts them back."""
    out = io.BytesIO()
    _TensorsApart(out, tensors).dump(value)
    return out.getvalue()


def with_tensors(structure: bytes, tensors: list[Tensor]) -> Any:
    """The value `without_tensors` pickled, its tensors taken from `tensors`."""
    return _TensorsBack(io.BytesIO(structure), tensors).load()


def _broadcast_tensors(tensors: list[Tensor] | None, specs: list[tuple[tuple[int, ...], torch.dtype]],
                       src: int) -> list[Tensor]:
    """The tensors of `specs` (shape, dtype) from rank `src` (which passes them) in one flat
    byte buffer on the backend's device; the receivers' back on the CPU."""
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in specs]
    if not sizes:
        return []
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    if tensors is not None:
        flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8).cpu() for t in tensors]).to(device)
    else:
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    dist.broadcast(flat, src=src)
    if tensors is not None:
        return tensors
    # A copy per tensor: a view of a dtype wider than a byte needs an aligned offset.
    return [chunk.cpu().clone().view(dtype).reshape(shape) for chunk, (shape, dtype) in zip(flat.split(sizes), specs)]
