"""Render the recorded benchmark JSON into the README's results section (between markers).

Run after any benchmark: it rewrites the text between `<!-- results:NAME -->` and
`<!-- /results:NAME -->` in README.md, so the README always shows the latest recorded run.
"""
from __future__ import annotations

import json
import re
import statistics
from collections import Counter
from pathlib import Path

from readme_routing import ROUTING, routing_table

from ballast.profile.drift import how_much

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SETTINGS = {
    "A": "wikipedia lengths, a100-64, gpt-7b (published FlexSP profile), max-len 393216, 512 sequences/step",
    "B": "stdlib lengths, h100-32, llama3-8b (analytic), max-len 131072, 1M tokens/step",
    "C": "lognormal:7,1.6 lengths, h200-32, gpt-13b (analytic), max-len 262144, 256 sequences/step",
}
STATISTIC_NAMES = {"median": "median", "min": "minimum"}
"""How the README names a profile's statistic over rounds (`profile.measure.STATISTICS`)."""


def simulated_table(name: str, settings: dict[str, str] = SETTINGS) -> str:
    data = json.loads((RESULTS / f"simulate-{name}.json").read_text())
    planners = data["planners"]
    base = planners.get("static", {}).get("tokens_per_s")
    rows = ["| planner | step (s) | tokens/s | vs static | idle | time / LB | plan ms (mean) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for planner, s in sorted(planners.items(), key=lambda kv: -kv[1]["tokens_per_s"]):
        speed = f"{s['tokens_per_s'] / base:.2f}x" if base else "-"
        rows.append(f"| {planner} | {s['step_time_s']:.3f} | {s['tokens_per_s']:,.0f} | {speed} | "
                    f"{s['idle_fraction']:.1%} | {s['vs_lower_bound']:.3f} | {s['plan_ms']:.1f} |")
    head = (f"**Setting {name}** ({settings[name]}; {data['steps']} steps, mean lower bound "
            f"{data['lower_bound_s']:.3f} s/step):\n\n")
    return head + "\n".join(rows)


CONTEXT_PARALLEL = {
    "CP1": "lognormal:8,1.6 lengths, h100-32, Qwen2.5-7B's shape (28 heads, 4 kv heads; bench/data/qwen2.5-7b.json, "
           "analytic), max-len 262144, 256 sequences/step",
    "CP2": "DCP's any-size video (`video`), h200-32, wan-14b (40 heads, full attention), max-len 393216, 256 clips/step",
    "CP3": "lognormal:8,2 lengths, h200-64, Qwen2.5-7B's shape, max-len 1048576 (1M tokens), 256 sequences/step",
}
CP_RIVALS = ("megatron-dynamic-cp", "static-usp", "wlb-llm")
"""The planners the context-parallelism issue's targets say ballast must be ahead of (where recorded)."""


def context_parallel_table(name: str) -> str:
    """A CP setting's table (static-usp: static at its fastest fixed degree and CP part) and the
    issue's targets for it."""
    data = json.loads((RESULTS / f"simulate-{name}.json").read_text())
    planners, ours = data["planners"], data["planners"]["ballast"]
    checks = [(f"<= 1.05x the lower bound: {ours['vs_lower_bound']:.3f}", ours["vs_lower_bound"] <= 1.05)]
    twin = RESULTS / f"simulate-{name}-32-heads.json"
    if twin.exists():
        twin_step = json.loads(twin.read_text())["planners"]["ballast"]["step_time_s"]
        ratio = ours["step_time_s"] / twin_step
        checks.insert(0, (f"within 1.05x of the 32-head twin's step ({twin_step:.3f} s): {ratio:.3f}x", ratio <= 1.05))
    for rival in CP_RIVALS:
        if rival in planners:
            ahead = planners[rival]["step_time_s"] / ours["step_time_s"]
            checks.append((f"ahead of {rival}: {ahead:.2f}x", ahead > 1.0))
    usp = planners.get("static-usp")
    note = (f" static-usp ran degree {usp['degree']} with CP part {usp['cp']} (u = {usp['degree'] // usp['cp']})."
            if usp else "")
    return (simulated_table(name, CONTEXT_PARALLEL) + "\n\nTargets (simulated): "
            + "; ".join(f"{text} ({'met' if ok else 'NOT met'})" for text, ok in checks) + "." + note)


VIDEO = {
    "V1": "DCP's any-size video (`video`), h200-32, stdit3-1b (spatial-temporal), 256 clips/step",
    "V2": "DCP's any-size video (`video`), h100-32, wan-1.3b (full attention), 256 clips/step",
    "V3": "a Panda-70M-like clip list (`videos:bench/data/panda70m-like.txt`), h200-64, wan-14b (full "
          "attention), 256 clips/step",
}


def video_table(name: str) -> str:
    """A video setting planned with the clips' shapes and planned as lengths (shape-blind), both
    priced under the model's real attention pattern; each planner's rank both ways."""
    aware = json.loads((RESULTS / f"simulate-{name}.json").read_text())
    blind = json.loads((RESULTS / f"simulate-{name}-as-lengths.json").read_text())
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
        rows.append(f"| {n} | {s['tokens_per_s']:,.0f} | {s['tokens_per_s'] / base:.2f}x | {s['vs_lower_bound']:.3f} | "
                    f"{s['plan_ms']:.1f} | {rank[n]} | "
                    + (f"{f['tokens_per_s']:,.0f} | {rank_flat[n]} | {s['tokens_per_s'] / f['tokens_per_s']:.2f}x |"
                       if f else "- | - | - |"))
    setting = aware["setting"]
    head = (f"**Setting {name}** ({VIDEO[name]}, max-len {setting['max_len']:,}; {aware['steps']} steps, "
            f"mean lower bound {aware['lower_bound_s']:.3f} s/step, {setting['data']}):\n\n")
    return head + "\n".join(rows) + "\n\n" + video_targets(name, aware)


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
    if name == "V1":
        checks += [(f">= 2.5x bucket: {ours['tokens_per_s'] / planners['bucket']['tokens_per_s']:.2f}x",
                    ours["tokens_per_s"] >= 2.5 * planners["bucket"]["tokens_per_s"]),
                   (f"planning <= 100 ms per step: {ours['plan_ms']:.0f} ms mean, {ours['plan_ms_max']:.0f} max",
                    ours["plan_ms_max"] <= 100)]
    return "Targets (simulated): " + "; ".join(f"{text} ({'met' if ok else 'NOT met'})" for text, ok in checks) + "."


def latency_table() -> str:
    data = json.loads((RESULTS / "latency.json").read_text())
    names = sorted({n for p in data["points"] for n in p["planners"]})
    rows = ["| planner | " + " | ".join(f"{p['sequences']} seqs / {p['devices']} GPUs" for p in data["points"]) + " |",
            "|---|" + "---:|" * len(data["points"])]
    for n in names:
        cells = [f"{p['planners'][n]['plan_s'] * 1e3:,.1f} ms" if n in p["planners"] else "-" for p in data["points"]]
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def bench_rows(data: dict) -> list[str]:
    """One table row per planner of a `ballast bench` JSON, fastest first."""
    rows = ["| planner | tokens/s | vs static | paired | spread | step (s) | waves (s) | predicted (s) | error | "
            "error (whole step) | idle | plan ms | degrees | recomp |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for planner, p in sorted(data["planners"].items(), key=lambda kv: -kv[1]["tokens_per_s"]):
        # A record made before the bench composed steps from micro-batches has no whole-step error.
        whole = f"{p['prediction_error_step']:+.1%}" if "prediction_error_step" in p else "-"
        # records written before the rename of "checkpointed" to "recomputed" carry the old key
        rows.append(f"| {planner} | {p['tokens_per_s']:,.0f} | {p['vs_static']:.2f}x | {p['vs_static_paired']:.2f}x | "
                    f"{p['round_spread']:.1%} | {p['step_s']:.3f} | {p['waves_s']:.3f} | {p['predicted_s']:.3f} | "
                    f"{p['prediction_error']:+.1%} | {whole} | {p['idle_fraction']:.1%} | {p['plan_ms']:.1f} | "
                    f"{','.join(map(str, p['degrees']))} | {p.get('recomputed', p.get('checkpointed')):.2f} |")
    return rows


def hf_table() -> str:
    """bench/hf.sh's recorded run: a tiny Hugging Face Llama, ballast against static at SP degree 2."""
    data = json.loads((RESULTS / "hf-llama.json").read_text())
    s, cost, load = data["setting"], data["cost_model"], data["load_average"]
    head = (f"**Measured** ({s['model']}: a transformers LlamaForCausalLM, on {s['world']} gloo ranks, {s['data']} "
            f"corpus, ~{s['tokens_per_step']:,} tokens/step, max-len {s['max_len']:,}, "
            f"{cost['device_memory_gb'] * 1e3:.1f} MB per rank; {cost['source']} cost model; {s['warmup']} warm-up + "
            f"{s['repeats']} rounds x {s['steps']} steps, interleaved; {data['seconds']:.0f} s wall, load average "
            f"{load['min']:.1f}..{load['max']:.1f}; columns as in the measured table below):\n\n")
    return head + "\n".join(bench_rows(data))


VIDEO_SPEEDUP_TARGET = 1.3
"""The video-model issue's target: ballast >= 1.3x static (one SP degree for every clip)."""


def video_measured_table() -> str:
    """bench/video_dit.sh's recorded run: stdit-tiny on video-synthetic, every planner, and the
    200-step training run."""
    data = json.loads((RESULTS / "video-measured.json").read_text())
    s, cost, load, t = data["setting"], data["cost_model"], data["load_average"], data["targets"]
    clips = [n for b in data["batches"] if b["measured"] for n in b["lengths"]]
    head = (f"**Measured** ({s['model']} on {s['world']} gloo ranks, {data['data']}; ~{s['tokens_per_step']:,} "
            f"tokens/step ({len(clips) / max(1, sum(b['measured'] for b in data['batches'])):.0f} clips per step on "
            f"average, {min(clips)} to {max(clips):,} tokens each), max-len {s['max_len']:,}, "
            f"{cost['device_memory_gb'] * 1e3:.1f} MB per rank; {cost['source']} cost model; static at SP degree "
            f"{s['degree']}; {s['warmup']} warm-up + {s['repeats']} rounds x {s['steps']} steps, interleaved; "
            f"{data['seconds']:.0f} s wall, load average {load['min']:.1f}..{load['max']:.1f}; columns as in the "
            f"measured table below; {error_text(data)}):\n\n")
    ours = data["planners"]["ballast"]["vs_static"]
    others = t["ballast_vs_others"]
    worst = max(t["prediction"]["abs_errors"], key=t["prediction"]["abs_errors"].get)
    verdict = {True: "met", False: "**not met**"}
    lines = [f"ballast vs static {ours:.2f}x (>= {VIDEO_SPEEDUP_TARGET}x: {verdict[ours >= VIDEO_SPEEDUP_TARGET]})",
             f"ballast vs the best other planner ({others['worst']}) {others['ratio']:.2f}x (>= 1 - noise = "
             f"{1 - others['noise']:.2f}x: {verdict[others['met']]})",
             f"the profiled cost model's largest median |error| {t['prediction']['abs_errors'][worst]:.1%} ({worst})"]
    if data.get("drift"):  # bench records made before the bench measured the drift have none
        lines.append(drift_text(data))
    text = head + "\n".join(bench_rows(data)) + "\n\nTargets: " + "; ".join(lines) + "."
    if (RESULTS / "video-profile-check.json").exists():
        check = json.loads((RESULTS / "video-profile-check.json").read_text())
        time, act = check["summary"]["time"], check["summary"]["act"]
        text += (f"\n\n`ballast profile --check` of that profile on {time['count']} random video plans of six "
                 f"planners: step time within {time['median']:.1%} of the prediction (median; {time['max']:.1%} "
                 f"worst), activation memory within {act['median']:.1%} "
                 f"(`bench/results/video-profile-check.png`)")
        if "time_step" in check["summary"]:
            whole = check["summary"]["time_step"]
            text += f"; against the whole step's rounds reduced, {whole['median']:.1%} (median; {whole['max']:.1%} worst)"
        if check.get("drift"):
            ratio, corrected = check["drift"]["ratio"], check["summary"]["time_drift_corrected"]
            text += (f"; the machine ran {how_much(ratio)} during the "
                     f"check than during the profile (its full-depth points measured again), {corrected['median']:.1%} "
                     f"(median; {corrected['max']:.1%} worst) with that drift divided out")
        text += "."
    if (RESULTS / "video-train-summary.json").exists():
        run = json.loads((RESULTS / "video-train-summary.json").read_text())
        text += (f"\n\nTraining (`ballast train --model stdit-tiny --data video-synthetic --world 2 --steps "
                 f"{run['steps']}`, {run['planner']} planner, {run['cost_model']} cost model): loss "
                 f"{run['loss_first']:.3f} -> {run['loss_last']:.3f}, {run['tokens_per_s']:,.0f} tokens/s, "
                 f"{run['step_time_s']:.2f} s per step.\n\n![stdit-tiny loss](bench/results/video-train-loss.png)")
    return text


def drift_text(data: dict) -> str:
    """A bench record's drift since its profile, and its planners' errors with it divided out."""
    ratio, planners = data["drift"]["ratio"], data["planners"]
    corrected = {name: p["prediction_abs_error_drift_corrected"] for name, p in planners.items()}
    worst = max(corrected, key=corrected.get)
    return (f"the machine ran {how_much(ratio)} than during the profile "
            f"(its {len(data['drift']['points'])} longest full-depth points run again in every round), with that "
            f"drift divided out the largest median |error| {corrected[worst]:.1%} ({worst}; reported, not judged)")


def peers_table() -> str:
    """bench/peers.sh's recorded run: DeepSpeed-Ulysses (its own code) against ballast's static
    (SP degree 2) and ballast plans, the same HF model and batches, interleaved in one gloo job."""
    data = json.loads((RESULTS / "peers-deepspeed.json").read_text())
    s, peer, load, mem = data["ballast_setting"], data["peer"], data["load_average"], data["memory"]
    engine = peer["engine"]
    ml = mem.get("load_average")
    mem_load = f" (load average {ml['min']:.1f}..{ml['max']:.1f})" if ml else ""
    head = (f"**Measured** ({s['model']} on {s['world']} gloo ranks, {s['data']} corpus, ~{s['tokens_per_step']:,} "
            f"tokens/step, max-len {s['max_len']:,}; DeepSpeed {peer['deepspeed']}: `DistributedAttention` at SP "
            f"degree {peer['sp_degree']}, engine with ZeRO stage {engine['zero_stage']}, fp32, "
            f"{engine['optimizer']}; {s['warmup']} warm-up + {s['repeats']} rounds x {s['steps']} steps, interleaved; "
            f"{data['seconds']:.0f} s wall, load average {load['min']:.1f}..{load['max']:.1f} on "
            f"{load['cpus']} CPUs, ranks' CPU share "
            f"{min(x['cpu_share'] for x in data['systems'].values()):.0%}..{max(x['cpu_share'] for x in data['systems'].values()):.0%}; "
            f"loss: largest difference to `static`'s on the same step; peak RSS: each system alone in a job of its own"
            f"{mem_load}):\n\n")
    rows = ["| system | tokens/s | vs DeepSpeed | paired | spread | step (s) | micro-batches | degrees | "
            "loss max abs diff | max rel | peak RSS / rank (MB) |",
            "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    names = {"deepspeed-ulysses": "DeepSpeed-Ulysses", "static": "ballast `static` (degree 2)",
             "ballast": "ballast `ballast`"}
    for name, p in sorted(data["systems"].items(), key=lambda kv: -kv[1]["tokens_per_s"]):
        agree = p.get("loss_vs_static")
        diff = ("(reference)" if agree is None else f"{agree['max_abs']:.1e}",
                "" if agree is None else f"{agree['max_rel']:.1e}")
        rss = " / ".join(f"{x:,.0f}" for x in p["peak_rss_mb"]) or "n/a"
        rows.append(f"| {names.get(name, name)} | {p['tokens_per_s']:,.0f} | {p['vs_deepspeed']:.2f}x | "
                    f"{p['vs_deepspeed_paired']:.2f}x | {p['round_spread']:.1%} | {p['step_s']:.3f} | "
                    f"{_layout(data, name)} | {diff[0]} | {diff[1]} | {rss} |")
    t = data["targets"]
    verdict = lambda x: "met" if x["met"] else "not met"  # noqa: E731
    tail = (f"\n\nTargets: ballast {t['ballast_vs_deepspeed']['value']:.2f}x DeepSpeed-Ulysses (>= 1.3x: "
            f"{verdict(t['ballast_vs_deepspeed'])}); static {t['static_vs_deepspeed']['value']:.2f}x (within the "
            f"{t['static_vs_deepspeed']['noise']:.1%} noise or faster: {verdict(t['static_vs_deepspeed'])}).")
    roomy = RESULTS / "peers-deepspeed-8gb.json"
    if roomy.exists():
        d = json.loads(roomy.read_text())
        p, load = d["systems"], d["load_average"]
        agree = max(x["loss_vs_static"]["max_rel"] for x in p.values() if "loss_vs_static" in x)
        tail += (f"\n\nAt 8 GB per rank (`peers-deepspeed-8gb.json`, {d['seconds']:.0f} s, load average "
                 f"{load['min']:.1f}..{load['max']:.1f}), `static` runs the peer's layout exactly (micro-batches "
                 f"{_layout(d, 'static', ' per step, degrees ')}): {p['static']['tokens_per_s']:,.0f} tokens/s, "
                 f"{p['static']['vs_deepspeed']:.2f}x DeepSpeed-Ulysses (paired {p['static']['vs_deepspeed_paired']:.2f}x; "
                 f"noise {d['relative_noise']:.1%}); ballast (micro-batches {_layout(d, 'ballast', ' per step, degrees ')}) "
                 f"{p['ballast']['tokens_per_s']:,.0f} tokens/s, {p['ballast']['vs_deepspeed']:.2f}x (paired "
                 f"{p['ballast']['vs_deepspeed_paired']:.2f}x); peak RSS per rank static "
                 f"{' / '.join(f'{x:,.0f}' for x in p['static']['peak_rss_mb']) or 'n/a'} MB, DeepSpeed "
                 f"{' / '.join(f'{x:,.0f}' for x in p['deepspeed-ulysses']['peak_rss_mb']) or 'n/a'} MB; "
                 f"losses within {agree:.1e} (relative) of static's.")
    return head + "\n".join(rows) + tail


def _layout(data: dict, name: str, sep: str = " | ") -> str:
    """Mean micro-batches per measured step and the SP degrees used, from a peers JSON's records."""
    mine = [r for r in data["records"] if r["planner"] == name and r["round"] >= 0 and "micro_batches" in r]
    if not mine:
        return f"n/a{sep}n/a"
    degrees = sorted({d for r in mine for d in r["degrees"]})
    return f"{sum(r['micro_batches'] for r in mine) / len(mine):.2f}{sep}{','.join(map(str, degrees))}"


def error_text(data: dict) -> str:
    """What a bench record's error columns hold."""
    statistic = data.get("prediction_statistic", "median")
    if "prediction_error_step" not in next(iter(data["planners"].values())):
        return (f"error: predicted / measured waves ({statistic} over rounds, as the cost model was fitted) - 1, "
                f"median over batches")
    return (f"error: predicted / measured waves - 1, median over batches, each micro-batch's {statistic} over rounds "
            f"composed into the step (as the profile reduced its one-micro-batch points); error (whole step): "
            f"against the whole waves' {statistic} over rounds")


def measured_table() -> str:
    """`ballast bench`'s recorded run: the setting, the load it ran under, one row per planner, the targets."""
    data = json.loads((RESULTS / "measured.json").read_text())
    s, cost, load = data["setting"], data["cost_model"], data["load_average"]
    noise, relative = data["noise"]["run_to_run"], data["noise"]["relative"]
    rows = bench_rows(data)
    lengths = [n for b in data["batches"] if b["measured"] for n in b["lengths"]]
    head = (f"**Measured** ({s['model']} on {s['world']} gloo ranks, {s['data']} corpus, ~{s['tokens_per_step']:,} "
            f"tokens/step, max-len {s['max_len']:,} ({sum(n == s['max_len'] for n in lengths)} of the {len(lengths)} "
            f"measured sequences are max-len chunks), {cost['device_memory_gb'] * 1e3:.1f} MB per rank; "
            f"{cost['source']} cost model; {s['warmup']} warm-up + {s['repeats']} rounds x {s['steps']} steps, "
            f"planners interleaved per step; {data['seconds']:.0f} s wall, load average {load['min']:.1f}.."
            f"{load['max']:.1f} (median {load['median']:.1f}) on {load['cpus']} CPUs, ranks' CPU share "
            f"{data['noise']['cpu_share']:.0%}"
            + (f"; run-to-run noise of tokens/s {noise:.1%}, of speeds relative to static {relative:.1%}"
               if noise is not None else "") + "). tokens/s: per batch the median step time over rounds; "
            f"paired: median per-batch ratio to static's step; spread: of tokens/s over rounds; {error_text(data)}:\n\n")
    text = head + "\n".join(rows) + "\n\nTargets: " + "; ".join(target_lines(data["targets"])) + "."
    if (RESULTS / "measured-repeat.json").exists():
        text += "\n\n" + repeat_line(data, json.loads((RESULTS / "measured-repeat.json").read_text()))
    others = sorted(path for path in RESULTS.glob("measured-*.json")
                    if path.name != "measured-repeat.json" and not path.stem.endswith("-profile"))
    if others:
        text += "\n\nOther recorded runs of the same bench:\n\n" + "\n".join(f"- {other_line(path)}" for path in others)
    return text


def other_line(path: Path) -> str:
    """One line for another recorded `ballast bench` run: its setting and how ballast fared."""
    data = json.loads(path.read_text())
    s, ours, t = data["setting"], data["planners"]["ballast"], data["targets"]
    lengths = [n for b in data["batches"] if b["measured"] for n in b["lengths"]]
    worst = max(t["prediction"]["abs_errors"].values())
    return (f"`{path.name}` (max-len {s['max_len']:,}, ~{s['tokens_per_step']:,} tokens/step, "
            f"{sum(n == s['max_len'] for n in lengths)} of {len(lengths)} sequences max-len chunks; {data['seconds']:.0f} s): "
            f"ballast {ours['vs_static']:.2f}x static (paired {ours['vs_static_paired']:.2f}x), "
            f"{t['ballast_vs_others']['ratio']:.2f}x {t['ballast_vs_others']['worst']}, largest median |error| "
            f"{worst:.1%}")


def repeat_line(first: dict, again: dict) -> str:
    """How far a second invocation of the same bench moved the numbers."""
    names = [n for n in first["planners"] if n in again["planners"]]
    moved = sorted(abs(again["planners"][n]["tokens_per_s"] / first["planners"][n]["tokens_per_s"] - 1) for n in names)
    ours = again["planners"].get("ballast", {})
    speed = (f"ballast {ours['vs_static']:.2f}x static (paired {ours['vs_static_paired']:.2f}x); "
             if ours.get("vs_static") is not None else "")
    return (f"A second invocation (`measured-repeat.json`, {again['seconds']:.0f} s, load average median "
            f"{again['load_average']['median']:.1f}, ranks' CPU share {again['noise']['cpu_share']:.0%}): {speed}"
            f"each planner's tokens/s moved by {moved[len(moved) // 2]:.1%} (median; at most {moved[-1]:.1%}); "
            f"targets: {'; '.join(target_lines(again['targets']))}.")


def target_lines(targets: dict) -> list[str]:
    """Each target of `ballast bench` with what was measured against it."""
    def verdict(t: dict) -> str:
        return "met" if t["met"] else "**not met**"

    out = []
    if "ballast_vs_static" in targets:
        t = targets["ballast_vs_static"]
        out.append(f"ballast vs static {t['value']:.2f}x (>= {t['target']:.1f}x: {verdict(t)})")
    if "ballast_vs_others" in targets:
        t = targets["ballast_vs_others"]
        out.append(f"ballast vs the best other planner ({t['worst']}) {t['ratio']:.2f}x "
                   f"(>= 1 - noise = {1 - t['noise']:.2f}x: {verdict(t)})")
    t = targets["prediction"]
    worst = max(t["abs_errors"], key=t["abs_errors"].get)
    out.append(f"cost model's largest median |error| {t['abs_errors'][worst]:.1%} ({worst}; <= {t['target']:.0%}: "
               f"{verdict(t)})")
    t = targets["wall_seconds"]
    out.append(f"wall time {t['value']:.0f} s (< {t['target']:.0f} s: {verdict(t)})")
    return out


PROFILE_RECORDS = {"tiny": "profile", "hf-llama": "profile-hf-llama", "dit-tiny": "profile-dit-tiny",
                   "stdit-tiny": "profile-stdit-tiny"}
"""`bench/profile_record.py --name NAME` records -> their README block."""


def profile_text(name: str) -> str:
    """`bench/profile_record.py`'s run: how fast the profile is and how well it predicts real plans."""
    data = json.loads((RESULTS / f"profile-{name}-summary.json").read_text())
    s, secs, targets = data["setting"], data["seconds"], data["targets"]
    check, fit = data["check"], data["profile"]
    rows = ["| | median | 90th pct | max | n |", "|---|---:|---:|---:|---:|"]
    # A record made before #31's noise report and held-out points has no such rows.
    summary, held = check["summary"], fit.get("held_out_error", {})
    composed = (" (the check's micro-batch by micro-batch, composed into the step; the whole step's rounds "
                "reduced are the row below it)" if "time_step" in summary else "")
    for label, stats in [("check: step time, predicted vs measured", summary["time"]),
                         ("check: activation bytes, predicted vs measured", summary["act"]),
                         ("check: the whole step's rounds reduced (as is)", summary.get("time_step")),
                         ("check: step time beyond each plan's repeat spread", summary.get("time_beyond_noise")),
                         ("check: a plan's repeat spread (slowest - fastest round)", summary.get("noise")),
                         ("check: step time with the machine's drift divided out", summary.get("time_drift_corrected")),
                         ("fit residuals: time", fit["residuals"]["time"]),
                         ("fit residuals: activation bytes", fit["residuals"]["act"]),
                         ("held-out real batches (never fitted): time", held.get("time")),
                         ("2-layer extrapolation vs full depth: time", fit["extrapolation_error"]["time"])]:
        if stats is None or not stats["count"]:  # e.g. no extrapolation where the profile ran the full depth
            continue
        rows.append(f"| {label} | {stats['median']:.2%} | {stats['p90']:.2%} | {stats['max']:.2%} | {stats['count']} |")
    source = (f"clips of DCP's video buckets scaled to at most {s['max_len']:,} tokens" if s["lengths"] == "video"
              else f"{s['lengths']} lengths up to {s['max_len']:,} tokens")
    head = (f"**Profile** ({s['model']} on {s['world']} gloo ranks, {source}, "
            f"~{s['tokens_per_step']:,} tokens/step for the check, {s['device_memory_gb'] * 1e3:.0f} MB device "
            f"budget; {s['attention_kernel']} attention kernel; commit {s['commit']}; load average "
            f"{fit['load_average']['median']:.1f} during the profile, {check['load_average']['median']:.1f} during the "
            f"check, on {fit['load_average']['cpus']} CPUs). Full profile {secs['profile']:.0f} s, `--quick` "
            f"{secs['quick']:.0f} s; `--check` ran {check['setting']['plans']} plans from "
            f"{len(check['setting']['planners'])} planners, {check['setting']['repeats']} repeats each "
            f"({secs['check']:.0f} s); every time the {STATISTIC_NAMES[check['setting']['statistic']]} of its rounds, in the profile as "
            f"in the check{composed}. Errors are |predicted / measured - 1|:\n\n")
    over = f" (median over {len(data['runs'])} runs)" if len(data.get("runs", [])) > 1 else ""
    names = {"check_time_median": f"median step-time error{over}", "check_time_p90": f"90th percentile{over}",
             "check_act_max": "largest activation error", "profile_seconds": "full profile",
             "quick_seconds": "quick profile"}
    verdicts = []
    for key, label in names.items():
        t = targets[key]
        if key.endswith("seconds"):
            verdicts.append(f"{label} {t['measured']:.0f} s (<= {t['target']:.0f} s: {'met' if t['met'] else '**not met**'})")
        else:
            verdicts.append(f"{label} {t['measured']:.1%} (<= {t['target']:.0%}: {'met' if t['met'] else '**not met**'})")
    return head + "\n".join(rows) + runs_text(data.get("runs", [])) + "\n\nTargets: " + "; ".join(verdicts) + "."


def runs_text(runs: list[dict]) -> str:
    """`profile_record.py --runs N`: every run's check beside the first's (whose table is above);
    the check's targets are judged on the median over runs."""
    if len(runs) < 2:
        return ""

    def each(values: list[float], signed: bool = False) -> str:
        return ", ".join(f"{v:+.1%}" if signed else f"{v:.1%}" for v in values)

    medians, p90s = [r["time_median"] for r in runs], [r["time_p90"] for r in runs]
    drift = ("" if any(r["drift"] is None for r in runs) else
             f"; the profile's full-depth points took {each([r['drift'] - 1 for r in runs], True)} longer in the "
             f"check than in the profile (the machine's drift)")
    whole = ("" if any("time_step_median" not in r for r in runs) else
             f"; against the whole step's rounds reduced (as is) median {each([r['time_step_median'] for r in runs])}, "
             f"90th percentile {each([r['time_step_p90'] for r in runs])}")
    return (f"\n\n{len(runs)} runs of the same code in turn, each a full profile and its check (the table is "
            f"the first's): check step time |error| median {each(medians)} (median over runs "
            f"{statistics.median(medians):.1%}), 90th percentile {each(p90s)} ({statistics.median(p90s):.1%}){whole}; signed "
            f"median {each([r['signed_median'] for r in runs], True)}{drift}; held-out real micro-batches, measured in "
            f"the profile's own rounds, median {each([r['held_out_median'] for r in runs])}. The check's targets "
            f"below are judged on the median over runs.")


def sweep_text() -> str:
    """`bench/sweep.py`'s random settings: how often ballast is the fastest planner."""
    data = json.loads((RESULTS / "sweep.json").read_text())
    s = data["summary"]
    best = Counter(r["best_other"] for r in data["rows"])
    behind = "; ".join(f"{r['setting']['cluster']} {r['setting']['model']} {r['setting']['lengths']}: "
                       f"{r['ballast_vs_best_other']:.3f}x {r['best_other']}" for r in s["behind"])
    return (f"**Random settings** (`bench/sweep.py --seed {s['seed']}`: {s['settings']} draws of cluster "
            f"(a100/h100/h200, 8-128 GPUs), model, length source, max-len and batch; {s['steps']} steps each; "
            f"{len(s['planners'])} planners, flexsp left out for its MILPs' time; {s['seconds']:.0f} s). ballast "
            f"was the fastest or within 1% of the fastest on {s['ballast_fastest_or_tied']} of {s['settings']} "
            f"settings and strictly the fastest on {s['ballast_strictly_fastest']}; its tokens/s over the best "
            f"other planner's: median {s['ratio_median']:.3f}, worst {s['ratio_min']:.3f}; mean planning time "
            f"{s['ballast_plan_ms_mean']:.0f} ms. The best other planner was "
            + ", ".join(f"{name} ({count})" for name, count in best.most_common())
            + (f". Behind by more than 1%: {behind}." if behind else "."))


def optimum_gap_text() -> str:
    """`bench/optimum_gap.py`: ballast against the exhaustive optimum on tiny instances."""
    d = json.loads((RESULTS / "optimum-gap.json").read_text())
    q = d["ratio_quantiles"]
    return (f"**Against the exhaustive optimum** (`bench/optimum_gap.py`: {d['instances']:,} tiny instances, "
            f"<= 4 ranks and <= 6 sequences, every plan of any number of waves searched). ballast was exactly "
            f"optimal on {d['exactly_optimal']:.1%}; its step time over the optimum: 99th percentile "
            f"{q['0.99']:.4f}, 99.9th {q['0.999']:.4f}, worst {q['1.0']:.4f} ({d['above_3pct']} instances more "
            f"than 3% above). The best plan needed several waves on {d['multi_wave_optimum_share']:.1%} of them "
            f"(the best one-wave plan was up to {d['best_one_wave_over_optimum_max']:.2f}x slower). The search "
            f"does not remap; ballast remapped a long pole on {d['remapped']} instances and beat the search's "
            f"optimum so on {d['below_optimum_remapped']}.")


def replace(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(<!-- /results:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no <!-- results:{name} --> markers")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name in SETTINGS:
        if (RESULTS / f"simulate-{name}.json").exists():
            text = replace(text, f"simulate-{name}", simulated_table(name))
    for name in VIDEO:
        if (RESULTS / f"simulate-{name}.json").exists():
            text = replace(text, f"simulate-{name}", video_table(name))
    for name in CONTEXT_PARALLEL:
        if (RESULTS / f"simulate-{name}.json").exists():
            text = replace(text, f"simulate-{name}", context_parallel_table(name))
    for name in ROUTING:
        if (RESULTS / f"simulate-{name}-unrouted.json").exists():
            text = replace(text, f"simulate-{name}", routing_table(name))
    if (RESULTS / "measured.json").exists():
        text = replace(text, "measured", measured_table())
    if (RESULTS / "hf-llama.json").exists():
        text = replace(text, "hf", hf_table())
    if (RESULTS / "video-measured.json").exists():
        text = replace(text, "video-measured", video_measured_table())
    if (RESULTS / "peers-deepspeed.json").exists():
        text = replace(text, "peers", peers_table())
    if (RESULTS / "sweep.json").exists():
        text = replace(text, "sweep", sweep_text())
    if (RESULTS / "optimum-gap.json").exists():
        text = replace(text, "optimum-gap", optimum_gap_text())
    for name, block in PROFILE_RECORDS.items():
        if (RESULTS / f"profile-{name}-summary.json").exists():
            text = replace(text, block, profile_text(name))
    if (RESULTS / "latency.json").exists():
        text = replace(text, "latency", latency_table())
    readme.write_text(text)
    print("README.md results updated")


if __name__ == "__main__":
    main()
