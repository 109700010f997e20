"""`ballast simulate`: plan and price steps of a length source under several planners.

    command.py       the CLI: flags -> batches -> every planner -> table, JSON, Gantt chart
    side_by_side.py  the same batches planned and priced (`ballast.plans.timeline`) by each planner
    table.py         the printed table, one row per planner
"""
from .side_by_side import PlannerResult, simulate_planners

__all__ = ["PlannerResult", "simulate_planners"]
