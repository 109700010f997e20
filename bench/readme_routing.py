"""The README's routing tables (bench/routing.sh): every planner with routing on, zeppelin and
ballast also with it off, and what routing gained each."""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROUTING = {
    "R1": "wikipedia lengths, a800-64 (8 GPUs and 4 NICs of 200 Gb/s per node), gpt-7b (analytic), max-len 393216, "
          "512 sequences/step",
    "R2": "wikipedia lengths, h200-64 (8 NICs of 400 Gb/s per node), gpt-7b (analytic), max-len 393216, "
          "512 sequences/step",
    "R3": "many short sequences (lognormal:6,1), a800-64, gpt-7b (analytic), 1M tokens/step",
    "R4": "many short sequences (lognormal:6,1), h200-64, gpt-7b (analytic), 1M tokens/step",
}


def routing_table(name: str) -> str:
    routed = json.loads((RESULTS / f"simulate-{name}.json").read_text())
    unrouted = json.loads((RESULTS / f"simulate-{name}-unrouted.json").read_text())["planners"]
    planners = routed["planners"]
    base = planners.get("static", {}).get("step_time_s")
    rows = ["| planner | step (s) | vs static | time / LB | busiest NIC (GB/step) | busiest / mean NIC | "
            "routed waves | step unrouted (s) | routing gain |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for planner, s in sorted(planners.items(), key=lambda kv: kv[1]["step_time_s"]):
        speed = f"{base / s['step_time_s']:.2f}x" if base else "-"
        off = unrouted.get(planner)
        without, gain = ((f"{off['step_time_s']:.3f}", f"{off['step_time_s'] / s['step_time_s'] - 1:+.2%}")
                         if off else ("-", "-"))
        rows.append(f"| {planner} | {s['step_time_s']:.3f} | {speed} | {s['vs_lower_bound']:.3f} | "
                    f"{s.get('busiest_nic_gb', 0.0):.2f} | {s.get('nic_imbalance', 1.0):.2f} | "
                    f"{s.get('routed_waves', 0.0):.0%} | {without} | {gain} |")
    rivals = {p: s["step_time_s"] for p, s in planners.items() if p != "ballast"}
    ahead = all(planners["ballast"]["step_time_s"] <= t for t in rivals.values()) if "ballast" in planners else False
    head = (f"**Setting {name}** ({ROUTING[name]}; {routed['steps']} steps, mean lower bound "
            f"{routed['lower_bound_s']:.3f} s/step; simulated):\n\n")
    tail = f"\n\nballast ahead of every rival: {'yes' if ahead else 'no'}."
    return head + "\n".join(rows) + tail
