#!/usr/bin/env bash
# Runs the test suite RUNS times in a row while two busy loops occupy both cores: a suite that
# passes here does not fail on a loaded CI machine for timing alone.
#   tools/suite_under_load.sh [BUILD_DIR=build-release] [RUNS=5]
# Set up a release build first: meson setup build-release -Dbuildtype=release
# (GCC 12 at -O3 reports false -Wrestrict warnings in libstdc++'s string code: no -Dwerror).
# Prints one line a run and "N of RUNS runs passed"; exits 1 unless every run passed. The busy
# loops are this script's own children, stopped by PID after each run (and bounded in time).
set -u
dir=${1:-build-release}
runs=${2:-5}
passed=0
busy=()
stop_busy() {
    for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${busy[@]}"; do wait "$p" 2>/dev/null; done
    busy=()
}
trap stop_busy EXIT
ninja -C "$dir" >/dev/null || { echo "build failed in $dir"; exit 1; }
for run in $(seq 1 "$runs"); do
    for _ in 1 2; do
        timeout 3600 sh -c 'while :; do :; done' &
        busy+=("$!")
    done
    started=$(date +%s)
    if meson test -C "$dir" --no-rebuild --print-errorlogs >"$dir/under-load-$run.log" 2>&1; then
        passed=$((passed + 1))
        verdict=passed
    else
        verdict="FAILED (see $dir/under-load-$run.log)"
    fi
    stop_busy
    summary=$(grep -E '^(Ok|Fail|Timeout): ' "$dir/under-load-$run.log" | tr -s ' ' | tr '\n' ' ')
    echo "run $run: $verdict in $(( $(date +%s) - started )) s: $summary"
done
echo "$passed of $runs runs passed"
[ "$passed" = "$runs" ]
