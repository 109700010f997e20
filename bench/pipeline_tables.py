"""The pipeline settings' tables (`bench/pipelines.sh`: P1-P4, every planner on the same job mesh of
TP, PP and a pool), with the issue's simulated targets for them."""
from __future__ import annotations

from record_files import commit_note, record
from simulated_tables import PIPELINES, carry_note, planner_rows, verdicts

RIVALS = ("megatron-dynamic-cp", "wlb-llm")
"""The planners the issue's targets say ballast must be ahead of at the same TP and PP."""
PLAN_MS = 300.0
"""The issue's planning time target for a step at 1,024 GPUs."""


def pipeline_table(name: str) -> str:
    """A pipeline setting: one row per planner (its pipeline's bubble beside its idle time) and
    the issue's targets where it sets them: ahead of the rivals everywhere, within 1.05x of the
    bound on the 70B settings, and at 1,024 GPUs every step planned within `PLAN_MS`."""
    data = record(f"simulate-{name}")
    planners, ours = data["planners"], data["planners"]["ballast"]
    rows = planner_rows(planners, pipeline=True)
    checks = []
    if data["setting"]["model"] == "llama3-70b":
        checks.append((f"<= 1.05x the lower bound: {ours['vs_lower_bound']:.3f}", ours["vs_lower_bound"] <= 1.05))
    for rival in RIVALS:
        if rival in planners:
            ahead = planners[rival]["step_time_s"] / ours["step_time_s"]
            checks.append((f"ahead of {rival}: {ahead:.2f}x", ahead > 1.0))
    if data["setting"]["world_size"] == 1024:
        checks.append((f"every step planned in under {PLAN_MS:.0f} ms: worst {ours['plan_ms_max']:,.0f} ms",
                       ours["plan_ms_max"] < PLAN_MS))
    head = (f"**Setting {name}** ({PIPELINES[name]}; {data['steps']} steps, mean lower bound "
            f"{data['lower_bound_s']:.3f} s/step; simulated{commit_note(data)}):\n\n")
    return head + "\n".join(rows) + carry_note(data) + "\n\nTargets (simulated): " + verdicts(checks) + "."
