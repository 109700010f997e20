"""The simulated results' tables (`ballast simulate` records): settings A-C, the video settings
V1-V3 with their shape-blind twins, the context-parallel settings CP1-CP3, the routing settings
R1-R4, the pipeline settings' descriptions (P1-P4, tabled by `pipeline_tables.py`), the random sweep, the
exhaustive optimum's gap, planning latency, and the headline table of ballast against the lower
bound and its best rival on every setting."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from record_files import commit_note, record, recorded

SETTINGS = {
    "A": "wikipedia lengths, a100-64, gpt-7b (published FlexSP profile), max-len 393216, 512 sequences/step",
    "B": "stdlib lengths, h100-32, llama3-8b (analytic), max-len 131072, 1M tokens/step",
    "C": "lognormal:7,1.6 lengths, h200-32, gpt-13b (analytic), max-len 262144, 256 sequences/step",
}
VIDEO = {
    "V1": "DCP's any-size video (`video`), h200-32, stdit3-1b (spatial-temporal), 256 clips/step",
    "V2": "DCP's any-size video (`video`), h100-32, wan-1.3b (full attention), 256 clips/step",
    "V3": "a Panda-70M-like clip list (`videos:bench/data/panda70m-like.txt`), h200-64, wan-14b (full "
          "attention), 256 clips/step",
}
CONTEXT_PARALLEL = {
    "CP1": "lognormal:8,1.6 lengths, h100-32, Qwen2.5-7B's shape (28 heads, 4 kv heads; bench/data/qwen2.5-7b.json, "
           "analytic), max-len 262144, 256 sequences/step",
    "CP2": "DCP's any-size video (`video`), h200-32, wan-14b (40 heads, full attention), max-len 393216, 256 clips/step",
    "CP3": "lognormal:8,2 lengths, h200-64, Qwen2.5-7B's shape, max-len 1048576 (1M tokens), 256 sequences/step",
}
ROUTING = {
    "R1": "wikipedia lengths, a800-64 (8 GPUs and 4 NICs of 200 Gb/s per node), gpt-7b (analytic), max-len 393216, "
          "512 sequences/step",
    "R2": "wikipedia lengths, h200-64 (8 NICs of 400 Gb/s per node), gpt-7b (analytic), max-len 393216, "
          "512 sequences/step",
    "R3": "many short sequences (lognormal:6,1), a800-64, gpt-7b (analytic), 1M tokens/step",
    "R4": "many short sequences (lognormal:6,1), h200-64, gpt-7b (analytic), 1M tokens/step",
}
CP_RIVALS = ("megatron-dynamic-cp", "static-usp", "wlb-llm")
"""The planners the context-parallelism issue's targets say ballast must be ahead of (where recorded)."""


def carry_note(data: dict) -> str:
    """What of a record was carried over from an older one (bench/carry_over.py) instead of re-run, or ''."""
    rows = [name for name, p in data["planners"].items() if "carried_over" in p]
    kept = ([f"the row{'s' if len(rows) > 1 else ''} of {', '.join(rows)}"] if rows else []) + (
        ["every planner's planning time"] if "plan_ms_carried_over" in data else [])
    return f"\n\nCarried over from an older record, not re-run with the rest: {' and '.join(kept)}." if kept else ""


def verdicts(checks: list[tuple[str, bool]]) -> str:
    return "; ".join(f"{text} ({'met' if ok else 'NOT met'})" for text, ok in checks)


