"""Rank 0's plan for a step, on every rank: the one plan broadcast of the runtime.

Which plan: rank 0 plans and broadcasts. Letting every rank plan for itself would need
bit-for-bit deterministic planners, which ballast does not demand: FlexSP's MILP stops at a
wall-clock time limit, Hydraulis shuffles at random, and a float tie may break differently.
Ranks holding different plans would not fail: they would wait in mismatched collectives until
the timeout. A plan is a few KB, so one small broadcast per step is cheap, and only rank 0
spends CPU on planning (it can plan one step ahead while the others train).

The batch's tokens may ride along (the trainer's ranks hold no data; verify's and bench's
ranks hold the batches already and send only the plan).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ..plans import Plan


def broadcast_plan(plan: Plan | None, samples: Sequence[Tensor] | None = None, src: int = 0
                   ) -> tuple[Plan, list[Tensor] | None]:
    """Rank `src` passes its plan (and, if the ranks lack them, the samples), the others None;
    every rank gets (the plan, the samples or None), in one broadcast."""
    mine = dist.get_rank() == src
    if mine and plan is None:
        raise ValueError(f"rank {src} must pass the plan to broadcast")
    payload = [None if not mine else (plan.to_dict(), None if samples is None else torch.cat(list(samples)))]
    dist.broadcast_object_list(payload, src=src)
    plan_data, tokens = payload[0]
    received = Plan.from_dict(plan_data)
    if tokens is None:
        return received, None
    return received, list(torch.split(tokens, [s + 1 for s in received.lengths]))
