#!/usr/bin/env bash
# The README's measured numbers: `ballast bench` (every planner trains the tiny model on the same
# stdlib batches on 2 gloo ranks, interleaved per step, 3 rounds for the run-to-run noise), then
# the planners' latency (bench/latency.py), then the README tables.
#
# Usage: bench/measured.sh [--skip-latency]
# Cost model: a `ballast profile` of the tiny model up to MAX_LEN made here at its full depth
# (no extrapolation), right before the bench and so under the same load
# (bench/results/measured-profile.json; about a minute), or
# PROFILE=path to reuse one. The machine is shared: each stage first waits (up to MAX_WAIT
# seconds) for the 1-minute load average to drop below QUIET_LOAD; the JSON records the load
# seen during the run.
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
QUIET_LOAD=${QUIET_LOAD:-1.5}
MAX_WAIT=${MAX_WAIT:-900}
OUT=bench/results
MAX_LEN=4096
mkdir -p "$OUT"

wait_for_quiet() {
    local waited=0
    while awk -v limit="$QUIET_LOAD" '{ exit !($1 >= limit) }' /proc/loadavg && [ "$waited" -lt "$MAX_WAIT" ]; do
        sleep 15
        waited=$((waited + 15))
    done
    echo "load average $(cut -d' ' -f1-3 /proc/loadavg) after waiting ${waited} s for < $QUIET_LOAD"
}

if [ -z "${PROFILE:-}" ]; then
    PROFILE=$OUT/measured-profile.json
    wait_for_quiet
    $BALLAST profile --model tiny --world 2 --max-len $MAX_LEN --depths 4 --out "$PROFILE"
fi

wait_for_quiet
$BALLAST bench --model tiny --data stdlib --world 2 \
    --planners static,batch-adaptive,bucket,megatron-dynamic-cp,dcp,flexsp,hydraulis,zeppelin,ballast \
    --max-len $MAX_LEN --tokens-per-step 16384 --steps 4 --warmup 1 --repeats 3 --time-limit 2 \
    --cost "$PROFILE" --json "$OUT/measured.json"

if [ "${1:-}" != "--skip-latency" ]; then
    wait_for_quiet
    $PYTHON bench/latency.py --out "$OUT/latency"
fi
$PYTHON bench/readme_tables.py
