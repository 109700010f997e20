#!/usr/bin/env bash
# Issue #53's simulated settings at the scale users train, every planner side by side at the same
# TP and PP degrees (the cost model prices a rank of the job mesh; every planner plans its pool):
#   P1  wikipedia lengths, Llama-3-70B on 256 H100s as TP 8 x PP 4 x a pool of 8, 128k max, 2M tokens a step
#   P2  the same with lognormal:8,1.5 lengths (documents of 3k tokens typically, up to 128k)
#   P3  wikipedia lengths, Llama-3-70B on 1,024 H100s as TP 8 x PP 4 x a pool of 32, 4,096 sequences a step
#   P4  wikipedia lengths, Llama-3-405B's shape on 2,304 H100s as TP 8 x PP 18 x a pool of 16, 8M tokens a step
#       (126 layers in 18 equal stages of 7: ballast cuts equal stages, so not Meta's PP 16 of 7 and 8
#       layers; at PP 7 or fewer a stage's ZeRO-1 states exceed an H100's 68 GB budget, and at PP 9 and
#       14 beside a pool of 16 at most 25k and 102k tokens fit a micro-batch, short of 128k)
# wikipedia: the raw lengths file where it is ($WIKIPEDIA, default ../shared/data/lengths/wikipedia.txt,
# read in place, never copied), else ballast's shipped histogram of it. Gantt charts of P1's first
# step for ballast and the two pipeline rivals show every stage and the bubble.
# Usage: bench/pipelines.sh [planners]   (default: all; flexsp's MILPs take most of the time)
#        SETTINGS="P4" bench/pipelines.sh   (some of the settings only; default P1 P2 P3 P4)
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
PLANNERS=${1:-all}
SETTINGS=${SETTINGS:-"P1 P2 P3 P4"}
WIKIPEDIA=${WIKIPEDIA:-../shared/data/lengths/wikipedia.txt}
if [[ -f $WIKIPEDIA ]]; then WIKI="file:$WIKIPEDIA"; else WIKI=wikipedia; fi
OUT=bench/results
mkdir -p "$OUT"
MAX=(--max-len 131072)
P1=(--lengths "$WIKI" --cluster h100-256 --model llama3-70b --tp 8 --pp 4 "${MAX[@]}" --tokens-per-step 2097152 --steps 10)
P2=(--lengths lognormal:8,1.5 --cluster h100-256 --model llama3-70b --tp 8 --pp 4 "${MAX[@]}" --tokens-per-step 2097152 --steps 10)
P3=(--lengths "$WIKI" --cluster h100-1024 --model llama3-70b --tp 8 --pp 4 "${MAX[@]}" --batch 4096 --steps 5)
P4=(--lengths "$WIKI" --cluster h100-2304 --model bench/data/llama3-405b.json --tp 8 --pp 18 "${MAX[@]}"
    --tokens-per-step 8388608 --steps 5)
for name in $SETTINGS; do
    declare -n setting=$name
    $BALLAST simulate "${setting[@]}" --planners "$PLANNERS" --json "$OUT/simulate-$name.json"
done
$BALLAST simulate "${P1[@]}" --steps 1 --planners ballast,megatron-dynamic-cp,wlb-llm \
    --gantt "$OUT/gantt-P1.png"
$PYTHON bench/results_doc.py
