"""ballast's own planner (registered as `ballast`).

    planner.py   BallastPlanner: layouts of waves and group degrees, search, local repair
    estimate.py  GroupEstimates: a group's time as sequences are added or moved (the hot path)
    groups.py    GroupPacker: a group's sequences into micro-batches and recompute levels
    strategy.py  BallastStrategies: its rule on heterogeneous strategies (--strategy)
"""
from .planner import BallastPlanner
from . import strategy  # noqa: F401  (registers its rule on --strategy)

__all__ = ["BallastPlanner"]
