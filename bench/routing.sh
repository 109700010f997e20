#!/usr/bin/env bash
# The routing issue's simulated settings (Zeppelin's routing layer over a NIC topology), recorded
# as JSON: every planner with routing on (zeppelin routes every wave whose all-to-alls cross
# nodes, ballast where that is faster; the others never route), then zeppelin and ballast with
# routing off, on the same batches.
#   R1  wikipedia lengths on an A800-like cluster: 8 GPUs and 4 NICs of 200 Gb/s per node, 64 GPUs
#   R2  the same on an H200-like cluster: 8 NICs of 400 Gb/s per node, 64 GPUs
#   R3  many short sequences (lognormal:6,1, 1M tokens a step) on the A800-like cluster
#   R4  the same on the H200-like cluster
# Usage: bench/routing.sh [planners]   (default: all; about 30 minutes, mostly flexsp's MILPs)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
PLANNERS=${1:-all}
OUT=bench/results
mkdir -p "$OUT"
R1=(--lengths wikipedia --cluster a800-64 --model gpt-7b --max-len 393216 --batch 512 --steps 10)
R2=(--lengths wikipedia --cluster h200-64 --model gpt-7b --max-len 393216 --batch 512 --steps 10)
R3=(--lengths lognormal:6,1 --cluster a800-64 --model gpt-7b --max-len 393216 --tokens-per-step 1048576 --steps 10)
R4=(--lengths lognormal:6,1 --cluster h200-64 --model gpt-7b --max-len 393216 --tokens-per-step 1048576 --steps 10)
for name in R1 R2 R3 R4; do
    declare -n setting=$name
    $BALLAST simulate "${setting[@]}" --planners "$PLANNERS" --json "$OUT/simulate-$name.json"
    $BALLAST simulate "${setting[@]}" --planners zeppelin,ballast --routing off --json "$OUT/simulate-$name-unrouted.json"
done
$PYTHON bench/results_doc.py
