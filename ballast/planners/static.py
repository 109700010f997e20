"""`static`: what DeepSpeed-Ulysses and Megatron-CP users run.

One SP degree for the whole run, the smallest power of two that holds `max_len` (or the
user's `--degree`), and one checkpoint setting for the run, the least that fits `max_len` at
that degree. Each step deals the sequences to the equal groups balancing tokens (what a
packing data loader does for its data-parallel replicas), and each group packs its share
best-fit-decreasing into micro-batches of that capacity; under ZeRO-3 the groups run in
lockstep.
"""
from __future__ import annotations

from ..plan import Plan
from . import register
from .base import Planner
from .packing import best_fit_decreasing, fixed_checkpoint, lockstep_wave, longest_processing_time, micro_batch


def fixed_layout_plan(lengths: list[int], degree: int, checkpoint: float, planner: Planner) -> Plan:
    """Token-balanced groups of one degree, each packing best-fit-decreasing, in one lockstep wave."""
    cost, world = planner.cost, planner.cluster.world_size
    capacity = cost.max_tokens(degree, checkpoint)
    shares = longest_processing_time(lengths, world // degree)
    per_group = [[micro_batch(b, lengths, degree, cost, checkpoint)
                  for b in best_fit_decreasing(share, lengths, capacity)] for share in shares]
    wave = lockstep_wave(per_group, lengths, degree, cost, world)
    return Plan(lengths, [wave], lockstep=True, info={"degree": degree, "checkpoint": checkpoint})


@register
class StaticPlanner(Planner):
    name = "static"

    def _plan(self, lengths: list[int]) -> Plan:
        max_len = self.options.max_len or max(lengths)
        if max(lengths) > max_len:
            raise ValueError(f"sequence {lengths.index(max(lengths))} has {max(lengths)} tokens, "
                             f"more than max_len {max_len}")
        degree = self.options.degree or self.cost.min_degree(max_len)
        if degree is None:
            raise ValueError(f"max_len {max_len} fits no SP degree up to {self.cost.degrees[-1]}")
        if degree not in self.cost.degrees:
            raise ValueError(f"SP degree {degree} is not usable: degrees are {self.cost.degrees} "
                             f"(powers of two up to the world size dividing the heads)")
        return fixed_layout_plan(lengths, degree, fixed_checkpoint(self.cost, max_len, degree), self)
