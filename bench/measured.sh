#!/usr/bin/env bash
# The README's measured numbers: `ballast bench` (every planner trains the tiny model on the same
# stdlib batches on 2 gloo ranks, interleaved per step, 3 rounds for the run-to-run noise), then
# the planners' latency (bench/latency.py), then the README tables.
#
# Usage: bench/measured.sh [--skip-latency]
# Cost model: bench/results/profile-tiny.json (bench/profile_record.py) when it exists, else a
# `ballast profile --quick` made here (bench/results/measured-profile.json). The machine is
# shared: each stage first waits (up to MAX_WAIT seconds) for the 1-minute load average to drop
# below QUIET_LOAD; the JSON records the load seen during the run.
set -euo pipefail
cd "$(dirname "$0")/.."
BALLAST=${BALLAST:-.venv/bin/ballast}
PYTHON=${PYTHON:-.venv/bin/python}
QUIET_LOAD=${QUIET_LOAD:-1.5}
MAX_WAIT=${MAX_WAIT:-900}
OUT=bench/results
MAX_LEN=1024
mkdir -p "$OUT"

wait_for_quiet() {
    local waited=0
    while awk -v limit="$QUIET_LOAD" '{ exit !($1 >= limit) }' /proc/loadavg && [ "$waited" -lt "$MAX_WAIT" ]; do
        sleep 15
        waited=$((waited + 15))
    done
    echo "load average $(cut -d' ' -f1-3 /proc/loadavg) after waiting ${waited} s for < $QUIET_LOAD"
}

PROFILE=$OUT/profile-tiny.json
if [ ! -f "$PROFILE" ]; then
    PROFILE=$OUT/measured-profile.json
    wait_for_quiet
    $BALLAST profile --model tiny --world 2 --max-len $MAX_LEN --quick --out "$PROFILE"
fi

wait_for_quiet
$BALLAST bench --model tiny --data stdlib --world 2 \
    --planners static,batch-adaptive,bucket,megatron-dynamic-cp,dcp,flexsp,hydraulis,zeppelin,ballast \
    --max-len $MAX_LEN --tokens-per-step 8192 --steps 5 --warmup 1 --repeats 3 --time-limit 2 \
    --cost "$PROFILE" --json "$OUT/measured.json"

if [ "${1:-}" != "--skip-latency" ]; then
    wait_for_quiet
    $PYTHON bench/latency.py --out "$OUT/latency"
fi
$PYTHON bench/readme_tables.py
