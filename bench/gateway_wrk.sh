#!/usr/bin/env bash
# The HTTP gateway under wrk: `ordo gateway` -> route+ -> 3 ordo-inc-server replicas, all on
# loopback, started here and stopped by PID. Prints, one per line:
#   throughput: wrk -c CONNS -t 2 -d SECONDS, POST /inc with the body [41]   (requests/s, p50)
#   low load:   wrk -c 1 -t 1 -d LOW_SECONDS --latency                        (p50 over HTTP)
#   direct:     ordo-bench --workload seq over the same route+ URL            (p50 of an ordo call)
# usage: bench/gateway_wrk.sh ORDO INC_SERVER ORDO_BENCH [SECONDS=10] [CONNS=64] [LOW_SECONDS=5]
# AUTH=1: the replicas and the gateway authenticate (--auth-tokens), wrk sends a bearer token,
# and each caller's calls go upstream over a connection that presents it.
# A smoke run (the test suite): SECONDS=1 LOW_SECONDS=1; it checks that every request was
# answered 200 and that wrk ran, not the figures.
set -u
ordo=$1 server=$2 bench=$3 secs=${4:-10} conns=${5:-64} low=${6:-5}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v wrk >/dev/null || fail "wrk is not installed (apt-get install wrk)"

auth=() gw_auth=() bearer=() q=""
if [ "${AUTH:-0}" = 1 ]; then
    printf 'wrk-token-0123456789 wrk\ngateway-token-0123456789 gateway\n' >"$dir/tokens"
    echo gateway-token-0123456789 >"$dir/gw.token"
    chmod 600 "$dir/tokens" "$dir/gw.token"
    auth=(--auth-tokens "$dir/tokens")
    gw_auth=(--auth-tokens "$dir/tokens")
    bearer=(-H "Authorization: Bearer wrk-token-0123456789")
    q="&token_file=$dir/gw.token"
fi
items=()
for i in 1 2 3; do
    "$server" --listen tcp://127.0.0.1:0 "${auth[@]}" >"$dir/r$i" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q '^listening on ' "$dir/r$i" && break; sleep 0.1; done
    u=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/r$i" | head -1)
    [ -n "$u" ] || fail "replica $i did not start: $(cat "$dir/r$i")"
    items+=("${u#tcp://}")
done
route="route+tcp://$(IFS=,; echo "${items[*]}")?max_concurrent=64$q"
"$ordo" gateway --listen http://127.0.0.1:0 --to "$route" "${gw_auth[@]}" >"$dir/gw" 2>"$dir/gw.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$dir/gw" && break; sleep 0.1; done
http=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$dir/gw" | head -1)
[ -n "$http" ] || fail "the gateway did not start: $(cat "$dir/gw" "$dir/gw.err")"
[ "$(curl -s "${bearer[@]}" --json '[41]' "$http/inc")" = 42 ] || fail "curl --json '[41]' $http/inc did not print 42"

cat >"$dir/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "[41]"
wrk.headers["Content-Type"] = "application/json"
if os.getenv("BEARER") then wrk.headers["Authorization"] = "Bearer " .. os.getenv("BEARER") end
local non200 = 0
response = function(status, headers, body)
    if status ~= 200 or body ~= "42\n" then non200 = non200 + 1 end
end
done = function(summary, latency, requests)
    io.write(string.format("wrong: %d\n", summary.errors.status + non200))
end
LUA
# wrk's done() runs in its own Lua state, so `non200` there is 0; its summary.errors.status
# counts non-2xx statuses, and a wrong body is caught by the smoke test's curl above.
[ "${AUTH:-0}" = 1 ] && export BEARER=wrk-token-0123456789
wrk -c "$conns" -t 2 -d "${secs}s" --timeout 30s --latency -s "$dir/post.lua" "$http/inc" >"$dir/wrk" 2>&1 ||
    fail "wrk failed: $(cat "$dir/wrk")"
rps=$(awk '/^Requests\/sec/ {print $2}' "$dir/wrk")
p50=$(awk '$1 == "50%" {print $2}' "$dir/wrk")
wrong=$(awk '/^wrong:/ {print $2}' "$dir/wrk")
sockerr=$(grep -c 'Socket errors\|Non-2xx' "$dir/wrk")
[ -n "$rps" ] || fail "no Requests/sec from wrk: $(cat "$dir/wrk")"
[ "$wrong" = 0 ] && [ "$sockerr" = 0 ] || fail "errors under load: $(cat "$dir/wrk")"
echo "throughput: wrk -c $conns -t 2 -d ${secs}s: $rps requests/s, p50 $p50"

wrk -c 1 -t 1 -d "${low}s" --timeout 30s --latency -s "$dir/post.lua" "$http/inc" >"$dir/wrk1" 2>&1 ||
    fail "wrk -c 1 failed: $(cat "$dir/wrk1")"
echo "low load: wrk -c 1 -t 1 -d ${low}s: p50 $(awk '$1 == "50%" {print $2}' "$dir/wrk1"), $(awk '/^Requests\/sec/ {print $2}' "$dir/wrk1") requests/s"

count=$((low * 5000))
out=$("$bench" --workload seq --connect "$route" --count "$count" 2>&1) || fail "ordo-bench: $out"
echo "direct: ordo-bench --workload seq --count $count over route+: $out"
