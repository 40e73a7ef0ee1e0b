#!/usr/bin/env bash
# What sharing a concurrency limit among callers costs one caller at steady load below capacity
# (issue 69's line), interleaved: per round, pipelined runs (300 k calls, echo a coroutine)
# against a server with `--concurrency adaptive`, its limit not shared and shared with a queue
# of 8 per caller (`--fair-queue 8`, server_options::shares). Prints the medians of the calls/s,
# their ratio and the median of each round's ratio; then callgrind's instruction counts of the
# server serving 100 k pipelined calls each way.
# Usage: bench/shares_ratio.sh [path/to/ordo-bench] [rounds (21)]
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
rounds=${2:-21}
rate() {
    "$bin" --workload pipelined --count 300000 --json --async-echo --concurrency adaptive "$@" |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["rate"])'
}
plain=() shared=()
# Odd rounds run the shared limit first, even rounds second: what runs second is often slower.
for i in $(seq 1 "$rounds"); do
    if [ $((i % 2)) = 1 ]; then
        shared+=("$(rate --fair-queue 8)")
        plain+=("$(rate)")
    else
        plain+=("$(rate)")
        shared+=("$(rate --fair-queue 8)")
    fi
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
counts=()
port=$((20000 + RANDOM % 20000))
for q in 0 8; do
    # The server under callgrind until its stdin (a pipe this script holds) closes; the client
    # outside it.
    mkfifo "$out/$q.in"
    valgrind --tool=callgrind --callgrind-out-file="$out/$q.out" "$bin" \
        --serve "tcp://127.0.0.1:$port" --async-echo --concurrency adaptive \
        --fair-queue "$q" <"$out/$q.in" >/dev/null 2>&1 &
    exec 3>"$out/$q.in"
    sleep 3
    "$bin" --workload pipelined --count 100000 --connect "tcp://127.0.0.1:$port" >/dev/null
    exec 3>&-
    wait
    counts+=("$(grep -h '^totals' "$out/$q.out" | awk '{print $2}')")
    port=$((port + 1))
done
python3 - "${plain[*]}" "${shared[*]}" "${counts[@]}" <<'PY'
import statistics as st
import sys

a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
print("calls/s, median of %d rounds: not shared %.0f, shared %.0f; ratio of medians %.3f, "
      "median of ratios %.3f" % (len(a), st.median(a), st.median(b), st.median(b) / st.median(a),
                                 st.median([y / x for x, y in zip(a, b)])))
i, j = int(sys.argv[3]), int(sys.argv[4])
print("callgrind, the server, 100 k calls: not shared %d, shared %d instructions: %+.2f%%"
      % (i, j, 100.0 * (j - i) / i))
PY
