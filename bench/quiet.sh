# Sourced by the measured benchmarks: wait until this shared machine is quiet before measuring.
# QUIET_CORES (default 0.3) and MAX_WAIT (seconds, default 900) set how quiet and how long.
QUIET_CORES=${QUIET_CORES:-0.3}
MAX_WAIT=${MAX_WAIT:-900}

busy_cores() {
    # Cores busy over the last 10 s, from /proc/stat (the load average lags by a minute).
    local a b
    a=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat)
    sleep 10
    b=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat)
    echo "$a $b" | awk -v cores="$(nproc)" '{ busy = $3 - $1; idle = $4 - $2; printf "%.2f", cores * busy / (busy + idle) }'
}

wait_for_quiet() {
    local waited=0 busy
    busy=$(busy_cores)
    while awk -v b="$busy" -v limit="$QUIET_CORES" 'BEGIN { exit !(b >= limit) }' && [ "$waited" -lt "$MAX_WAIT" ]; do
        sleep 5
        waited=$((waited + 15))
        busy=$(busy_cores)
    done
    echo "$busy cores busy (load average $(cut -d' ' -f1-3 /proc/loadavg)) after waiting ${waited} s for < $QUIET_CORES"
}
