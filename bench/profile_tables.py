"""The cost model's records (`bench/profile_record.py`): how fast a profile is and how well it
predicts real plans, per model; and the context-parallel profile's check."""
from __future__ import annotations

import statistics

from record_files import commit_note, record

STATISTIC_NAMES = {"median": "median", "min": "minimum"}
"""How the results name a profile's statistic over rounds (`profile.measure.STATISTICS`)."""


def profile_text(name: str) -> str:
    """`bench/profile_record.py`'s run: how fast the profile is and how well it predicts real plans."""
    data = record(f"profile-{name}-summary")
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
            f"budget; {s['attention_kernel']} attention kernel; commit {(data.get('provenance') or {}).get('commit') or s['commit']}; load average "
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



MESH_CHECKS = ("tp2", "pp2")
"""`bench/mesh_check.sh`'s checks of the tiny GPT's fresh profile on its 2 ranks as a job mesh."""
MESH_TARGETS = {"median": 0.03, "p90": 0.06}
"""The tiny GPT's text targets (`profile_record.py`'s defaults), which the mesh checks are held to."""


def mesh_check_table() -> str:
    """`bench/mesh_check.sh`: the profile's check with TP and PP plans, against the text targets."""
    rows = ["| mesh | plans | planners | step time median | p90 | max | activation median | max | targets |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    commits = set()
    for name in MESH_CHECKS:
        data = record(f"profile-tiny-mesh-check-{name}")
        s, t, a = data["setting"], data["summary"]["time"], data["summary"]["act"]
        commits.add(commit_note(data))
        met = t["median"] <= MESH_TARGETS["median"] and t["p90"] <= MESH_TARGETS["p90"]
        mesh = " x ".join(f"{k.upper()} {s[k]}" for k in ("tp", "pp") if s[k] > 1)
        rows.append(f"| {mesh} (a pool of 1) | {s['plans']} | {len(s['planners'])} | {t['median']:.1%} | "
                    f"{t['p90']:.1%} | {t['max']:.1%} | {a['median']:.1%} | {a['max']:.1%} | "
                    f"{'met' if met else '**not met**'} |")
    profile = record("profile-tiny-mesh")
    terms = profile["fit"]["tensor_parallel"]["2"]
    head = (f"The tiny GPT profiled afresh on 2 gloo ranks (`bench/mesh_check.sh`{''.join(sorted(commits))}; its TP "
            f"terms of degree 2 measured: the all-reduce at {terms['bandwidth'] / 1e9:.2f} GB/s and "
            f"{terms['latency'] * 1e3:.2f} ms a call, a TP rank's compute {terms['compute_factor']:.2f}x its "
            f"shard's share), then checked with random plans run on the same ranks as "
            f"the job mesh named, each against the text targets (median {MESH_TARGETS['median']:.0%}, 90th "
            f"percentile {MESH_TARGETS['p90']:.0%}):\n\n")
    return head + "\n".join(rows)
