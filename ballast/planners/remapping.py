"""Remap domains as planners build them: the checkpoint level each slot needs.

The runtime runs a slot of a remap domain (`Wave.remap`) at its micro-batches' lowest level, and
a rank there holds its group's attention layout beside the domain's balanced one
(`Plan.remap_overflow`). A planner that remaps groups gives every slot the least level at which
its busiest rank fits: a long sequence may then recompute less than in its group alone, and
the sequences beside it recompute as much as it must.
"""
from __future__ import annotations

import dataclasses

from ..cost import CostModel
from ..plans import Group, Plan


def leveled(plan: Plan, wave: int, domain: tuple[int, int], cost: CostModel) -> list[Group] | None:
    """Copies of the domain's groups with every slot's micro-batches at the least checkpoint
    level that slot fits at; None if some slot fits at none."""
    levels = [cost.remap_checkpoint(attention, balanced)
              for attention, balanced, _ in plan.slot_loads(wave, *domain)]
    if any(level is None for level in levels):
        return None
    return [dataclasses.replace(g, micro_batches=[dataclasses.replace(mb, checkpoint=level if mb.seq_ids else 0.0)
                                                  for mb, level in zip(g.micro_batches, levels)])
            for g in plan.waves[wave].domain_groups(*domain)]
