"""What a run's records say about its plans: each step's layout, and the summary's count of them."""
from __future__ import annotations

from ballast.plans.plan import Group, MicroBatch, Plan, Wave
from ballast.train.metrics import UNRECORDED, layout_of, summarise


def test_layout_names_every_wave_its_busy_groups_and_recomputation():
    full_chunks = Wave([Group(1, 1, [MicroBatch([1], 0.75)]), Group(0, 1, [MicroBatch([0], 0.75)])])
    rest = Wave([Group(0, 2, [MicroBatch([2], 0.5), MicroBatch([3], 0.0)], cp=2)])
    plan = Plan([2048, 2048, 2048, 300], [full_chunks, rest])
    assert layout_of(plan) == "1x1+1x1 recompute 75% then 1x2 recompute 50%"
    one_busy = Plan([2048], [Wave([Group(0, 2, [MicroBatch([0])])], routed=True)])
    assert layout_of(one_busy) == "2x1 recompute 0% routed"
    idle_rank = Plan([100], [Wave([Group(0, 1, [MicroBatch([0])]), Group(1, 1, [])], remap=[(0, 2)])])
    assert layout_of(idle_rank) == "1x1 recompute 0% remapped"


def record(step: int, layout: str | None) -> dict:
    r = {"step": step, "tokens": 10, "step_time": 1.0, "predicted_step_time": 1.0, "idle_fraction": 0.0,
         "loss": 1.0, "plan_ms": 1.0, "plan_wait_ms": 0.0, "attempt": 0}
    return r if layout is None else {**r, "layout": layout}


def test_summary_counts_the_steps_of_each_layout_most_first():
    history = [record(0, None), record(1, "1x2 recompute 50%"), record(2, "1x1+1x1 recompute 75%"),
               record(3, "1x1+1x1 recompute 75%")]
    layouts = summarise(history)["layouts"]
    assert layouts == {"1x1+1x1 recompute 75%": 2, "1x2 recompute 50%": 1, UNRECORDED: 1}
    assert next(iter(layouts)) == "1x1+1x1 recompute 75%"
