"""Planners by name: each planner module registers its `Planner` subclass here, and
`planners/__init__.py` imports every planner module, so looking a name up finds them all."""
from __future__ import annotations

from typing import Sequence

from ..vocabulary.cluster import Cluster
from ..pricing.cost import CostModel
from ..plans.plan import Plan
from ..vocabulary.samples import Sample
from .base import Planner, PlannerOptions

PLANNERS: dict[str, type[Planner]] = {}


def register(cls: type[Planner]) -> type[Planner]:
    assert cls.name not in PLANNERS, f"planner {cls.name} registered twice"
    PLANNERS[cls.name] = cls
    return cls


def get_planner(name: str, cluster: Cluster, cost: CostModel, options: PlannerOptions | None = None) -> Planner:
    if name not in PLANNERS:
        raise ValueError(f"unknown planner {name!r}; planners: {', '.join(PLANNERS)}")
    return PLANNERS[name](cluster, cost, options)


def parse_planner_names(spec: str) -> list[str]:
    """`all` or a comma-separated list of registered names."""
    names = list(PLANNERS) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLANNERS]
    if unknown or not names:
        raise ValueError(f"unknown planner(s) {unknown or spec!r}; planners: {', '.join(PLANNERS)}")
    return names


def make_plan(samples: Sequence[Sample], cluster: Cluster, cost: CostModel, planner: str = "ballast",
              options: PlannerOptions | None = None) -> Plan:
    """The plan of one step for these samples: sequence lengths (text) and/or (frames, height,
    width) clips in latent patches."""
    return get_planner(planner, cluster, cost, options).plan(samples)
