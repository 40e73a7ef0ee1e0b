#!/usr/bin/env bash
# Instruction counts of ordo's hot paths under callgrind (repeatable where wall clock is not):
#   pipelined client (100 k calls), one-way server (300 k messages), seq client and server
#   (20 k calls), and the pipelined client through route+ (100 k calls, one replica).
#   Usage: bench/callgrind_counts.sh [path/to/ordo-bench] (default build/bench/).
# AUTH=1: every connection authenticated (--auth-tokens on the server, ?token_file= on the
# client), to compare with the counts without.
# Compare two builds by running it with each binary; the totals are in the last lines.
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
out=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
serve_args=()
client_q=""
if [ "${AUTH:-0}" = 1 ]; then
    printf 'bench-token-0123456789 bench\n' >"$out/tokens"
    echo bench-token-0123456789 >"$out/token"
    chmod 600 "$out/tokens" "$out/token"
    serve_args=(--auth-tokens "$out/tokens")
    client_q="?token_file=$out/token"
fi
# The client's report (sorting its latencies, whose cost follows their spread) is not counted.
cg() { valgrind --tool=callgrind --toggle-collect='*::report(*' --collect-atstart=yes --callgrind-out-file="$out/$1.out" "${@:2}" >/dev/null 2>&1; }
total() { grep -h '^totals' "$out/$1.out" | awk '{print $2}'; }
# Each server runs until its stdin closes: fd 3 is a pipe this script holds open.
serve() {  # serve NAME PORT [callgrind]
    local fifo=$out/$1.in
    mkfifo "$fifo"
    if [ "${3:-}" = callgrind ]; then
        cg "$1" "$bin" --serve "tcp://127.0.0.1:$2" "${serve_args[@]}" <"$fifo" &
    else
        "$bin" --serve "tcp://127.0.0.1:$2" "${serve_args[@]}" <"$fifo" >/dev/null &
    fi
    exec 3>"$fifo"
    sleep 3
}
stop() { exec 3>&-; wait; }

serve plain $port; cg pipelined-client "$bin" --workload pipelined --count 100000 --connect "tcp://127.0.0.1:$port$client_q"; stop
port=$((port + 1)); serve oneway-server $port callgrind
"$bin" --workload oneway --count 300000 --connect "tcp://127.0.0.1:$port$client_q" >/dev/null; stop
port=$((port + 1)); serve seq-server $port callgrind
cg seq-client "$bin" --workload seq --count 20000 --connect "tcp://127.0.0.1:$port$client_q"; stop
# The pipelined client again, through a router (route+) over one server.
port=$((port + 1)); serve routed $port
cg route-pipelined-client "$bin" --workload pipelined --count 100000 \
    --connect "route+tcp://127.0.0.1:$port$client_q"; stop
for run in pipelined-client oneway-server seq-client seq-server route-pipelined-client; do
    printf '%-24s %s instructions\n' "$run" "$(total $run)"
done
rm -rf "$out"