def planner_rows(planners: dict[str, dict], pipeline: bool = False) -> list[str]:
    """A setting's table, one row per planner, fastest first: the whole step and, of it, the
    gradient sync left after the waves and the optimizer step (where recorded), its speed over
    static's; a pipeline setting's rows add each planner's bubble and its worst planning time."""
    base = planners.get("static", {}).get("tokens_per_s")
    whole = all("sync_time_s" in s for s in planners.values())
    header = ["planner", "step (s)", *(["sync + optimizer (s)"] if whole else []), "tokens/s", "vs static",
              *(["bubble"] if pipeline else []), "idle", "time / LB",
              "plan ms (mean, max)" if pipeline else "plan ms (mean)"]
    rows = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for planner, s in sorted(planners.items(), key=lambda kv: -kv[1]["tokens_per_s"]):
        cells = [planner, f"{s['step_time_s']:.3f}",
                 *([f"{s['sync_time_s']:.3f} + {s['optimizer_time_s']:.3f}"] if whole else []),
                 f"{s['tokens_per_s']:,.0f}", f"{s['tokens_per_s'] / base:.2f}x" if base else "-"]
        if pipeline:
            cells.append(f"{s.get('bubble_fraction', 0.0):.1%}")
        cells += [f"{s['idle_fraction']:.1%}", f"{s['vs_lower_bound']:.3f}",
                  f"{s['plan_ms']:,.0f}, {s['plan_ms_max']:,.0f}" if pipeline else f"{s['plan_ms']:.1f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def simulated_table(name: str, settings: dict[str, str] = SETTINGS) -> str:
    data = record(f"simulate-{name}")
    head = (f"**Setting {name}** ({settings[name]}; {data['steps']} steps, mean lower bound "
            f"{data['lower_bound_s']:.3f} s/step{commit_note(data)}):\n\n")
    return head + "\n".join(planner_rows(data["planners"])) + carry_note(data) + left_out_note(data)


def left_out_note(data: dict) -> str:
    """The planners a record left out, grouped by the reason it gives, or ''."""
    reasons: dict[str, list[str]] = {}
    for planner, why in data.get("left_out", {}).items():
        reasons.setdefault(why, []).append(planner)
    return "".join(f"\n\nLeft out: {', '.join(names)}: {why}." for why, names in reasons.items())


def context_parallel_table(name: str) -> str:
    """A CP setting's table (static-usp: static at its fastest fixed degree and CP part) and the
    issue's targets for it."""
    data = record(f"simulate-{name}")
    planners, ours = data["planners"], data["planners"]["ballast"]
    checks = [(f"<= 1.05x the lower bound: {ours['vs_lower_bound']:.3f}", ours["vs_lower_bound"] <= 1.05)]
    if recorded(f"simulate-{name}-32-heads"):
        twin_step = record(f"simulate-{name}-32-heads")["planners"]["ballast"]["step_time_s"]
        ratio = ours["step_time_s"] / twin_step
        checks.insert(0, (f"within 1.05x of the 32-head twin's step ({twin_step:.3f} s): {ratio:.3f}x", ratio <= 1.05))
    for rival in CP_RIVALS:
        if rival in planners:
            ahead = planners[rival]["step_time_s"] / ours["step_time_s"]
            checks.append((f"ahead of {rival}: {ahead:.2f}x", ahead > 1.0))
    usp = planners.get("static-usp")
    note = (f" static-usp ran degree {usp['degree']} with CP part {usp['cp']} (u = {usp['degree'] // usp['cp']})."
            if usp else "")
    return simulated_table(name, CONTEXT_PARALLEL) + "\n\nTargets (simulated): " + verdicts(checks) + "." + note


def video_table(name: str) -> str:
    """A video setting planned with the clips' shapes and planned as lengths (shape-blind), both
    priced under the model's real attention pattern; each planner's rank both ways."""
    aware = record(f"simulate-{name}")
    blind = record(f"simulate-{name}-as-lengths") if recorded(f"simulate-{name}-as-lengths") else {"planners": {}}
    shaped, flat = aware["planners"], blind["planners"]

    def ranks(planners: dict) -> dict[str, int]:
        order = sorted(planners, key=lambda n: -planners[n]["tokens_per_s"])
        return {n: i + 1 for i, n in enumerate(order)}

    rank, rank_flat = ranks(shaped), ranks(flat)
    base = shaped.get("bucket", {}).get("tokens_per_s")
    rows = ["| planner | tokens/s | vs bucket | time / LB | plan ms | rank | as lengths: tokens/s | rank | "
            "shapes gain |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sorted(shaped, key=rank.get):
        s, f = shaped[n], flat.get(n)
        speed = f"{s['tokens_per_s'] / base:.2f}x" if base else "-"
        rows.append(f"| {n} | {s['tokens_per_s']:,.0f} | {speed} | {s['vs_lower_bound']:.3f} | "
                    f"{s['plan_ms']:.1f} | {rank[n]} | "
                    + (f"{f['tokens_per_s']:,.0f} | {rank_flat[n]} | {s['tokens_per_s'] / f['tokens_per_s']:.2f}x |"
                       if f else "- | - | - |"))
    setting = aware["setting"]
    head = (f"**Setting {name}** ({VIDEO[name]}, max-len {setting['max_len']:,}; {aware['steps']} steps, "
            f"mean lower bound {aware['lower_bound_s']:.3f} s/step, {setting['data']}{commit_note(aware)}):\n\n")
    return head + "\n".join(rows) + carry_note(aware) + "\n\n" + video_targets(name, aware)


def video_targets(name: str, data: dict) -> str:
    """The issue's simulated targets for this setting, each with its status."""
    planners = data["planners"]
    ours = planners["ballast"]
    others = {n: p["tokens_per_s"] for n, p in planners.items() if n != "ballast"}
    best = max(others, key=others.get)
    checks = [(f"ballast >= every other planner (within 1%): {ours['tokens_per_s'] / others[best]:.3f}x {best}",
               ours["tokens_per_s"] >= 0.99 * others[best]),
              (f"<= 1.10x the lower bound: {ours['vs_lower_bound']:.3f}"
               + (f", while its step is {ours['step_time_s'] / data['longest_alone_s']:.3f}x the slowest clip alone at "
                  f"its best degree ({data['longest_alone_s']:.2f} s), a floor for every plan without remapping"
                  if "longest_alone_s" in data and ours["vs_lower_bound"] > 1.10 else ""), ours["vs_lower_bound"] <= 1.10)]
    if name == "V1" and "bucket" in planners:
        checks.append((f">= 2.5x bucket: {ours['tokens_per_s'] / planners['bucket']['tokens_per_s']:.2f}x",
                       ours["tokens_per_s"] >= 2.5 * planners["bucket"]["tokens_per_s"]))
    if name == "V1" and "plan_ms_max" in ours:
        checks.append((f"planning <= 100 ms per step: {ours['plan_ms']:.0f} ms mean, {ours['plan_ms_max']:.0f} max",
                       ours["plan_ms_max"] <= 100))
    return "Targets (simulated): " + verdicts(checks) + "."


def routing_table(name: str) -> str:
    """Every planner with routing on, zeppelin and ballast also with it off, and what routing gained each."""
    routed = record(f"simulate-{name}")
    unrouted = record(f"simulate-{name}-unrouted")["planners"]
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
    ahead = "ballast" in planners and all(planners["ballast"]["step_time_s"] <= t for t in rivals.values())
    head = (f"**Setting {name}** ({ROUTING[name]}; {routed['steps']} steps, mean lower bound "
            f"{routed['lower_bound_s']:.3f} s/step; simulated{commit_note(routed)}):\n\n")
    return head + "\n".join(rows) + carry_note(routed) + f"\n\nballast ahead of every rival: {'yes' if ahead else 'no'}."


PIPELINES = {
    "P1": "wikipedia lengths (the raw file), h100-256 as TP 8 x PP 4 x a pool of 8, Llama-3-70B (analytic), max-len 131072, "
          "2M tokens/step",
    "P2": "lognormal:8,1.5 lengths, h100-256 as TP 8 x PP 4 x a pool of 8, Llama-3-70B (analytic), max-len 131072, "
          "2M tokens/step",
    "P3": "wikipedia lengths (the raw file), h100-1024 as TP 8 x PP 4 x a pool of 32, Llama-3-70B (analytic), max-len 131072, "
          "4,096 sequences/step",
    "P4": "wikipedia lengths (the raw file), h100-2304 as TP 8 x PP 18 x a pool of 16, Llama-3-405B's shape "
          "(bench/data/llama3-405b.json, analytic), max-len 131072, 8M tokens/step",
}
"""The pipeline settings (`bench/pipelines.sh`, tabled by `pipeline_tables.py`)."""

HEADLINE_GROUPS = (("text", SETTINGS), ("video", VIDEO), ("context parallel", CONTEXT_PARALLEL),
                   ("NIC routing", ROUTING), ("pipelines", PIPELINES))


def shown_lengths(spec: str) -> str:
    """A setting's length source as a table shows it: a file by its name, not the path it was read
    from on the recording machine."""
    kind, colon, path = spec.partition(":")
    return f"{kind}:{Path(path).name}" if colon and kind in ("file", "videos") else spec


def headline_table() -> str:
    """One row per recorded simulated setting: ballast's step over the lower bound, and the
    rival planner with the shortest step, with its own ratio."""
    rows = ["| setting | lengths, cluster, model | ballast ÷ lower bound | best rival | rival ÷ lower bound |",
            "|---|---|---:|---|---:|"]
    for kind, settings in HEADLINE_GROUPS:
        for name in settings:
            if not recorded(f"simulate-{name}"):
                continue
            data = record(f"simulate-{name}")
            planners, s = data["planners"], data["setting"]
            rival = min((n for n in planners if n != "ballast"), key=lambda n: planners[n]["step_time_s"])
            rows.append(f"| {name} ({kind}) | `{shown_lengths(s['lengths'])}`, {s['cluster']}, {s['model']} | "
                        f"{planners['ballast']['vs_lower_bound']:.3f} | {rival}"
                        f"{' (row carried over)' if 'carried_over' in planners[rival] else ''} | "
                        f"{planners[rival]['vs_lower_bound']:.3f} |")
    return "\n".join(rows)


def sweep_text() -> str:
    """`bench/sweep.py`'s random settings: how often ballast is the fastest planner."""
    data = record("sweep")
    s = data["summary"]
    best = Counter(r["best_other"] for r in data["rows"])
    behind = "; ".join(f"{r['setting']['cluster']} {r['setting']['model']} {r['setting']['lengths']}: "
                       f"{r['ballast_vs_best_other']:.3f}x {r['best_other']}" for r in s["behind"])
    return (f"**Random settings** (`bench/sweep.py --seed {s['seed']}`: {s['settings']} draws of cluster "
            f"(a100/h100/h200, 8-128 GPUs), model, length source, max-len and batch; {s['steps']} steps each; "
            f"{len(s['planners'])} planners, flexsp left out for its MILPs' time; {s['seconds']:.0f} s"
            f"{commit_note(data)}). ballast "
            f"was the fastest or within 1% of the fastest on {s['ballast_fastest_or_tied']} of {s['settings']} "
            f"settings and strictly the fastest on {s['ballast_strictly_fastest']}; its tokens/s over the best "
            f"other planner's: median {s['ratio_median']:.3f}, worst {s['ratio_min']:.3f}; mean planning time "
            f"{s['ballast_plan_ms_mean']:.0f} ms. The best other planner was "
            + ", ".join(f"{name} ({count})" for name, count in best.most_common())
            + (f". Behind by more than 1%: {behind}." if behind else "."))


def optimum_gap_text() -> str:
    """`bench/optimum_gap.py`: ballast against the exhaustive optimum on tiny instances."""
    d = record("optimum-gap")
    q = d["ratio_quantiles"]
    return (f"**Against the exhaustive optimum** (`bench/optimum_gap.py`: {d['instances']:,} tiny instances, "
            f"<= 4 ranks and <= 6 sequences, every plan of any number of waves searched{commit_note(d)}). "
            f"ballast was exactly "
            f"optimal on {d['exactly_optimal']:.1%}; its step time over the optimum: 99th percentile "
            f"{q['0.99']:.4f}, 99.9th {q['0.999']:.4f}, worst {q['1.0']:.4f} ({d['above_3pct']} instances more "
            f"than 3% above). The best plan needed several waves on {d['multi_wave_optimum_share']:.1%} of them "
            f"(the best one-wave plan was up to {d['best_one_wave_over_optimum_max']:.2f}x slower). The search "
            f"does not remap; ballast remapped a long pole on {d['remapped']} instances and beat the search's "
            f"optimum so on {d['below_optimum_remapped']}.")


def latency_table() -> str:
    data = record("latency")
    names = sorted({n for p in data["points"] for n in p["planners"]})
    rows = ["| planner | " + " | ".join(f"{p['sequences']} seqs / {p['devices']} GPUs" for p in data["points"]) + " |",
            "|---|" + "---:|" * len(data["points"])]
    for n in names:
        cells = [f"{p['planners'][n]['plan_s'] * 1e3:,.1f} ms" if n in p["planners"] else "-" for p in data["points"]]
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    note = commit_note(data)
    return "\n".join(rows) + (f"\n\nRecorded at {note[2:]}." if note else "")
