#!/usr/bin/env bash
# Issue #53's simulated settings at the scale users train, every planner side by side at the same
# TP and PP degrees (the cost model prices a rank of the job mesh; every planner plans its pool):
#   P1  wikipedia lengths, Llama-3-70B on 256 H100s as TP 8 x PP 4 x a pool of 8, 128k max, 2M tokens a step
#   P2  the same with lognormal:8,1.5 lengths (documents of 3k tokens typically, up to 128k)
#   P3  wikipedia lengths, Llama-3-70B on 1,024 H100s as TP 8 x PP 4 x a pool of 32, 4,096 sequences a step
# (P4, Llama-3-405B's shape at TP 8 x PP 2, is gone: under PP the runtime shards with ZeRO-1, whose
# whole parameters and gradients of a 25e9-parameter stage exceed an H100, and its 126 layers
# allow no deeper power-of-two pipeline; the equal stages ballast cuts cannot take Meta's PP 16.)
# wikipedia: the raw lengths file where it is ($WIKIPEDIA, default ../shared/data/lengths/wikipedia.txt,
# read in place, never copied), else ballast's shipped histogram of it. Gantt charts of P1's first
# step for ballast and the two pipeline rivals show every stage and the bubble.
# Usage: bench/pipelines.sh [planners]   (default: all; flexsp's MILPs take most of the time)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
PLANNERS=${1:-all}
WIKIPEDIA=${WIKIPEDIA:-../shared/data/lengths/wikipedia.txt}
if [[ -f $WIKIPEDIA ]]; then WIKI="file:$WIKIPEDIA"; else WIKI=wikipedia; fi
OUT=bench/results
mkdir -p "$OUT"
MAX=(--max-len 131072)
P1=(--lengths "$WIKI" --cluster h100-256 --model llama3-70b --tp 8 --pp 4 "${MAX[@]}" --tokens-per-step 2097152 --steps 10)
P2=(--lengths lognormal:8,1.5 --cluster h100-256 --model llama3-70b --tp 8 --pp 4 "${MAX[@]}" --tokens-per-step 2097152 --steps 10)
P3=(--lengths "$WIKI" --cluster h100-1024 --model llama3-70b --tp 8 --pp 4 "${MAX[@]}" --batch 4096 --steps 5)
for name in P1 P2 P3; do
    declare -n setting=$name
    $BALLAST simulate "${setting[@]}" --planners "$PLANNERS" --json "$OUT/simulate-$name.json"
done
$BALLAST simulate "${P1[@]}" --steps 1 --planners ballast,megatron-dynamic-cp,wlb-llm \
    --gantt "$OUT/gantt-P1.png"
$PYTHON bench/results_doc.py
