#!/usr/bin/env bash
# The shape-aware issue's simulated video settings V1-V3, every planner, each run twice: planned
# with the clips' shapes (the real cost), and planned as if every clip were a causal text
# sequence of its tokens (--as-lengths), both priced under the model's real attention pattern.
# Usage: bench/video.sh [planners]   (default: all; about 20 minutes, mostly flexsp's MILPs). JSON and
# Gantt charts in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PLANNERS=${1:-all}
OUT=bench/results
mkdir -p "$OUT"
V1=(--lengths video --model stdit3-1b --cluster h200-32 --batch 256 --max-len 393216)
V2=(--lengths video --model wan-1.3b --cluster h100-32 --batch 256 --max-len 393216)
V3=(--lengths videos:bench/data/panda70m-like.txt --model wan-14b --cluster h200-64 --batch 256 --max-len 393216)
for name in V1 V2 V3; do
    declare -n setting=$name
    $BALLAST simulate "${setting[@]}" --steps 5 --planners "$PLANNERS" \
        --json "$OUT/simulate-$name.json" --gantt "$OUT/gantt-$name.png"
    $BALLAST simulate "${setting[@]}" --steps 5 --planners "$PLANNERS" --as-lengths \
        --json "$OUT/simulate-$name-as-lengths.json"
done
.venv/bin/python bench/results_doc.py
