"""ballast against every other planner on random settings: how often is it the fastest?

Settings A, B and C are three points; this draws `--settings` random ones (cluster kind and
size, model -- text decoders and video DiTs, the latter on clips --, length source, max-len,
batch) from a seed, simulates `--steps` batches of each
under every planner (flexsp with a short MILP time limit, or left out with --no-flexsp), and
records per setting each planner's tokens/s and ballast's ratio to the best other planner.
Writes JSON and a PNG of the ratios, and prints the settings where ballast is not the best.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import ballast
from ballast.command_line.provenance import provenance
from ballast.simulate import simulate_planners
from ballast.planners.fits import check_fits
from ballast.pricing.coefficients import InfeasibleError
from ballast.pricing.cost_sources import get_cost_model
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import get_length_source
from ballast.planners import PLANNERS, PlannerOptions

TIE = 0.01  # the planners issue counts ballast within 1% of a planner as a tie
PANDA_LIKE = "bench/data/panda70m-like.txt"  # bench/panda_like_clips.py; run from the repository root


def draw_setting(rng: random.Random) -> dict:
    devices = rng.choice((8, 16, 32, 64, 128))
    lengths = rng.choice(("wikipedia", "stdlib", "video",
                          f"lognormal:{rng.uniform(6, 9):.2f},{rng.uniform(0.8, 2.0):.2f}",
                          f"zipf:{rng.uniform(1.05, 1.6):.2f},64,{rng.choice((32768, 131072, 262144))}"))
    model = rng.choice(("gpt-7b", "gpt-13b", "gpt-30b", "llama3-8b", "stdit3-1b", "stdit3-5b", "wan-1.3b", "wan-14b"))
    if ballast.get_model_shape(model).attention != "causal":
        # Video DiTs train on clips: DCP's buckets or the Panda-70M-like list, as their shapes.
        lengths = rng.choice(("video", f"videos:{PANDA_LIKE}"))
    setting = {"cluster": f"{rng.choice(('a100', 'h100', 'h200'))}-{devices}", "model": model,
               "lengths": lengths, "max_len": rng.choice((32768, 65536, 131072, 262144, 393216))}
    if rng.random() < 0.5:
        setting["batch"] = devices * rng.choice((2, 4, 8, 16))
    else:
        setting["tokens_per_step"] = devices * rng.choice((8192, 16384, 32768, 65536))
    return setting


def run_setting(setting: dict, names: list[str], steps: int, seed: int, time_limit: float) -> dict | None:
    """Each planner's mean tokens/s and step time / lower bound; None if the model cannot hold max-len."""
    shape = ballast.get_model_shape(setting["model"])
    cluster = ballast.get_cluster(setting["cluster"])
    try:
        cost = ballast.get_cost_model("auto", shape, cluster)
        check_fits(cost, [setting["max_len"]])
    except InfeasibleError:
        return None
    spec = BatchSpec(batch=setting.get("batch"), tokens_per_step=setting.get("tokens_per_step"),
                     max_len=setting["max_len"])
    sampler = LengthStream(get_length_source(setting["lengths"], shape.video_geometry), spec, seed=seed)
    batches = [sampler.next_batch() for _ in range(steps)]
    options = PlannerOptions(max_len=setting["max_len"], seed=seed, time_limit=time_limit)
    _, results = simulate_planners(batches, names, cluster, cost, options)
    return {name: {k: r.summary()[k] for k in ("tokens_per_s", "vs_lower_bound", "plan_ms")}
            for name, r in results.items()}


def plot(rows: list[dict], names: list[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = sorted(r["ballast_vs_best_other"] for r in rows)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(1, len(ratios) + 1), ratios, marker="o", markersize=3, color="tab:red")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.0 - TIE, color="gray", linewidth=0.8, linestyle="--", label=f"tie ({TIE:.0%})")
    ax.set_xlabel("settings, sorted")
    ax.set_ylabel("ballast tokens/s / best other planner's")
    left_out = sorted(set(PLANNERS) - set(names))
    ax.set_title(f"ballast vs the best other planner on {len(rows)} random simulated settings"
                 + (f" ({', '.join(left_out)} left out)" if left_out else ""), fontsize=10, loc="left")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", type=int, default=60, help="random settings to draw (default 60)")
    parser.add_argument("--steps", type=int, default=3, help="batches per setting (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=2.0, help="flexsp's seconds per MILP (default 2)")
    parser.add_argument("--no-flexsp", action="store_true", help="leave flexsp out (its MILPs dominate the time)")
    parser.add_argument("--out", default="bench/results/sweep", help="writes OUT.json and OUT.png")
    args = parser.parse_args()

    names = [n for n in PLANNERS if not (args.no_flexsp and n == "flexsp")]
    rng = random.Random(args.seed)
    rows, began, origin = [], time.perf_counter(), provenance()
    while len(rows) < args.settings:
        setting = draw_setting(rng)
        planners = run_setting(setting, names, args.steps, args.seed, args.time_limit)
        if planners is None:
            continue
        others = {n: p["tokens_per_s"] for n, p in planners.items() if n != "ballast"}
        best_other = max(others, key=others.get)
        ratio = planners["ballast"]["tokens_per_s"] / others[best_other]
        rows.append({"setting": setting, "planners": planners, "best_other": best_other,
                     "ballast_vs_best_other": ratio})
        print(f"[{len(rows):3d}/{args.settings}] {ratio:.3f} vs {best_other:20s} {json.dumps(setting)}", flush=True)

    ratios = [r["ballast_vs_best_other"] for r in rows]
    summary = {"settings": len(rows), "steps": args.steps, "seed": args.seed, "time_limit": args.time_limit,
               "planners": names, "seconds": time.perf_counter() - began,
               "ballast_fastest_or_tied": sum(x >= 1 - TIE for x in ratios),
               "ballast_strictly_fastest": sum(x > 1 for x in ratios),
               "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
               "ballast_plan_ms_mean": statistics.fmean(r["planners"]["ballast"]["plan_ms"] for r in rows),
               "behind": [r for r in rows if r["ballast_vs_best_other"] < 1 - TIE]}
    left_out = {"left_out": {"flexsp": "--no-flexsp: its MILPs would take most of the sweep's time"}} if args.no_flexsp else {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows, **left_out, "provenance": origin}, indent=1))
    plot(rows, names, out.with_suffix(".png"))
    print(f"ballast fastest or within {TIE:.0%} of the fastest on {summary['ballast_fastest_or_tied']} of "
          f"{len(rows)} settings; worst ratio {summary['ratio_min']:.3f}, median {summary['ratio_median']:.3f}")


if __name__ == "__main__":
    main()
