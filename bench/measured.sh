#!/usr/bin/env bash
# docs/results.md's measured numbers: `ballast bench` (every planner trains the tiny model on the same
# stdlib batches on 2 gloo ranks, interleaved per step, 3 rounds for the run-to-run noise; run
# twice), then the planners' latency (bench/latency.py), then docs/results.md.
#
# Usage: bench/measured.sh [--skip-latency]
# Cost model: a `ballast profile` of the tiny model up to MAX_LEN made here at its full depth
# (no extrapolation), right before the bench and so under the same load
# (bench/results/measured-profile.json; about 3 minutes), or PROFILE=path to reuse one.
# The machine is shared: each stage first waits (up to MAX_WAIT seconds) until fewer than
# QUIET_CORES cores were busy over 10 s; the JSON records the load and the ranks' CPU share.
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=bench/results
MAX_LEN=8192
mkdir -p "$OUT"

source bench/quiet.sh

if [ -z "${PROFILE:-}" ]; then
    PROFILE=$OUT/measured-profile.json
    wait_for_quiet
    $BALLAST profile --model tiny --world 2 --max-len $MAX_LEN --depths 4 --out "$PROFILE"
fi

# Twice: the second invocation (same profile, same batches) shows how far a rerun moves the
# numbers, beyond the spread of the rounds inside one run.
for RUN in measured measured-repeat; do
    wait_for_quiet
    $BALLAST bench --model tiny --data stdlib --world 2 \
        --planners static,batch-adaptive,bucket,megatron-dynamic-cp,dcp,flexsp,hydraulis,zeppelin,ballast \
        --max-len $MAX_LEN --tokens-per-step 16384 --steps 4 --warmup 1 --repeats 3 --time-limit 2 \
        --cost "$PROFILE" --json "$OUT/$RUN.json"
done

if [ "${1:-}" != "--skip-latency" ]; then
    wait_for_quiet
    $PYTHON bench/latency.py --out "$OUT/latency"
fi
$PYTHON bench/results_doc.py
