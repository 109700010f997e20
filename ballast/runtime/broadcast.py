"""Rank 0's plan for a step, on every rank: the one plan broadcast of the runtime.

Which plan: rank 0 plans and broadcasts. Letting every rank plan for itself would need
bit-for-bit deterministic planners, which ballast does not demand: FlexSP's MILP stops at a
wall-clock time limit, Hydraulis shuffles at random, and a float tie may break differently.
Ranks holding different plans would not fail: they would wait in mismatched collectives until
the timeout. A plan is a few KB, so one small broadcast per step is cheap, and only rank 0
spends CPU on planning (it can plan one step ahead while the others train).

The batch's samples (token ids, clips) may ride along (the trainer's ranks hold no data; verify's and bench's
ranks hold the batches already and send only the plan). A rank 0 that could not plan (its
planner raised, its data ran dry) broadcasts its error instead: it raises it, and every other
rank raises `PeerFailed`, so the job stops at once with rank 0's message instead of leaving
the others in a broadcast whose sender is gone.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch.distributed as dist

from ..plans.plan import Plan
from .world import PeerFailed


def broadcast_plan(plan: Plan | BaseException | None, samples: Sequence[Any] | None = None, src: int = 0
                   ) -> tuple[Plan, list[Any] | None]:
    """Rank `src` passes its plan (and, if the ranks lack them, the samples) or the error that
    kept it from planning; the others pass None. Every rank gets (the plan, the samples or None)
    in one broadcast, or raises the error (`PeerFailed` on the other ranks)."""
    mine = dist.get_rank() == src
    if mine and plan is None:
        raise ValueError(f"rank {src} must pass the plan to broadcast")
    if not mine:
        payload = [None]
    elif isinstance(plan, BaseException):
        payload = [("error", PeerFailed.describe(src, plan))]
    else:
        payload = [("plan", (plan.to_dict(), None if samples is None else list(samples)))]
    dist.broadcast_object_list(payload, src=src)
    kind, content = payload[0]
    if kind == "error":
        PeerFailed.raise_for(content, plan if mine else None)
    plan_data, received_samples = content
    return Plan.from_dict(plan_data), received_samples
