"""SplitCatalogue: which SP degrees a model may run on a cluster, and which (u, c) splits of each.

A group of degree d runs attention as the model's head layout over u ranks times context
parallelism over c ranks, d = u c (`layouts.Splits`). Which splits exist depends on the world
(degrees are powers of two up to it), the heads (the head layout's degree rule), the planner's
rule (`Splits`), the exchanges priced (a degree with a Ulysses part needs an all-to-all bandwidth
for it) and, for a profiled model, the degrees whose CP terms the profile measured. This value
holds that answer, validated once; the cost model holds the catalogue of its planner's rule, and
whoever asks which layouts exist asks it (planners, the lower bound, the exhaustive search).
"""
from __future__ import annotations

from dataclasses import dataclass

from .layouts import ULYSSES_ONLY, Layout, Splits, powers_of_two


@dataclass(frozen=True)
class SplitCatalogue:
    world_size: int
    """Ranks of the job: SP degrees are the powers of two up to it."""
    heads: int
    """Query heads of the model: the head layout's degree rule (`Layout.allows`)."""
    layout: Layout
    """The model's head layout (`patterns.AttentionPattern.layout`), the u part of a split."""
    exchange_degrees: frozenset[int]
    """Degrees whose exchanges have a bandwidth (analytic: the cluster's; profiled: those
    measured). A split's Ulysses part u > 1 needs u here, a CP part its whole degree."""
    measured_context: frozenset[int] | None = None
    """Degrees at which a profile measured CP's terms (its latency there); None: every degree's CP
    terms are priced (analytic and published coefficients)."""
    rule: Splits = ULYSSES_ONLY
    """Which splits a planner may run (`Splits`): the catalogue of that planner's cost model."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"split catalogue: world size {self.world_size} must be at least 1")
        if self.heads < 1:
            raise ValueError(f"split catalogue: heads {self.heads} must be at least 1")
        for d in self.exchange_degrees:
            if d < 1 or d & (d - 1):
                raise ValueError(f"split catalogue: exchange degree {d} is not a power of two")
        parts = {d: allowed for d in powers_of_two(self.world_size) if (allowed := self._allowed(d))}
        object.__setattr__(self, "_parts", parts)

    def _allowed(self, degree: int) -> list[int]:
        """The c of every split of `degree` the catalogue offers, ascending."""
        parts = [c for c in self.rule.context_parts(degree, self.heads, self.layout)
                 if degree == 1 or degree in self.exchange_degrees
                 and (c == degree or degree // c in self.exchange_degrees)]
        if parts and parts[0] == 1 and self.measured_context is not None and degree not in self.measured_context:
            # A profile that ran no point with a CP part at d measured none of CP's terms there
            # (its latency, attention factor, gather): their analytic stand-ins would price CP
            # below the Ulysses split it measured, and a planner that weighs splits would choose
            # CP for it (ballast's video steps: 15-20% under-predicted). Offered only where
            # nothing measured can run.
            return [1]
        return parts

    @property
    def degrees(self) -> list[int]:
        """SP degrees with at least one split, ascending."""
        return list(self._parts)

    def context_parts(self, degree: int) -> list[int]:
        """Every c the catalogue offers at `degree`, ascending (empty where none)."""
        return self._parts.get(degree, [])

    def split(self, degree: int) -> int:
        """c of the split planners price a group of `degree` at: the least one offered (heads
        first: Ulysses holds no gathered K and V, and its exchange stays inside the smaller
        block). A planner that weighs the splits (ballast) gives a group another offered split
        where that runs its micro-batches faster (`Plan` records each group's)."""
        return self._parts[degree][0]

    def default_cp(self, degree: int) -> int:
        """`split`, and 1 at a degree with no split: a degree the catalogue does not offer prices
        as the head layout alone (memory questions about it still have answers)."""
        return self._parts[degree][0] if degree in self._parts else 1

    def under(self, rule: Splits) -> SplitCatalogue:
        """This catalogue for a planner that runs the splits `rule` allows."""
        return SplitCatalogue(self.world_size, self.heads, self.layout, self.exchange_degrees,
                              self.measured_context, rule)
