#!/usr/bin/env bash
# The planners issue's three simulated settings, every planner, recorded as JSON and Gantt PNGs.
# Usage: bench/simulated.sh [planners]   (default: all). About 30 minutes (flexsp's MILPs, 10-50 s a step).
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PLANNERS=${1:-all}
OUT=bench/results
mkdir -p "$OUT"
$BALLAST simulate --lengths wikipedia --cluster a100-64 --model gpt-7b --max-len 393216 \
    --batch 512 --steps 20 --planners "$PLANNERS" --json "$OUT/simulate-A.json" --gantt "$OUT/gantt-A.png"
$BALLAST simulate --lengths stdlib --cluster h100-32 --model llama3-8b --max-len 131072 \
    --tokens-per-step 1048576 --steps 20 --planners "$PLANNERS" --json "$OUT/simulate-B.json" --gantt "$OUT/gantt-B.png"
$BALLAST simulate --lengths lognormal:7,1.6 --cluster h200-32 --model gpt-13b --max-len 262144 \
    --batch 256 --steps 20 --planners "$PLANNERS" --json "$OUT/simulate-C.json" --gantt "$OUT/gantt-C.png"
.venv/bin/python bench/results_doc.py
