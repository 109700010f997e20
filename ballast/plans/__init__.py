"""Plans: the contract every planner produces and the runtime executes (plan.py), its timeline
(the step time planners optimise and simulate reports), its Gantt chart, and the exact optimum
of tiny instances by exhaustive search."""
