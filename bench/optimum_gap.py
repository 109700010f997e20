"""ballast's plans against the exhaustive optimum on tiny instances (<= 4 ranks, <= 6 sequences).

The same instances the tests draw (`exhaustive_instances.py`, beside this script), many more of them: how
often ballast is exactly optimal, the distribution of its miss, and the worst instances, as
JSON. The test's MISS_BOUND (tests/planners/test_ballast.py) is set from this record.

    .venv/bin/python bench/optimum_gap.py --instances 20000 --json bench/results/optimum-gap.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings

from ballast.plans.exhaustive import brute_force, cluster_for, optimum
from ballast.command_line.provenance import provenance
from ballast.vocabulary.layouts import ANY_SPLIT
from ballast.planners import get_planner
from ballast.plans.timeline import step_time
from exhaustive_instances import tiny_instances

WORST_KEPT = 10


def measure(instances: int) -> dict:
    ratios, one_wave, worst, remapped = [], [], [], []

    # derandomize: the same instances on every run, so a record can be reproduced
    @settings(max_examples=instances, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(tiny_instances())
    def run(instance):
        cost, lengths = instance
        best = optimum(cost.under(ANY_SPLIT), lengths)
        plan = get_planner("ballast", cluster_for(cost), cost).plan(lengths)
        ratio = step_time(plan, cost) / best
        # The exhaustive search does not remap: only a remapped plan (a long pole's) may beat it.
        remapped.append(any(wave.remap for wave in plan.waves))
        assert ratio >= 1 - 1e-9 or remapped[-1], f"a plan beat the exhaustive optimum on {lengths}"
        ratios.append(ratio)
        one_wave.append(brute_force(cost.under(ANY_SPLIT), lengths)[0] / best)
        worst.append((ratio, lengths, cost.to_dict()))
        worst.sort(key=lambda w: -w[0])
        del worst[WORST_KEPT:]

    began = time.perf_counter()
    run()
    r, o = np.array(ratios), np.array(one_wave)
    return {
        "instances": len(r),
        "seconds": time.perf_counter() - began,
        "exactly_optimal": float(np.mean(r <= 1 + 1e-9)),
        "ratio_quantiles": {q: float(np.quantile(r, float(q))) for q in ("0.5", "0.9", "0.99", "0.999", "1.0")},
        "above_1pct": int(np.sum(r > 1.01)),
        "above_3pct": int(np.sum(r > 1.03)),
        "remapped": int(np.sum(remapped)),
        "below_optimum_remapped": int(np.sum(r < 1 - 1e-9)),
        "best_one_wave_over_optimum_max": float(o.max()),
        "multi_wave_optimum_share": float(np.mean(o > 1 + 1e-9)),
        "worst": [{"ratio": w[0], "lengths": w[1], "cost": w[2]} for w in worst],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=20000)
    parser.add_argument("--json", default="bench/results/optimum-gap.json")
    args = parser.parse_args()
    origin = provenance()
    result = measure(args.instances)
    Path(args.json).write_text(json.dumps({**result, "provenance": origin}, indent=1))
    q = result["ratio_quantiles"]
    print(f"{result['instances']} instances in {result['seconds']:.0f} s: exactly optimal on "
          f"{result['exactly_optimal']:.1%}; ratio to the optimum p99 {q['0.99']:.4f}, worst {q['1.0']:.4f}")


if __name__ == "__main__":
    main()
