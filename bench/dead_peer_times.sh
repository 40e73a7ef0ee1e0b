#!/usr/bin/env bash
# How long ordo-inc-client takes to report "peer lost" after its server is killed (crash) or
# stopped (hang), with a given liveness timeout (default: the library's, 10 s).
#   bench/dead_peer_times.sh BUILD_DIR [LIVENESS_MS]
set -u
b=${1:-build}; l=${2:-}
flag=(); [ -n "$l" ] && flag=(--liveness-timeout-ms "$l")
for kind in crash hang; do
    out=$(mktemp)
    "$b/examples/ordo-inc-server" --listen tcp://127.0.0.1:0 >"$out" &
    srv=$!
    for _ in $(seq 50); do grep -q listening "$out" && break; sleep 0.1; done
    url=$(grep -o 'tcp://[0-9.:]*' "$out")
    "$b/examples/ordo-inc-client" --connect "$url" --calls 1000000000 --inflight 64 "${flag[@]}" 2>"$out.err" &
    cli=$!
    sleep 1
    t0=$(date +%s%N)
    if [ $kind = crash ]; then kill -KILL $srv; else kill -STOP $srv; fi
    wait $cli
    t1=$(date +%s%N)
    echo "$kind liveness=${l:-default}: $(( (t1 - t0) / 1000000 )) ms: $(cat "$out.err")"
    kill -CONT $srv 2>/dev/null; kill -KILL $srv 2>/dev/null; wait $srv 2>/dev/null
    rm -f "$out" "$out.err"
done
