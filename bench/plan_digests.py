"""Digest every plan of every deterministic planner on the recorded simulated settings.

A restructuring that must not change behaviour runs this before and after and compares the
two JSON files: equal digests mean byte-identical plans (`Plan.to_json`, with keys renamed since
the record spelled the old way: RENAMED_KEYS) and lower bounds.
flexsp is left out: it stops its MILPs at a wall clock, so its plans vary run to run.

    python bench/plan_digests.py OUT.json [SETTING ...] [--against BEFORE.json]
    (settings: A B C V1 V2 V3, V1-V3-as-lengths and P1-P3; --against names every plan that differs
    and exits 1 if one does)

bench/results/plan-digests.json is the record of the last restructuring's check.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.command_line.provenance import provenance
from ballast.pricing.cost_sources import get_cost_model
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import get_length_source
from ballast.vocabulary.model_shape import get_model_shape
from ballast.planners import get_planner, parse_planner_names
from ballast.vocabulary.samples import tokens
from ballast.simulate.command import add_arguments, planner_options
from ballast.simulate.side_by_side import lengths_only
from ballast.pricing.bounds import lower_bound

# The settings of bench/simulated.sh (A, B, C) and bench/video.sh (V1-V3), as simulate flags.
SETTINGS = {
    "A": "--lengths wikipedia --cluster a100-64 --model gpt-7b --max-len 393216 --batch 512 --steps 20",
    "B": "--lengths stdlib --cluster h100-32 --model llama3-8b --max-len 131072 --tokens-per-step 1048576 --steps 20",
    "C": "--lengths lognormal:7,1.6 --cluster h200-32 --model gpt-13b --max-len 262144 --batch 256 --steps 20",
    "V1": "--lengths video --model stdit3-1b --cluster h200-32 --batch 256 --max-len 393216 --steps 5",
    "V2": "--lengths video --model wan-1.3b --cluster h100-32 --batch 256 --max-len 393216 --steps 5",
    "V3": "--lengths videos:bench/data/panda70m-like.txt --model wan-14b --cluster h200-64 --batch 256 "
          "--max-len 393216 --steps 5",
}
SETTINGS.update({f"{name}-as-lengths": f"{SETTINGS[name]} --as-lengths" for name in ("V1", "V2", "V3")})
# bench/pipelines.sh's (wikipedia: the shipped histogram, so the digests do not depend on the raw file).
PIPELINES = "--model llama3-70b --tp 8 --pp 4 --max-len 131072"
SETTINGS.update({
    "P1": f"--lengths wikipedia --cluster h100-256 {PIPELINES} --tokens-per-step 2097152 --steps 5",
    "P2": f"--lengths lognormal:8,1.5 --cluster h100-256 {PIPELINES} --tokens-per-step 2097152 --steps 5",
    "P3": f"--lengths wikipedia --cluster h100-1024 {PIPELINES} --batch 4096 --steps 3",
})


# Plan JSON keys renamed since the recorded digests, new -> old: a plan's digest is taken over its
# JSON with these keys spelled the old way, so a rename alone leaves the digests equal and the
# record (bench/results/plan-digests.json) stays comparable.
RENAMED_KEYS = {"recompute": "checkpoint", "run_recompute": "run_checkpoint", "recompute_cap": "checkpoint_cap"}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def canonical(value):
    """`value` (parsed JSON) with every renamed key spelled the old way, key order kept."""
    if isinstance(value, dict):
        return {RENAMED_KEYS.get(k, k): canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def plan_text(plan_json: str) -> str:
    """A plan's JSON in canonical form: byte-equal to `plan_json` when no key was renamed."""
    return json.dumps(canonical(json.loads(plan_json)))


def setting_digests(flags: str) -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(flags.split())
    cluster = get_cluster(args.cluster, args.world, args.device_memory_gb)
    shape = get_model_shape(args.model)
    mesh = JobMesh.of(cluster, tp=args.tp, pp=args.pp, shape=shape)
    if (mesh.tp, mesh.pp) == (1, 1):
        cost = get_cost_model(args.cost, shape, cluster)
    else:  # a rank of the mesh prices plans over its pool, as simulate does
        cost = get_cost_model(args.cost, shape, cluster, args.device_memory_gb, args.sharding, mesh=mesh)
        cluster = mesh.pool_cluster(cluster)
    spec = BatchSpec(batch=args.batch, tokens_per_step=args.tokens_per_step, max_len=args.max_len,
                     overlong=args.overlong)
    stream = LengthStream(get_length_source(args.lengths, shape.video_geometry), spec, seed=args.seed)
    batches = [stream.next_batch() for _ in range(args.steps)]
    if args.as_lengths:  # plan as a length-only planner would (simulate --as-lengths)
        batches = [[tokens(x) for x in b] for b in batches]
        cost = lengths_only(cost)
    options = planner_options(args)
    out = {"lower_bounds": digest(json.dumps([lower_bound(cost, b) for b in batches])), "planners": {}}
    for name in parse_planner_names("all"):
        if name == "flexsp":
            continue
        planner = get_planner(name, cluster, cost, options)
        began = time.perf_counter()
        plans = [plan_text(planner.plan(b).to_json()) for b in batches]
        out["planners"][name] = {"plans": digest("\n".join(plans)),
                                 "plan_ms": (time.perf_counter() - began) * 1e3 / len(batches)}
        print(f"  {name}: {out['planners'][name]}", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("settings", nargs="*", default=list(SETTINGS))
    p.add_argument("--against", default=None, help="digests recorded before the change")
    args = p.parse_args()
    result = {"provenance": provenance()}
    for name in args.settings:
        print(name, file=sys.stderr)
        result[name] = setting_digests(SETTINGS[name])
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    if args.against:
        differ = differences(json.load(open(args.against)), result)
        print("\n".join(differ) or f"every plan and lower bound identical to {args.against}")
        sys.exit(1 if differ else 0)


def differences(before: dict, after: dict) -> list[str]:
    """The settings' lower bounds and planners' plans that differ between two records."""
    out = []
    for name in before.keys() & after.keys() & SETTINGS.keys():
        if before[name]["lower_bounds"] != after[name]["lower_bounds"]:
            out.append(f"{name}: lower bounds differ")
        for planner, digests in before[name]["planners"].items():
            if digests["plans"] != after[name]["planners"].get(planner, {}).get("plans"):
                out.append(f"{name}: {planner}'s plans differ")
    return out


if __name__ == "__main__":
    main()
