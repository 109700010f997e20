#!/usr/bin/env bash
# The routing issue's simulated settings (Zeppelin's routing layer over a NIC topology), recorded
# as JSON: every planner with routing on (zeppelin routes every wave whose all-to-alls cross
# nodes, ballast where that is faster; the others never route), then zeppelin and ballast with
# routing off, on the same batches.
#   R1  wikipedia lengths on an A800-like cluster: 8 GPUs and 4 NICs of 200 Gb/s per node, 64 GPUs
#   R2  the same on an H200-like cluster: 8 NICs of 400 Gb/s per node, 64 GPUs
#   R3  many short sequences (lognormal:6,1, 1M tokens a step) on the A800-like cluster
#   R4  the same on the H200-like cluster
# flexsp is left out by default, and each routed record says why ("left_out"): flexsp never routes,
# and on R2 its planning ran over 30 minutes where its limit allows 50 s a step (one HiGHS MILP
# stuck in the presolve of a sub-MIP, which does not check the time limit).
# Usage: bench/routing.sh [planners]   (default: every planner but flexsp; a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
PLANNERS=${1:-static,batch-adaptive,bucket,megatron-dynamic-cp,wlb-llm,dcp,hydraulis,zeppelin,ballast}
LEFT_OUT="flexsp never routes, and on R2 its planning ran over 30 minutes where its limit allows 50 s a step (a HiGHS MILP stuck in a sub-MIP's presolve, which does not check the time limit)"
OUT=bench/results
mkdir -p "$OUT"
R1=(--lengths wikipedia --cluster a800-64 --model gpt-7b --max-len 393216 --batch 512 --steps 10)
R2=(--lengths wikipedia --cluster h200-64 --model gpt-7b --max-len 393216 --batch 512 --steps 10)
R3=(--lengths lognormal:6,1 --cluster a800-64 --model gpt-7b --max-len 393216 --tokens-per-step 1048576 --steps 10)
R4=(--lengths lognormal:6,1 --cluster h200-64 --model gpt-7b --max-len 393216 --tokens-per-step 1048576 --steps 10)
for name in R1 R2 R3 R4; do
    declare -n setting=$name
    $BALLAST simulate "${setting[@]}" --planners "$PLANNERS" --json "$OUT/simulate-$name.json"
    if [[ ",$PLANNERS," != *,flexsp,* && "$PLANNERS" != all ]]; then
        $PYTHON - "$OUT/simulate-$name.json" "$LEFT_OUT" <<'PY'
import json, sys
from pathlib import Path
path, why = Path(sys.argv[1]), sys.argv[2]
path.write_text(json.dumps({**json.loads(path.read_text()), "left_out": {"flexsp": why}}, indent=2))
PY
    fi
    $BALLAST simulate "${setting[@]}" --planners zeppelin,ballast --routing off --json "$OUT/simulate-$name-unrouted.json"
done
$PYTHON bench/results_doc.py
