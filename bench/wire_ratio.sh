#!/usr/bin/env bash
# ordo against raw TCP, interleaved: each round runs ordo-bench's oneway (1 M messages),
# pipelined (300 k calls) and seq (20 k calls) workloads once over ordo and once over raw TCP
# (--transport raw-tcp), each run starting its own server, and prints one line per run.
# Usage: bench/wire_ratio.sh [path/to/ordo-bench] [rounds (5)]. Ends with the medians per
# workload: rates, p50 latencies, and ordo's against raw TCP's.
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
rounds=${2:-5}
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for ((i = 0; i < rounds; ++i)); do
    for w in oneway pipelined seq; do
        case $w in oneway) n=1000000 ;; pipelined) n=300000 ;; seq) n=20000 ;; esac
        echo "ordo $w $("$bin" --workload $w --count $n 2>&1 | tail -1)" | tee -a "$lines"
        echo "raw  $w $("$bin" --workload $w --count $n --transport raw-tcp 2>&1 | tail -1)" |
            tee -a "$lines"
    done
done
/usr/bin/python3 - "$lines" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(ordo|raw)\s+(\w+) .*= (\d+)/s", line)
    if not m:
        continue
    runs.setdefault((m[1], m[2], "rate"), []).append(int(m[3]))
    p50 = re.search(r"p50 ([\d.]+) us", line)
    if p50:
        runs.setdefault((m[1], m[2], "p50"), []).append(float(p50[1]))
for w in ("oneway", "pipelined", "seq"):
    o, r = (statistics.median(runs[(k, w, "rate")]) for k in ("ordo", "raw"))
    out = f"{w:9} median ordo {o / 1e6:.2f} M/s, raw {r / 1e6:.2f} M/s: {o / r:.2f}x"
    if (("ordo", w, "p50")) in runs:
        op, rp = (statistics.median(runs[(k, w, "p50")]) for k in ("ordo", "raw"))
        out += f"; p50 ordo {op:.1f} us, raw {rp:.1f} us: {op / rp:.2f}x"
    print(out)
PY
