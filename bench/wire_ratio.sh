#!/usr/bin/env bash
# ordo against raw TCP, interleaved: each round runs ordo-bench's oneway (1 M messages),
# pipelined (300 k calls) and seq (20 k calls) workloads once over ordo and once over raw TCP
# (--transport raw-tcp), each run starting its own server, and prints one line per run.
# Usage: bench/wire_ratio.sh [path/to/ordo-bench] [rounds (5)]; take the medians per line kind.
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
rounds=${2:-5}
for ((i = 0; i < rounds; ++i)); do
    for w in oneway pipelined seq; do
        case $w in oneway) n=1000000 ;; pipelined) n=300000 ;; seq) n=20000 ;; esac
        echo "ordo $w $("$bin" --workload $w --count $n 2>&1 | tail -1)"
        echo "raw  $w $("$bin" --workload $w --count $n --transport raw-tcp 2>&1 | tail -1)"
    done
done
