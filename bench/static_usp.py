"""Add static USP (`static` with a fixed CP part, `PlannerOptions.cp`) to a `ballast simulate` JSON.

`ballast simulate --planners static --degree D --cp C` runs one such layout; a USP user picks
the fastest, so this tries them all through the Python API on the same batches `ballast
simulate` drew (same flags, same seed): every (degree, CP part) of --degrees x --cp-parts that
the model and cluster run is simulated (static's own rule, the least degree holding max-len,
would often pick degree 1 with full recomputation, which no USP user runs), and the fastest is
recorded as planner `static-usp` with its degree and CP part. The row joins OUT only when OUT
was simulated at this script's commit (its "provenance"), so a record never mixes code.

    python bench/static_usp.py OUT.json --degrees 8,16,32 --cp-parts 2,4,8,16 SIMULATE-FLAGS...
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from ballast.command_line.provenance import provenance
from ballast.vocabulary.cluster import get_cluster
from ballast.pricing.cost_sources import get_cost_model
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import get_length_source
from ballast.vocabulary.model_shape import get_model_shape
from ballast.simulate.command import add_arguments, planner_options
from ballast.simulate.side_by_side import simulate_planners


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="a `ballast simulate --json` file of the same flags, updated in place")
    p.add_argument("--degrees", default="8,16,32", help="static's degrees to try (comma-separated)")
    p.add_argument("--cp-parts", default="2,4,8,16", help="static's CP parts to try (comma-separated)")
    add_arguments(p)
    args = p.parse_args()
    data = json.loads(Path(args.out).read_text())
    commit = provenance()["commit"]
    if data.get("provenance", {}).get("commit") != commit:
        raise SystemExit(f"{args.out} was not simulated at this checkout's commit {commit}: simulate it again first")
    cluster = get_cluster(args.cluster, args.world, args.device_memory_gb)
    shape = get_model_shape(args.model)
    cost = get_cost_model(args.cost, shape, cluster, args.device_memory_gb)
    spec = BatchSpec(batch=args.batch, tokens_per_step=args.tokens_per_step, max_len=args.max_len,
                     overlong=args.overlong)
    stream = LengthStream(get_length_source(args.lengths, shape.video_geometry), spec, seed=args.seed)
    batches = [stream.next_batch() for _ in range(args.steps)]
    best = None
    layouts = [(int(d), int(cp)) for d in args.degrees.split(",") for cp in args.cp_parts.split(",")]
    for degree, cp in layouts:
        options = dataclasses.replace(planner_options(args), degree=degree, cp=cp)
        try:
            _, results = simulate_planners(batches, ["static"], cluster, cost, options)
        except ValueError as e:  # a layout this cluster and model cannot run, or max-len cannot fit
            print(f"static --degree {degree} --cp {cp}: {e}")
            continue
        summary = {**results["static"].summary(), "cp": cp, "degree": degree}
        print(f"static --degree {degree} --cp {cp}: {summary['step_time_s']:.3f} s per step")
        if best is None or summary["step_time_s"] < best["step_time_s"]:
            best = summary
    data["planners"]["static-usp"] = best
    Path(args.out).write_text(json.dumps(data, indent=2))
    print(f"wrote static-usp (cp {best['cp']}, degree {best['degree']}) into {args.out}")


if __name__ == "__main__":
    main()
