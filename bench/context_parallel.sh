#!/usr/bin/env bash
# The context-parallelism issue's simulated settings (all simulated), recorded as JSON:
#   CP1  Qwen2.5-7B's shape (28 heads: Ulysses stops at degree 4) on lognormal:8,1.6, h100-32,
#        and its 32-head twin (ballast alone), whose step CP1's ballast is measured against;
#   CP2  DCP's any-size video with wan-14b (40 heads: Ulysses stops at 8) on h200-32;
#   CP3  1M-token sequences: Qwen2.5-7B's shape on lognormal:8,2, h200-64, max-len 1048576.
# Static USP (static with a fixed CP part) is added by bench/static_usp.py through the Python API.
# The planners that run Ulysses alone cannot hold these settings' longest sequences at any degree
# the heads allow (28 and 40 heads; every token also holds the loss's fp32 logits), so the default
# is the planners that run CP, and each record names the others as left out, with the reason.
# Usage: bench/context_parallel.sh [planners]   (default: the CP planners; a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
PLANNERS=${1:-ballast,megatron-dynamic-cp,zeppelin,wlb-llm}
LEFT_OUT="runs Ulysses alone, which cannot hold the setting's longest sequences at any degree the heads allow (ballast simulate names the limit); static-usp is static with a CP part"
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
    $PYTHON - "$OUT/simulate-$name.json" "$PLANNERS" "$LEFT_OUT" <<'PY'
import json, sys
from pathlib import Path
from ballast.planners import parse_planner_names
path, ran, why = Path(sys.argv[1]), set(parse_planner_names(sys.argv[2])), sys.argv[3]
left = {name: why for name in parse_planner_names("all") if name not in ran}
path.write_text(json.dumps({**json.loads(path.read_text()), **({"left_out": left} if left else {})}, indent=2))
PY
    $PYTHON bench/static_usp.py "$OUT/simulate-$name.json" "${setting[@]}" --degrees 8,16,32,64
done
$PYTHON bench/results_doc.py
