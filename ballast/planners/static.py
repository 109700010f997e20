"""`static`: what DeepSpeed-Ulysses and Megatron-CP users run.

One SP degree for the whole run, the smallest power of two that holds `max_len` (or the
user's `--degree`), and one recompute setting for the run, the least that fits `max_len` at
that degree. Each step deals the sequences to the equal groups balancing tokens (what a
packing data loader does for its data-parallel replicas), and each group packs its share
best-fit-decreasing into micro-batches of that capacity; under ZeRO-3 the groups run in
lockstep.

With `--cp` (`PlannerOptions.cp`) it is static USP (xDiT, USP's 2D mesh): every group runs
Ulysses over degree / cp ranks times context parallelism over cp, the degree `--degree` or the
smallest from cp up that holds `max_len`.
"""
from __future__ import annotations

from ..vocabulary.layouts import ULYSSES_ONLY, Splits, fixed_context
from ..plans.plan import Plan
from ..vocabulary.samples import SampleBatch
from .base import Planner
from .packing import best_fit_decreasing, fixed_run, lockstep_wave, longest_processing_time, micro_batch
from .registry import register


def fixed_layout_plan(batch: SampleBatch, degree: int, recompute: float, planner: Planner) -> Plan:
    """Token-balanced groups of one degree, each packing best-fit-decreasing, in one lockstep wave."""
    cost, world, lengths = planner.cost, planner.cluster.world_size, batch.lengths
    capacity = cost.max_tokens(degree, recompute)
    shares = longest_processing_time(lengths, world // degree)
    per_group = [[micro_batch(b, lengths, degree, cost, recompute)
                  for b in best_fit_decreasing(share, lengths, capacity)] for share in shares]
    wave = lockstep_wave(per_group, batch, degree, cost, world)
    return Plan(lengths, [wave], lockstep=True, shapes=batch.shapes, info={"degree": degree, "recompute": recompute})


@register
class StaticPlanner(Planner):
    name = "static"

    def splits(self) -> Splits:
        """Ulysses alone (DeepSpeed-Ulysses), or static USP with a fixed CP part (`--cp`)."""
        return ULYSSES_ONLY if self.options.cp is None else fixed_context(self.options.cp)

    def _check_degree(self, degree: int | None) -> None:
        if self.options.cp is not None:
            self._check_cp(self.options.cp, degree)
        super()._check_degree(degree)

    def _check_cp(self, cp: int, degree: int | None) -> None:
        """The CP part must be one this model and cluster can run, and leave a Ulysses part of a
        forced degree that the heads allow (`fixed_context` checked it is a power of two)."""
        if cp > self.cluster.world_size:
            raise ValueError(f"--cp {cp} is more ranks than the cluster's {self.cluster.world_size}")
        if degree is None:
            return
        if degree % cp:
            raise ValueError(f"--cp {cp} does not divide --degree {degree}: static USP runs Ulysses over "
                             f"--degree / --cp ranks times context parallelism over --cp")
        self.cost.pattern.layout.check(degree // cp, self.cost.heads,
                                       f"--degree {degree} with --cp {cp} leaves Ulysses over {degree // cp} ranks")

    def _plan(self, batch: SampleBatch) -> Plan:
        _, degree, recompute = fixed_run(self.cost, batch.lengths, self.options.max_len, self.options.degree,
                                          at_least=self.options.cp or 1)
        return fixed_layout_plan(batch, degree, recompute, self)
