#!/usr/bin/env bash
# route+ against a direct channel, interleaved: three `ordo-bench --serve` replicas on loopback,
# then per round one pipelined run (COUNT calls, 256 in flight) each over tcp:// to the first,
# route+tcp:// to the first alone, and route+tcp:// to all three; prints the medians of the
# calls/s and the ratios to direct. The servers run until this script's fd 3..5 close.
# Usage: bench/route_ratio.sh [path/to/ordo-bench] [rounds (5)] [count (300000)]
# With BASELINE=path/to/another/ordo-bench, each round also runs that binary's client over
# route+ to all three (route3-baseline): an interleaved A/B of two builds of the router.
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
rounds=${2:-5}
count=${3:-300000}
dir=$(mktemp -d)
base=$((30000 + RANDOM % 20000))
pids=()
for k in 0 1 2; do
    mkfifo "$dir/in$k"
    "$bin" --serve "tcp://127.0.0.1:$((base + k))" <"$dir/in$k" >/dev/null &
    pids+=($!)
done
exec 3>"$dir/in0" 4>"$dir/in1" 5>"$dir/in2"
cleanup() { exec 3>&- 4>&- 5>&-; wait "${pids[@]}" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
sleep 2
one="127.0.0.1:$base"
urls=("tcp://$one" "route+tcp://$one" "route+tcp://$one,127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))")
names=(direct route1 route3)
clients=("$bin" "$bin" "$bin")
if [ -n "${BASELINE:-}" ]; then
    urls+=("${urls[2]}")
    names+=(route3-baseline)
    clients+=("$BASELINE")
fi
for ((i = 0; i < rounds; ++i)); do
    for j in "${!names[@]}"; do
        rate=$("${clients[j]}" --workload pipelined --count "$count" --connect "${urls[j]}" 2>&1 |
            sed -n 's/.* = \([0-9]*\)\/s.*/\1/p' | tail -1)
        echo "${names[j]} ${rate:-0}" | tee -a "$dir/rates"
    done
done
/usr/bin/python3 - "$dir/rates" <<'PY'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    name, rate = line.split()
    rates.setdefault(name, []).append(float(rate))
med = {k: statistics.median(v) for k, v in rates.items()}
for k in rates:
    print(f"{k:15} median {med[k] / 1e6:.3f} M calls/s  ratio to direct {med[k] / med['direct']:.2f}x")
PY
