#!/usr/bin/env bash
# `ordo gateway` with curl, as a user would try it: curl --json '[41]' .../inc prints 42; an error's
# status and body; a stream's lines; /-/routes; and a bad --listen or --to exits 1 with a line.
set -u
ordo=$1
server=$2
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v curl >/dev/null || fail "curl is not installed (apt-get install curl)"

# Two servers: the gateway's, whose context method calls context on the second from inside its
# handler; both record spans of every trace.
"$server" --listen tcp://127.0.0.1:0 --trace-sample 1 >"$dir/second" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$dir/second" && break; sleep 0.1; done
second=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/second" | head -1)
[ -n "$second" ] || fail "ordo-inc-server did not start: $(cat "$dir/second")"
"$server" --listen tcp://127.0.0.1:0 --trace-sample 1 --next "$second" >"$dir/srv" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$dir/srv" && break; sleep 0.1; done
url=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/srv" | head -1)
[ -n "$url" ] || fail "ordo-inc-server did not start: $(cat "$dir/srv")"
"$ordo" gateway --listen http://127.0.0.1:0 --to "route+$url" >"$dir/gw" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$dir/gw" && break; sleep 0.1; done
http=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$dir/gw" | head -1)
[ -n "$http" ] || fail "the gateway did not start: $(cat "$dir/gw")"

out=$(curl -s --json '[41]' "$http/inc") || fail "curl failed"
[ "$out" = 42 ] || fail "curl --json '[41]' $http/inc printed '$out'"
# A body that is not labelled JSON (curl -d sends a form) is refused: a page of another origin
# can post a form without asking.
out=$(curl -s -o "$dir/body" -w '%{http_code}' -d '[41]' "$http/inc")
[ "$out" = 415 ] || fail "curl -d (a form) answered $out: $(cat "$dir/body")"
out=$(curl -s -o "$dir/body" -w '%{http_code}' --json '[1]' "$http/nope")
[ "$out" = 404 ] || fail "/nope answered $out"
grep -q '"code":"method_not_found"' "$dir/body" || fail "/nope body: $(cat "$dir/body")"
out=$(curl -s -o "$dir/body" -w '%{http_code}' --json '[2000]' "$http/sleep_ms?relative_slo_ms=20")
[ "$out" = 504 ] || fail "sleep_ms over its SLO answered $out: $(cat "$dir/body")"
out=$(curl -s -o "$dir/body" -w '%{http_code}' --json '[1]' "$http/inc?relative_slo_ms=-1")
[ "$out" = 400 ] || fail "a negative SLO answered $out"
out=$(curl -s -N --json 4 "$http/count_to" | tr '\n' ' ')
[ "$out" = "0 1 2 3 " ] || fail "count_to 4 streamed '$out'"
# Client and two-way streams: an NDJSON body's lines are the items (docs/gateway.md).
out=$(seq 1 100 | curl -s -H 'Content-Type: application/x-ndjson' --data-binary @- "$http/sum")
[ "$out" = 5050 ] || fail "seq 1 100 | curl .../sum printed '$out'"
out=$(printf '1\n2\n3\n' | curl -s -N -H 'Content-Type: application/x-ndjson' --data-binary @- \
    "$http/scale?params=%5B2%5D" | tr '\n' ' ')
[ "$out" = "2 4 6 " ] || fail "printf '1\\n2\\n3\\n' | curl .../scale?params=[2] printed '$out'"
curl -s "$http/-/routes" | grep -q '"method":"count_to","params":"(int)","path":"/count_to","shape":"stream","stream":true' ||
    fail "/-/routes: $(curl -s "$http/-/routes")"
# The call's context (docs/protocol.md, "Call context"): a W3C traceparent and the SLO reach the
# handler (ordo-inc-server's context method) through the gateway and its router; a malformed
# traceparent is dropped.
tp=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
out=$(curl -s -H "traceparent: $tp" --json '[]' "$http/context?relative_slo_ms=500")
echo "$out" | grep -q '"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"' || fail "context: $out"
left=$(echo "$out" | grep -o '"deadline_left_ms":[0-9]*' | head -1 | cut -d: -f2)
[ -n "$left" ] && [ "$left" -gt 0 ] && [ "$left" -le 500 ] || fail "deadline left: $out"
# The nested call: the same trace, and what is left of the deadline.
echo "$out" | grep -q '"next":{"deadline_left_ms":[0-9]*,"metadata":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-[0-9a-f]*-01"},"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}' ||
    fail "the nested call's context: $out"
# Read back with `ordo traces` from both servers: one tree, the replica's span a child of the
# caller's traceparent, the second server's a child of the replica's handler.
tr=$("$ordo" traces "$url" "$second" --trace 4bf92f3577b34da6a3ce929d0e0e4736) || fail "ordo traces: $tr"
echo "$tr" | grep -q '^trace 4bf92f3577b34da6a3ce929d0e0e4736: 2 spans from 2 servers$' || fail "traces: $tr"
echo "$tr" | grep -q '^00f067aa0ba902b7 (not recorded here)$' || fail "traces: $tr"
first=$(echo "$tr" | grep "^└─ server context  ok .*parent 00f067aa0ba902b7, at $url, ")
span1=$(echo "$first" | grep -o 'span [0-9a-f]\{16\}' | cut -d' ' -f2)
[ -n "$span1" ] || fail "no span of the replica: $tr"
echo "$tr" | grep -q "^   └─ server context  ok .*parent $span1, at $second, " || fail "traces: $tr"
out=$("$ordo" traces "$url" --slowest 1)
echo "$out" | grep -q "^trace 4bf92f3577b34da6a3ce929d0e0e4736  server context  ok .*span $span1" ||
    fail "traces --slowest 1: $out"
out=$(curl -s -H "traceparent: 00-$tp" --json '[]' "$http/context")
echo "$out" | grep -q '4bf92f3577b34da6a3ce929d0e0e4736' && fail "bad traceparent: $out"
echo "$out" | grep -q '"metadata":{},"next":{"deadline_left_ms":[0-9]*,"metadata":{},"trace_id":null},"trace_id":null' || fail "bad traceparent: $out"
out=$(curl -s -o /dev/null -w '%{http_code}' --json 5 "$http/add?notify=1")
[ "$out" = 202 ] || fail "a notification answered $out"

"$ordo" gateway --listen http://127.0.0.1:0 --to tcp://127.0.0.1:1 >"$dir/o" 2>&1
[ $? = 1 ] || fail "a gateway to a closed port did not exit 1"
grep -q 'ordo: gateway to tcp://127.0.0.1:1 failed: .*refused' "$dir/o" || fail "$(cat "$dir/o")"
"$ordo" gateway --listen ftp://x --to "$url" >"$dir/o" 2>&1
[ $? = 1 ] || fail "a bad --listen did not exit 1"
grep -q 'must be http://HOST:PORT' "$dir/o" || fail "$(cat "$dir/o")"
echo "ok"
