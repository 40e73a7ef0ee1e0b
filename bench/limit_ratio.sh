#!/usr/bin/env bash
# What a concurrency limit costs at steady load below capacity, interleaved (issue 54's line):
# per round, pipelined runs (300 k calls) against a server with no limit and one with
# `--concurrency adaptive`, first with echo a coroutine (which the limit counts), then with echo
# a plain function (which it does not). Prints the medians of the calls/s, their ratio, and the
# median of each round's ratio.
# Usage: bench/limit_ratio.sh [path/to/ordo-bench] [rounds (21)]
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
rounds=${2:-21}
rate() {
    "$bin" --workload pipelined --count 300000 --json "$@" |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["rate"])'
}
async_none=() async_adaptive=() plain_none=() plain_adaptive=()
# Odd rounds run the limit first, even rounds second: what runs second is often slower.
for i in $(seq 1 "$rounds"); do
    if [ $((i % 2)) = 1 ]; then
        async_adaptive+=("$(rate --async-echo --concurrency adaptive)")
        async_none+=("$(rate --async-echo)")
        plain_adaptive+=("$(rate --concurrency adaptive)")
        plain_none+=("$(rate)")
    else
        async_none+=("$(rate --async-echo)")
        async_adaptive+=("$(rate --async-echo --concurrency adaptive)")
        plain_none+=("$(rate)")
        plain_adaptive+=("$(rate --concurrency adaptive)")
    fi
done
python3 - "${async_none[*]}" "${async_adaptive[*]}" "${plain_none[*]}" "${plain_adaptive[*]}" <<'PY'
import statistics as st
import sys

def line(name, a, b):
    a = [float(x) for x in a.split()]
    b = [float(x) for x in b.split()]
    print("%-34s %9.0f %9.0f   ratio of medians %.3f   median of ratios %.3f"
          % (name, st.median(a), st.median(b), st.median(b) / st.median(a),
             st.median([y / x for x, y in zip(a, b)])))

print("%-34s %9s %9s" % ("calls/s", "none", "adaptive"))
line("coroutine echo (counted)", sys.argv[1], sys.argv[2])
line("plain echo (not counted)", sys.argv[3], sys.argv[4])
PY
