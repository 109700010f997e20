"""Issue #54's simulated record: Hydraulis' kind of setting, its heterogeneous strategies against the
best homogeneous (t, p) layout, and ballast on the same strategies. Simulated, not run.

Settings (Hydraulis' LLaMA 7B / 13B / 32B are FlexSP's GPT shapes here: the same layers, widths and
heads, a plain MLP instead of a gated one):
  H1  gpt-7b on 32 H100s, wikipedia lengths up to 32,768 tokens
  H2  gpt-13b on 32 H100s, lognormal:8,1.5 (web-like: 3k tokens typically, a long tail) up to 16,384
      (Hydraulis' 13B planner's)
  H3  gpt-30b (Hydraulis' 32B: 60 layers, hidden 6656) on 64 H100s, wikipedia lengths up to 8,192
  H4  H3's model and lengths on 1,024 H100s (Hydraulis' 32B planner's scale), 8 Mi tokens a step
each 512 Ki tokens a step (1 Mi on 64), STEPS steps. The longest lengths are what a pipeline of TP
up to a node (8) holds without recomputation, which Hydraulis runs none of (a (8,4) pipeline of the
30B holds 9,778 tokens; Hydraulis' own 32B planner reaches 32k with TP 16 across two nodes, which
ballast's TP, inside a node, does not take).

Per setting: the strategies Hydraulis' dynamic program proposes from the source's histogram
(`--strategy auto`), every planner of HETEROGENEOUS on them with full and sliced movement (train
runs sliced). Two homogeneous baselines:
  fixed_strategies  every (t, p) type as Hydraulis' homogeneous layout, world / (t p) replicas of
                    one rank each (the same canonical movement, sliced), planned by hydraulis (its
                    packing): Hydraulis' own kind of baseline;
  meshes            every job mesh (t, p, pool) whose states fit, its pool carved per step into
                    SP groups by every planner of HOMOGENEOUS, with ZeRO-1 over the pool (no
                    canonical movement): ballast's homogeneous machinery, a stronger baseline.
Writes bench/results/hydraulis.json.

Usage: .venv/bin/python bench/hydraulis_settings.py [H1,H2,H3]
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ballast.command_line.provenance import provenance
from ballast.dataset.length_stream import BatchSpec, LengthStream
from ballast.dataset.lengths import get_length_source
from ballast.planners import PlannerOptions
from ballast.planners.hydraulis_pool import auto_strategies, pipeline_types
from ballast.planners.strategy_prices import StrategyPrices
from ballast.pricing.coefficients import InfeasibleError
from ballast.pricing.cost_sources import get_cost_model
from ballast.pricing.parameter_movement import Movement
from ballast.simulate.side_by_side import simulate_planners
from ballast.simulate.strategies import simulate_strategy_planners
from ballast.vocabulary.cluster import get_cluster
from ballast.vocabulary.job_mesh import JobMesh
from ballast.vocabulary.model_shape import get_model_shape
from ballast.vocabulary.sharding import Sharding
from ballast.vocabulary.strategy import Strategy

STEPS = 4
HETEROGENEOUS = ("hydraulis", "ballast", "static")
HOMOGENEOUS = ("static", "megatron-dynamic-cp", "wlb-llm", "ballast")
WIKIPEDIA = os.environ.get("WIKIPEDIA", "../shared/data/lengths/wikipedia.txt")
WIKI = f"file:{WIKIPEDIA}" if Path(WIKIPEDIA).is_file() else "wikipedia"
SETTINGS = {
    "H1": ("gpt-7b", "h100-32", WIKI, 524288, 32768),
    "H2": ("gpt-13b", "h100-32", "lognormal:8,1.5", 524288, 16384),
    "H3": ("gpt-30b", "h100-64", WIKI, 1048576, 8192),
    "H4": ("gpt-30b", "h100-1024", WIKI, 8388608, 8192),
}


def run(name: str, origin: dict) -> dict:
    model, cluster_name, lengths, budget, max_len = SETTINGS[name]
    shape, cluster = get_model_shape(model), get_cluster(cluster_name)
    spec = BatchSpec(batch=None, tokens_per_step=budget, max_len=max_len, overlong="split")
    source = get_length_source(lengths)
    stream = LengthStream(source, spec, seed=0)
    batches = [stream.next_batch() for _ in range(STEPS)]
    histogram = LengthStream(source, BatchSpec(batch=100_000, tokens_per_step=None, max_len=max_len,
                                               overlong="split"), seed=1).next_batch()
    began = time.perf_counter()
    strategies = auto_strategies("analytic", shape, cluster, None, histogram)
    print(f"{name}: {len(strategies)} strategies in {time.perf_counter() - began:.1f} s: "
          + "; ".join(map(str, strategies)), flush=True)
    options = PlannerOptions(max_len=max_len)
    heterogeneous = {}
    for movement in Movement:
        prices = StrategyPrices(strategies, "analytic", shape, cluster, None, movement)
        results = simulate_strategy_planners(batches, list(HETEROGENEOUS), prices, options)
        heterogeneous[movement.value] = {planner: r.summary() for planner, r in results.items()}
        print(f"  {movement.value}: " + ", ".join(f"{p} {s['step_time_s']:.3f} s"
                                                  for p, s in heterogeneous[movement.value].items()), flush=True)
    fixed = {}
    for layout in pipeline_types("analytic", shape, cluster):
        strategy = Strategy((layout,) * (cluster.world_size // (layout.tp * layout.pp)))
        prices = StrategyPrices([strategy], "analytic", shape, cluster, None, Movement.SLICED)
        try:
            result = simulate_strategy_planners(batches, ["hydraulis"], prices, options)["hydraulis"]
        except (InfeasibleError, ValueError) as e:  # a batch's sequence no replica of this type holds
            fixed[f"{layout.tp}x{layout.pp}"] = {"error": str(e)}
            continue
        fixed[f"{layout.tp}x{layout.pp}"] = {"step_s": result.summary()["step_time_s"]}
    held = {k: v["step_s"] for k, v in fixed.items() if "step_s" in v}
    best_fixed = min(held, key=held.get)
    print(f"  best fixed strategy: {best_fixed} replicas, {held[best_fixed]:.3f} s", flush=True)
    homogeneous = {}
    for layout in pipeline_types("analytic", shape, cluster):
        mesh = JobMesh.of(cluster, tp=layout.tp, pp=layout.pp, shape=shape)
        try:
            cost = get_cost_model("analytic", shape, cluster, None, Sharding.ZERO1, mesh=mesh)
            _, results = simulate_planners(batches, list(HOMOGENEOUS), mesh.pool_cluster(cluster), cost, options)
        except (InfeasibleError, ValueError) as e:  # a layout whose ZeRO-1 states or sequences do not fit
            homogeneous[f"{layout.tp}x{layout.pp}"] = {"error": str(e)}
            continue
        homogeneous[f"{layout.tp}x{layout.pp}"] = {planner: r.summary()["step_time_s"] for planner, r in results.items()}
    fits = {mesh: times for mesh, times in homogeneous.items() if "error" not in times}
    best = {planner: min(((times[planner], mesh) for mesh, times in fits.items()), default=None)
            for planner in HOMOGENEOUS}
    ran = heterogeneous[Movement.SLICED.value]  # what train runs
    return {"provenance": origin, "seconds": time.perf_counter() - began,
            "setting": {"model": model, "cluster": cluster_name, "lengths": lengths, "tokens_per_step": budget,
                        "max_len": max_len, "steps": STEPS},
            "strategies": [s.to_list() for s in strategies], "heterogeneous": heterogeneous,
            "fixed_strategies": fixed, "best_fixed_strategy": {"layout": best_fixed, "step_s": held[best_fixed]},
            "hydraulis_vs_best_fixed_strategy": held[best_fixed] / ran["hydraulis"]["step_time_s"],
            "mesh_step_s": homogeneous,
            "best_mesh": {p: {"step_s": b[0], "mesh": b[1]} for p, b in best.items() if b},
            "hydraulis_vs_best_mesh_of_fixed_planners": min(b[0] for p, b in best.items() if b and p != "ballast")
            / ran["hydraulis"]["step_time_s"],
            "ballast_vs_hydraulis": ran["hydraulis"]["step_time_s"] / ran["ballast"]["step_time_s"]}


def main() -> None:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SETTINGS)
    out = Path("bench/results/hydraulis.json")
    record = json.loads(out.read_text()) if out.is_file() else {}
    origin = provenance()  # the code this process runs, whatever the tree becomes meanwhile
    record["provenance"] = origin  # the latest run's; each setting carries its own too (one may be re-run alone)
    for name in names:
        record[name] = run(name, origin)
        out.write_text(json.dumps(record, indent=1))
        r = record[name]
        print(f"{name}: hydraulis {r['hydraulis_vs_best_fixed_strategy']:.3f}x the best homogeneous strategy, "
              f"{r['hydraulis_vs_best_mesh_of_fixed_planners']:.3f}x the best mesh of a fixed planner; "
              f"ballast {r['ballast_vs_hydraulis']:.3f}x hydraulis", flush=True)


if __name__ == "__main__":
    main()
