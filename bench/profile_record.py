"""Record `ballast profile` on this machine: full and quick profiles of a model (the tiny GPT, the
Hugging Face Llama of bench/hf.sh, or a video DiT) on 2 gloo ranks, the check of random plans
against the full one, and a simulate run under it.

    .venv/bin/python bench/profile_record.py [--model tiny] [--name tiny] [--median-target 0.03]
                                      [--p90-target 0.06] [--statistic median|min] [--repeats 3]
                                      [--device-memory-gb 0.1] [--max-len 4096] [--tokens-per-step 16384]
                                      [--plans 30] [--runs 1] [--pause 20] [--quiet-cores 0.3] [--depths 1,2,4]

A text model's plans draw from `stdlib` (real code files); a video DiT's from the check's clip
source (DCP's video buckets scaled to --max-len), e.g. issue #31's video records:

    .venv/bin/python bench/profile_record.py --model dit-tiny --name dit-tiny --median-target 0.06 \
        --p90-target 0.10 --device-memory-gb 12 --max-len 2048 --tokens-per-step 8192 --plans 20 --repeats 5 \
        --statistic min

Writes bench/results/profile-NAME.json (the profile), profile-NAME-quick.json,
profile-NAME-check.{json,png}, profile-NAME-simulate.json (text models) and profile-NAME-summary.json (wall
times, fit residuals, extrapolation error, check errors against the targets, the load average
and the ranks' share of a core in each stage, and which attention kernel the runtime used).
With --runs N the full profile and its check run N times in turn, the same code on the same
machine: the files above are the first run's, the summary holds every run's errors, and the
check's targets are judged on the median over runs (on a shared host one run's error moves by
more than the targets' width; see docs/results.md).
Every stage is a subprocess of the real command line, timed from outside. On a shared machine
each stage starts alike: after --pause seconds idle, once the cores busy over the last
BUSY_WINDOW seconds are fewer than --quiet-cores (waiting up to --max-wait seconds); the summary
records what it found. Alike, because a stage that starts the moment the one before it ends
runs on a machine still warm from it: when stages waited for the 1-minute load average instead
(which lags a minute behind), every profile started at once after a check and every check
after 15 s of idle, and each check's re-run of its profile's full-depth points came out 2% to
5.5% faster than the profile had measured them (the tiny Wan at 722aac3, three runs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ballast.command_line.provenance import provenance
from ballast.vocabulary.model_shape import get_model_shape
from ballast.models.kernels import varlen_attention
from ballast.profile.sources import default_source

RESULTS = Path(__file__).resolve().parent / "results"
# Issue #31's targets for the check on 2 gloo ranks besides the median's and the 90th
# percentile's (--median-target: 3% for the tiny GPT, 4% for the HF Llama, 6% for video DiTs;
# --p90-target: 6% text, 10% video); the profile's own wall times.
TARGETS = {"check_act_max": 0.10, "profile_seconds": 600.0, "quick_seconds": 180.0}


def attention_kernel() -> str:
    """`flash` if the runtime's CPU attention reaches a fused SDPA kernel (memory linear in
    tokens), else `math` (scores materialised: s^2 activation memory)."""
    q = torch.randn(64, 8, 16, requires_grad=True)
    k, v = (torch.randn(64, 4, 16, requires_grad=True) for _ in range(2))
    seen, stack = set(), [varlen_attention(q, k, v, (0, 64)).grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node.name() not in seen:
            seen.add(node.name())
            stack += [child for child, _ in node.next_functions]
    return "flash" if any("Flash" in name for name in seen) else "math"


BUSY_WINDOW = 5.0
"""Seconds over which `busy_cores` counts: the load average lags a minute behind."""


def busy_cores() -> float:
    """Cores busy over the last BUSY_WINDOW seconds, from /proc/stat (every process on the host)."""
    def ticks() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle and iowait
        return sum(fields[:8]) - idle, idle

    busy, idle = ticks()
    time.sleep(BUSY_WINDOW)
    busy_now, idle_now = ticks()
    return os.cpu_count() * (busy_now - busy) / max(1, (busy_now - busy) + (idle_now - idle))


def wait_for_quiet(pause: float, limit: float, max_wait: float) -> dict:
    """Sleep `pause` seconds, then until fewer than `limit` cores are busy (or `max_wait` passed)."""
    start = time.monotonic()
    time.sleep(pause)
    busy = busy_cores()
    while busy >= limit and time.monotonic() - start < max_wait:
        busy = busy_cores()
    return {"waited_s": time.monotonic() - start, "busy_cores_at_start": busy, "load_at_start": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a model preset (text or video DiT) or hf:PATH")
    parser.add_argument("--name", default="tiny", help="result files are profile-NAME*")
    parser.add_argument("--median-target", type=float, default=0.03, help="the check's median error to meet")
    parser.add_argument("--p90-target", type=float, default=0.06, help="the check's 90th percentile error to meet")
    parser.add_argument("--statistic", choices=("median", "min"), default="median")
    parser.add_argument("--repeats", default="3", help="measured rounds of the profile and of the check")
    parser.add_argument("--device-memory-gb", default="0.1", help="GB per rank the plans must fit")
    parser.add_argument("--max-len", default="4096", help="longest sequence (stdlib files are split at it)")
    parser.add_argument("--tokens-per-step", default="16384")
    parser.add_argument("--plans", default="30")
    parser.add_argument("--depths", default=None,
                        help="the full profile's depths, e.g. 1,2,4 (default: `ballast profile`'s); the quick one keeps its own")
    parser.add_argument("--runs", type=int, default=1, help="full profiles, each checked, in turn (see above)")
    parser.add_argument("--pause", type=float, default=20.0, help="idle seconds before every stage")
    parser.add_argument("--quiet-cores", type=float, default=0.3, help="start a stage below this many busy cores")
    parser.add_argument("--max-wait", type=float, default=1200.0, help="seconds to wait for it per stage")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    origin = provenance()
    lengths = default_source(get_model_shape(args.model))
    RESULTS.mkdir(exist_ok=True)
    out = {stage: RESULTS / f"profile-{args.name}{stage}.json" for stage in ("", "-quick", "-check", "-simulate")}
    common = ["--model", args.model, "--world", "2", "--device-memory-gb", args.device_memory_gb,
              "--max-len", args.max_len, "--statistic", args.statistic]
    rounds = ["--repeats", args.repeats]  # the profile's and the check's; the quick one keeps its own
    depths = ["--depths", args.depths] if args.depths else []

    def check(profile: Path, json_out: Path, png: Path) -> list[str]:
        return ["profile", "--check", str(profile), "--plans", args.plans, *rounds, "--lengths", lengths,
                "--max-len", args.max_len, "--tokens-per-step", args.tokens_per_step, "--json", str(json_out),
                "--png", str(png)]

    scratch = Path(tempfile.mkdtemp(prefix=f"profile-{args.name}-runs-")) if args.runs > 1 else None
    runs = [(out[""], out["-check"])] + [(scratch / f"run{k}.json", scratch / f"run{k}-check.json")
                                          for k in range(2, args.runs + 1)]
    stages = {
        "profile": ["profile", *common, *rounds, *depths, "--out", str(out[""])],
        "quick": ["profile", *common, "--quick", "--out", str(out["-quick"])],
        "check": check(out[""], out["-check"], RESULTS / f"profile-{args.name}-check.png"),
        "simulate": ["simulate", "--cost", str(out[""]), "--cluster", "cpu", "--world", "2", "--device-memory-gb",
                     args.device_memory_gb, "--model", args.model, "--lengths", lengths, "--max-len", args.max_len,
                     "--tokens-per-step", args.tokens_per_step, "--steps", "5", "--planners", "all",
                     "--time-limit", "2", "--json", str(out["-simulate"])]}
    if lengths == "video":
        # `simulate` draws the source's clips unscaled (up to 45 x 80 patches a frame): a
        # simulate record belongs to the text models, whose grids reach the source's lengths.
        del stages["simulate"]
    for k, (run_profile, run_check) in enumerate(runs[1:], start=2):
        stages[f"profile{k}"] = ["profile", *common, *rounds, *depths, "--out", str(run_profile)]
        stages[f"check{k}"] = check(run_profile, run_check, run_check.with_suffix(".png"))
    seconds, waits = {}, {}
    for stage, command in stages.items():
        waits[stage] = wait_for_quiet(args.pause, args.quiet_cores, args.max_wait)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ballast.cli", *command], check=True)
        seconds[stage] = time.perf_counter() - start
    loaded = [(json.loads(p.read_text()), json.loads(c.read_text())) for p, c in runs]
    (profiled, checked), quick = loaded[0], json.loads(out["-quick"].read_text())
    every = [run_errors(p, c, seconds["profile" if k == 1 else f"profile{k}"])
             for k, (p, c) in enumerate(loaded, start=1)]
    measured = {"check_time_median": statistics.median(r["time_median"] for r in every),
                "check_time_p90": statistics.median(r["time_p90"] for r in every),
                "check_act_max": checked["summary"]["act"]["max"],
                "profile_seconds": seconds["profile"], "quick_seconds": seconds["quick"]}
    summary = {
        "setting": {"model": args.model, "world": 2, "lengths": lengths, "max_len": int(args.max_len),
                    "tokens_per_step": int(args.tokens_per_step), "device_memory_gb": float(args.device_memory_gb),
                    "statistic": args.statistic, "repeats": int(args.repeats), "plans": int(args.plans),
                    "pause_s": args.pause, "quiet_cores": args.quiet_cores, "attention_kernel": attention_kernel(),
                    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                             text=True).stdout.strip()},
        "seconds": seconds, "waits_for_quiet": waits, "runs": every,
        "targets": {k: {"target": v, "measured": measured[k], "met": measured[k] <= v}
                    for k, v in {"check_time_median": args.median_target, "check_time_p90": args.p90_target,
                                 **TARGETS}.items()},
        "profile": {k: profiled["fit"][k] for k in ("residuals", "extrapolation_error", "held_out_error",
                                                    "residuals_by_kind", "load_average", "core_share", "machine")},
        "quick": {k: quick["fit"][k] for k in ("residuals", "extrapolation_error", "load_average", "core_share")},
        "check": {k: checked[k] for k in ("summary", "load_average", "core_share", "setting")},
        "coefficients": {k: profiled.get(k, 0.0) for k in (
            "a", "b", "g", "recompute", "recompute_attention", "span_seconds", "sample_seconds", "call_seconds",
            "rank_sample_seconds", "remap_per_token", "remap_latency", "kept", "act_per_token", "bandwidth", "comm_latency", "states")},
        "provenance": origin,
    }
    (RESULTS / f"profile-{args.name}-summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary["targets"], indent=2))
    return 0


def run_errors(profiled: dict, checked: dict, profile_seconds: float) -> dict:
    """One run's check errors (median and 90th percentile of |error|, the signed median, the
    machine's drift and the error with it divided out) and its held-out points' median."""
    summary, drift = checked["summary"], checked.get("drift")
    return {"time_median": summary["time"]["median"], "time_p90": summary["time"]["p90"],
            "time_step_median": summary["time_step"]["median"], "time_step_p90": summary["time_step"]["p90"],
            "signed_median": statistics.median(r["time_error"] for r in checked["plans"]),
            "drift": drift["ratio"] if drift else None,
            "drift_corrected_median": summary["time_drift_corrected"]["median"] if drift else None,
            "held_out_median": profiled["fit"]["held_out_error"]["time"]["median"],
            "profile_seconds": profile_seconds}


if __name__ == "__main__":
    sys.exit(main())
