#!/usr/bin/env bash
# What a call's trace context costs, interleaved (issue 53's lines): per round, one pipelined
# run (300 k calls) plain and one with a traceparent on every call; then one with 1,000 traces
# and no spans recorded and one with spans at 1%. Prints the medians of the calls/s, their
# ratio, and the median of each round's ratio.
# Usage: bench/trace_ratio.sh [path/to/ordo-bench] [rounds (21)]
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
rounds=${2:-21}
tp=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
rate() {
    "$bin" --workload pipelined --count 300000 --json "$@" |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["rate"])'
}
plain=() traced=() traces=() sampled=()
for _ in $(seq 1 "$rounds"); do
    plain+=("$(rate)")
    traced+=("$(rate --meta "traceparent=$tp")")
    traces+=("$(rate --traces 1000)")
    sampled+=("$(rate --traces 1000 --trace-sample 0.01)")
done
python3 - "${plain[*]}" "${traced[*]}" "${traces[*]}" "${sampled[*]}" <<'PY'
import statistics as st
import sys

def line(name, a, b):
    a = [float(x) for x in a.split()]
    b = [float(x) for x in b.split()]
    print("%-36s %9.0f %9.0f   ratio of medians %.3f   median of ratios %.3f"
          % (name, st.median(a), st.median(b), st.median(b) / st.median(a),
             st.median(y / x for x, y in zip(a, b))))

line("traceparent on every call vs plain", sys.argv[1], sys.argv[2])
line("spans at 1% vs none (1,000 traces)", sys.argv[3], sys.argv[4])
PY
