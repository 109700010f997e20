"""The measured results' tables (`ballast bench` records on gloo ranks): every planner training the
tiny model (bench/measured.sh), a Hugging Face Llama (bench/hf.sh), a video DiT (bench/video_dit.sh)
and DeepSpeed-Ulysses' own code against ballast's runtime (bench/peers.sh)."""
from __future__ import annotations

from pathlib import Path

from record_files import RESULTS, commit_note, record, recorded

from ballast.profile.drift import how_much


def bench_rows(data: dict) -> list[str]:
    """One table row per planner of a `ballast bench` JSON, fastest first."""
    rows = ["| planner | tokens/s | vs static | paired | spread | step (s) | waves (s) | predicted (s) | error | "
            "error (whole step) | idle | plan ms | degrees | recomp |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for planner, p in sorted(data["planners"].items(), key=lambda kv: -kv[1]["tokens_per_s"]):
        # A record made before the bench composed steps from micro-batches has no whole-step error.
        whole = f"{p['prediction_error_step']:+.1%}" if "prediction_error_step" in p else "-"
        # records written before "checkpointed" was renamed "recomputed" carry the old key
        recomputed = p.get("recomputed", p.get("checkpointed"))
        rows.append(f"| {planner} | {p['tokens_per_s']:,.0f} | {p['vs_static']:.2f}x | {p['vs_static_paired']:.2f}x | "
                    f"{p['round_spread']:.1%} | {p['step_s']:.3f} | {p['waves_s']:.3f} | {p['predicted_s']:.3f} | "
                    f"{p['prediction_error']:+.1%} | {whole} | {p['idle_fraction']:.1%} | {p['plan_ms']:.1f} | "
                    f"{','.join(map(str, p['degrees']))} | {recomputed:.2f} |")
    return rows


def hf_table() -> str:
    """bench/hf.sh's recorded run: a tiny Hugging Face Llama, ballast against static at SP degree 2."""
    data = record("hf-llama")
    s, cost, load = data["setting"], data["cost_model"], data["load_average"]
    head = (f"**Measured** ({s['model']}: a transformers LlamaForCausalLM, on {s['world']} gloo ranks, {s['data']} "
            f"corpus, ~{s['tokens_per_step']:,} tokens/step, max-len {s['max_len']:,}, "
            f"{cost['device_memory_gb'] * 1e3:.1f} MB per rank; {cost['source']} cost model; {s['warmup']} warm-up + "
            f"{s['repeats']} rounds x {s['steps']} steps, interleaved; {data['seconds']:.0f} s wall{commit_note(data)}, load average "
            f"{load['min']:.1f}..{load['max']:.1f}; columns as in the measured table below):\n\n")
    return head + "\n".join(bench_rows(data))


VIDEO_SPEEDUP_TARGET = 1.3
"""The video-model issue's target: ballast >= 1.3x static (one SP degree for every clip)."""


def video_measured_table() -> str:
    """bench/video_dit.sh's recorded run: stdit-tiny on video-synthetic, every planner, and the
    200-step training run."""
    data = record("video-measured")
    s, cost, load, t = data["setting"], data["cost_model"], data["load_average"], data["targets"]
    clips = [n for b in data["batches"] if b["measured"] for n in b["lengths"]]
    head = (f"**Measured** ({s['model']} on {s['world']} gloo ranks, {data['data']}; ~{s['tokens_per_step']:,} "
            f"tokens/step ({len(clips) / max(1, sum(b['measured'] for b in data['batches'])):.0f} clips per step on "
            f"average, {min(clips)} to {max(clips):,} tokens each), max-len {s['max_len']:,}, "
            f"{cost['device_memory_gb'] * 1e3:.1f} MB per rank; {cost['source']} cost model; static at SP degree "
            f"{s['degree']}; {s['warmup']} warm-up + {s['repeats']} rounds x {s['steps']} steps, interleaved; "
            f"{data['seconds']:.0f} s wall{commit_note(data)}, load average {load['min']:.1f}..{load['max']:.1f}; columns as in the "
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
    if recorded("video-profile-check"):
        check = record("video-profile-check")
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
    if recorded("video-train-summary"):
        run = record("video-train-summary")
        text += (f"\n\nTraining (`ballast train --model stdit-tiny --data video-synthetic --world 2 --steps "
                 f"{run['steps']}`, {run['planner']} planner, {run['cost_model']} cost model): loss "
                 f"{run['loss_first']:.3f} -> {run['loss_last']:.3f}, {run['tokens_per_s']:,.0f} tokens/s, "
                 f"{run['step_time_s']:.2f} s per step.\n\n![stdit-tiny loss](../bench/results/video-train-loss.png)")
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
    data = record("peers-deepspeed")
    s, peer, load, mem = data["ballast_setting"], data["peer"], data["load_average"], data["memory"]
    engine = peer["engine"]
    ml = mem.get("load_average")
    mem_load = f" (load average {ml['min']:.1f}..{ml['max']:.1f})" if ml else ""
    head = (f"**Measured** ({s['model']} on {s['world']} gloo ranks, {s['data']} corpus, ~{s['tokens_per_step']:,} "
            f"tokens/step, max-len {s['max_len']:,}; DeepSpeed {peer['deepspeed']}: `DistributedAttention` at SP "
            f"degree {peer['sp_degree']}, engine with ZeRO stage {engine['zero_stage']}, fp32, "
            f"{engine['optimizer']}; {s['warmup']} warm-up + {s['repeats']} rounds x {s['steps']} steps, interleaved; "
            f"{data['seconds']:.0f} s wall{commit_note(data)}, load average {load['min']:.1f}..{load['max']:.1f} on "
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
    if recorded("peers-deepspeed-8gb"):
        d = record("peers-deepspeed-8gb")
        p, load = d["systems"], d["load_average"]
        agree = max(x["loss_vs_static"]["max_rel"] for x in p.values() if "loss_vs_static" in x)
        tail += (f"\n\nAt 8 GB per rank (`peers-deepspeed-8gb.json`, {d['seconds']:.0f} s{commit_note(d)}, load average "
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
    data = record("measured")
    s, cost, load = data["setting"], data["cost_model"], data["load_average"]
    noise, relative = data["noise"]["run_to_run"], data["noise"]["relative"]
    rows = bench_rows(data)
    lengths = [n for b in data["batches"] if b["measured"] for n in b["lengths"]]
    head = (f"**Measured** ({s['model']} on {s['world']} gloo ranks, {s['data']} corpus, ~{s['tokens_per_step']:,} "
            f"tokens/step, max-len {s['max_len']:,} ({sum(n == s['max_len'] for n in lengths)} of the {len(lengths)} "
            f"measured sequences are max-len chunks), {cost['device_memory_gb'] * 1e3:.1f} MB per rank; "
            f"{cost['source']} cost model; {s['warmup']} warm-up + {s['repeats']} rounds x {s['steps']} steps, "
            f"planners interleaved per step; {data['seconds']:.0f} s wall{commit_note(data)}, load average {load['min']:.1f}.."
            f"{load['max']:.1f} (median {load['median']:.1f}) on {load['cpus']} CPUs, ranks' CPU share "
            f"{data['noise']['cpu_share']:.0%}"
            + (f"; run-to-run noise of tokens/s {noise:.1%}, of speeds relative to static {relative:.1%}"
               if noise is not None else "") + "). tokens/s: per batch the median step time over rounds; "
            f"paired: median per-batch ratio to static's step; spread: of tokens/s over rounds; {error_text(data)}:\n\n")
    text = head + "\n".join(rows) + "\n\nTargets: " + "; ".join(target_lines(data["targets"])) + "."
    if recorded("measured-repeat"):
        text += "\n\n" + repeat_line(data, record("measured-repeat"))
    others = sorted(path for path in RESULTS.glob("measured-*.json")
                    if path.name != "measured-repeat.json" and not path.stem.endswith("-profile"))
    if others:
        text += "\n\nOther recorded runs of the same bench:\n\n" + "\n".join(f"- {other_line(path)}" for path in others)
    return text


def other_line(path: Path) -> str:
    """One line for another recorded `ballast bench` run: its setting and how ballast fared."""
    data = record(path.stem)
    s, ours, t = data["setting"], data["planners"]["ballast"], data["targets"]
    lengths = [n for b in data["batches"] if b["measured"] for n in b["lengths"]]
    worst = max(t["prediction"]["abs_errors"].values())
    return (f"`{path.name}` (max-len {s['max_len']:,}, ~{s['tokens_per_step']:,} tokens/step, "
            f"{sum(n == s['max_len'] for n in lengths)} of {len(lengths)} sequences max-len chunks; {data['seconds']:.0f} s{commit_note(data)}): "
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
    return (f"A second invocation (`measured-repeat.json`, {again['seconds']:.0f} s{commit_note(again)}, load average median "
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


def convergence_text() -> str:
    """bench/convergence.py: static at a fixed SP degree and ballast train the same model from one seed."""
    data = record("convergence")
    degrees = {name: ",".join(map(str, p["degrees"])) for name, p in data["planners"].items()}
    return (f"**Convergence** (`bench/convergence.py`: `ballast train {' '.join(data['setting'])}`, "
            f"{data['steps']} steps{commit_note(data)}): static at {' '.join(data['planner_flags']['static'])} "
            f"(degrees {degrees.get('static')}) and ballast (degrees {degrees.get('ballast')}) planned differently on "
            f"{data['steps_with_different_plans']} of {data['steps']} steps; their losses differ by at most "
            f"{data['max_relative_loss_difference']:.1e} relative.\n\n"
            f"![static and ballast loss curves from one seed](../bench/results/convergence.png)")
