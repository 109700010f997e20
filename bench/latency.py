"""Planning latency of every planner against batch size and cluster size, as JSON and a PNG.

Wikipedia lengths, GPT-7B with FlexSP's published coefficients, A100 clusters of 64 to 1024
devices (`a100-N`); the batch grows with the cluster, up to
4096 sequences on 1024 devices, the planners issue's scale target). Each point is the median
of `--repeats` plans of different batches; planners slower than `--slow` seconds on a point
are measured once and skipped at larger points.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

import ballast
from ballast.command_line.provenance import provenance
from ballast.pricing.cost_sources import published_cost
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import get_length_source
from ballast.planners import PLANNERS, PlannerOptions, get_planner
from ballast.plans.timeline import simulate

POINTS = ((64, 512), (128, 1024), (256, 2048), (1024, 4096))
MAX_LEN = 393216


def measure(devices: int, sequences: int, names: list[str], repeats: int, skip: set[str]) -> dict:
    cluster = ballast.get_cluster(f"a100-{devices}")
    cost = published_cost(ballast.get_model_shape("gpt-7b"), cluster)
    sampler = LengthStream(get_length_source("wikipedia"), BatchSpec(batch=sequences, max_len=MAX_LEN), seed=0)
    batches = [sampler.next_batch() for _ in range(repeats)]
    out = {}
    for name in names:
        if name in skip:
            continue
        planner = get_planner(name, cluster, cost, PlannerOptions(max_len=MAX_LEN))
        seconds, ratios = [], []
        for batch in batches[: 1 if name == "flexsp" else repeats]:
            begin = time.perf_counter()
            plan = planner.plan(batch)
            seconds.append(time.perf_counter() - begin)
            ratios.append(simulate(plan, cost, devices).vs_lower_bound)
        out[name] = {"plan_s": statistics.median(seconds), "vs_lower_bound": float(np.mean(ratios))}
        print(f"{devices:5d} devices {sequences:5d} seqs  {name:20s} {out[name]['plan_s'] * 1e3:9.1f} ms  "
              f"x{out[name]['vs_lower_bound']:.3f} LB", flush=True)
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    names = sorted({n for r in results for n in r["planners"]})
    for name in names:
        xs = [r["sequences"] for r in results if name in r["planners"]]
        ys = [r["planners"][name]["plan_s"] for r in results if name in r["planners"]]
        ax.plot(xs, ys, marker="o", label=name, linewidth=2.5 if name == "ballast" else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([r["sequences"] for r in results],
                  [f"{r['sequences']} seqs\n{r['devices']} GPUs" for r in results])
    ax.axhline(2.0, color="grey", linestyle=":", linewidth=1)
    ax.set_ylabel("planning time per step (s)")
    ax.set_title("Planner latency (2-core CPU; wikipedia lengths, GPT-7B, A100 clusters)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planners", default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow", type=float, default=30.0)
    parser.add_argument("--out", default="bench/results/latency")
    args = parser.parse_args()
    origin = provenance()
    names = list(PLANNERS) if args.planners == "all" else args.planners.split(",")
    results, skip = [], set()
    for devices, sequences in POINTS:
        planners = measure(devices, sequences, names, args.repeats, skip)
        skip |= {n for n, r in planners.items() if r["plan_s"] > args.slow}
        results.append({"devices": devices, "sequences": sequences, "planners": planners})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"points": results, "provenance": origin}, indent=2))
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
