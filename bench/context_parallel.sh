#!/usr/bin/env bash
# The context-parallelism issue's simulated settings (all simulated), recorded as JSON:
#   CP1  Qwen2.5-7B's shape (28 heads: Ulysses stops at degree 4) on lognormal:8,1.6, h100-32,
#        and its 32-head twin (ballast alone), whose step CP1's ballast is measured against;
#   CP2  DCP's any-size video with wan-14b (40 heads: Ulysses stops at 8) on h200-32;
#   CP3  1M-token sequences: Qwen2.5-7B's shape on lognormal:8,2, h200-64, max-len 1048576.
# Static USP (static with a fixed CP part) is added by bench/static_usp.py through the Python API.
# Usage: bench/context_parallel.sh [planners]   (default: all; about 30 minutes, mostly flexsp's MILPs)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
PLANNERS=${1:-all}
OUT=bench/results
mkdir -p "$OUT"
CP1=(--lengths lognormal:8,1.6 --cluster h100-32 --model bench/data/qwen2.5-7b.json --max-len 262144 --batch 256 --steps 20)
TWIN=(--lengths lognormal:8,1.6 --cluster h100-32 --model bench/data/qwen2.5-7b-32-heads.json --max-len 262144 --batch 256 --steps 20)
CP2=(--lengths video --model wan-14b --cluster h200-32 --batch 256 --max-len 393216 --steps 5)
CP3=(--lengths lognormal:8,2 --cluster h200-64 --model bench/data/qwen2.5-7b.json --max-len 1048576 --batch 256 --steps 10)
$BALLAST simulate "${TWIN[@]}" --planners ballast --json "$OUT/simulate-CP1-32-heads.json"
for name in CP1 CP2 CP3; do
    declare -n setting=$name
    $BALLAST simulate "${setting[@]}" --planners "$PLANNERS" --json "$OUT/simulate-$name.json"
    $PYTHON bench/static_usp.py "$OUT/simulate-$name.json" "${setting[@]}" --degrees 8,16,32,64
done
$PYTHON bench/results_doc.py
