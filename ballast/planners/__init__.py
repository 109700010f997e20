"""Planners by name (`registry.py`); importing this package registers every planner.

`ballast.plan(lengths, cluster, cost, planner="ballast")` is the one-call entry point.
"""
from __future__ import annotations

from .base import SHORT_SOLVES, Planner, PlannerOptions
from .registry import PLANNERS, get_planner, make_plan, parse_planner_names, register

# Registration order is the order of `--planners all` and of reports: baselines first.
from . import static, batch_adaptive, bucket, megatron  # noqa: E402,F401
from . import ballast  # noqa: E402,F401
from . import dcp  # noqa: E402,F401
from . import hydraulis  # noqa: E402,F401
from . import zeppelin  # noqa: E402,F401
from . import flexsp  # noqa: E402,F401
from . import wlb_llm  # noqa: E402,F401
from . import hydraulis_strategies  # noqa: E402,F401  (hydraulis' own rule on --strategy)

__all__ = ["PLANNERS", "SHORT_SOLVES", "Planner", "PlannerOptions", "get_planner", "make_plan", "parse_planner_names", "register"]
