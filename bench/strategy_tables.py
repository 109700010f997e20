"""The heterogeneous-strategy settings' tables (`bench/hydraulis_settings.py`: H1-H4, Hydraulis' kind
of setting), with issue #54's simulated targets for them."""
from __future__ import annotations

import itertools

from record_files import commit_note, record
from simulated_tables import verdicts

STRATEGY_SETTINGS = ("H1", "H2", "H3", "H4")


def strategy_table(name: str) -> str:
    """A setting's strategies, every planner on them under both movements, the best homogeneous
    baselines and the targets: hydraulis ahead of the best homogeneous layout, ballast of hydraulis."""
    data = record("hydraulis")
    if name not in data:
        return f"*Not recorded: setting {name} is not in bench/results/hydraulis.json.*"
    r, setting = data[name], data[name]["setting"]
    rows = ["| planner | step, sliced movement (s) | of it movement (s) | step, full movement (s) | of it movement (s) |",
            "|---|---|---|---|---|"]
    full, sliced = r["heterogeneous"]["full"], r["heterogeneous"]["sliced"]

    def moved(s: dict) -> float:
        return s["gather_s"] + s["reduction_s"] + s["optimizer_s"]

    for planner in sorted(sliced, key=lambda p: sliced[p]["step_time_s"]):
        rows.append(f"| {planner} on the proposed strategies | {sliced[planner]['step_time_s']:.3f} | "
                    f"{moved(sliced[planner]):.3f} | {full[planner]['step_time_s']:.3f} | {moved(full[planner]):.3f} |")
    fixed = r["best_fixed_strategy"]
    rows.append(f"| hydraulis on the best homogeneous strategy, {fixed['layout']} replicas | {fixed['step_s']:.3f} "
                f"| | | |")
    for planner, best in sorted(r["best_mesh"].items(), key=lambda kv: kv[1]["step_s"]):
        rows.append(f"| {planner} on the best job mesh, {best['mesh']} x a pool, ZeRO-1 | {best['step_s']:.3f} | | | |")
    checks = [(f"hydraulis ahead of the best homogeneous strategy: {r['hydraulis_vs_best_fixed_strategy']:.2f}x",
               r["hydraulis_vs_best_fixed_strategy"] > 1.0),
              (f"ballast ahead of hydraulis: {r['ballast_vs_hydraulis']:.2f}x", r["ballast_vs_hydraulis"] > 1.0)]
    strategies = "; ".join(map(runs, r["strategies"]))
    head = (f"**Setting {name}** ({setting['model']} on {setting['cluster']}, {setting['lengths']} lengths up to "
            f"{setting['max_len']:,} tokens, {setting['tokens_per_step']:,} tokens a step, {setting['steps']} steps; "
            f"simulated{commit_note(r if 'provenance' in r else data)}). Proposed strategies: {strategies}.\n\n")
    return head + "\n".join(rows) + "\n\nTargets (simulated): " + verdicts(checks) + "."


def runs(strategy: list) -> str:
    """A strategy's pipelines with runs of one (t, p) written once, counted: [(8,2)x23,(2,4)]."""
    return "[" + ",".join(f"({t},{p})" + (f"x{n}" if n > 1 else "")
                          for (t, p), n in ((key, len(list(run))) for key, run in
                                            itertools.groupby(tuple(q[:2]) for q in strategy))) + "]"
