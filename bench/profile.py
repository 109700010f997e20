"""Record `ballast profile` on this machine: full and quick profiles of the tiny model on 2 gloo
ranks, the check of 30+ random plans against the full one, and a simulate run under it.

    .venv/bin/python bench/profile.py [--statistic median|min] [--device-memory 0.1] [--max-len 4096]

Writes bench/results/profile-tiny.json (the profile), profile-tiny-quick.json,
profile-tiny-check.{json,png}, profile-tiny-simulate.json and profile-summary.json (wall times,
fit residuals, extrapolation error, check errors against the targets, the load average seen by
each stage). Every stage is a subprocess of the real command line, timed from outside.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"check_time_median": 0.10, "check_time_p90": 0.20, "check_act_max": 0.10,
           "profile_seconds": 600.0, "quick_seconds": 180.0}


def ballast(*args: str) -> float:
    """Run `ballast ARGS` and return its wall time in seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ballast.cli", *args], check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statistic", choices=("median", "min"), default="median")
    parser.add_argument("--device-memory", default="0.1", help="GB per rank the plans must fit")
    parser.add_argument("--max-len", default="4096", help="longest sequence (stdlib files are split at it)")
    parser.add_argument("--plans", default="30")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    full, quick = RESULTS / "profile-tiny.json", RESULTS / "profile-tiny-quick.json"
    check, simulated = RESULTS / "profile-tiny-check.json", RESULTS / "profile-tiny-simulate.json"
    common = ["--model", "tiny", "--world", "2", "--device-memory", args.device_memory, "--max-len", args.max_len,
              "--statistic", args.statistic]
    load_before = os.getloadavg()[0]
    seconds = {"profile": ballast("profile", *common, "--out", str(full)),
               "quick": ballast("profile", *common, "--quick", "--out", str(quick)),
               "check": ballast("profile", "--check", str(full), "--plans", args.plans, "--lengths", "stdlib",
                                "--max-len", args.max_len, "--json", str(check),
                                "--png", str(RESULTS / "profile-tiny-check.png")),
               "simulate": ballast("simulate", "--cost", str(full), "--cluster", "cpu", "--world", "2",
                                   "--device-memory-gb", args.device_memory, "--model", "tiny", "--lengths", "stdlib",
                                   "--max-len", args.max_len, "--tokens-per-step", "16384", "--steps", "5",
                                   "--planners", "all", "--time-limit", "2", "--json", str(simulated))}
    profiled, quick_profile, checked = (json.loads(p.read_text()) for p in (full, quick, check))
    measured = {
        "check_time_median": checked["summary"]["time"]["median"], "check_time_p90": checked["summary"]["time"]["p90"],
        "check_act_max": checked["summary"]["act"]["max"], "profile_seconds": seconds["profile"],
        "quick_seconds": seconds["quick"]}
    summary = {
        "setting": {"model": "tiny", "world": 2, "lengths": "stdlib", "max_len": int(args.max_len),
                    "device_memory_gb": float(args.device_memory), "statistic": args.statistic,
                    "plans": int(args.plans)},
        "seconds": seconds, "load_average_before": load_before,
        "targets": {k: {"target": v, "measured": measured[k], "met": measured[k] <= v} for k, v in TARGETS.items()},
        "profile": {k: profiled["fit"][k] for k in ("residuals", "extrapolation_error", "load_average", "machine")},
        "quick": {k: quick_profile["fit"][k] for k in ("residuals", "extrapolation_error", "load_average")},
        "check": {k: checked[k] for k in ("summary", "load_average", "setting")},
        "coefficients": {k: profiled[k] for k in ("a", "b", "g", "recompute", "kept", "act_per_token",
                                                  "bandwidth", "comm_latency", "states")},
    }
    (RESULTS / "profile-summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary["targets"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
