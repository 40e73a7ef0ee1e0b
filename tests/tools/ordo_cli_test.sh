#!/usr/bin/env bash
# The ordo command against ordo-inc-server (and neovim, when installed): JSON in and out, plain
# words as strings, errors on stderr with exit status 1 naming the method and the peer,
# notifications that arrive, ping, streams printed one item a line, and --help.
set -u
ordo=$1
server=$2
metrics=${3:-no-metrics}  # "metrics": the server has --metrics (the Prometheus exporter)
dir=$(mktemp -d)
pid=
nvim_pid=
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    [ -n "$nvim_pid" ] && kill -9 "$nvim_pid" 2>/dev/null
    rm -rf "$dir"
}
fail() { echo "FAIL: $*"; cleanup; exit 1; }

metrics_flag=()
[ "$metrics" = metrics ] && metrics_flag=(--metrics 127.0.0.1:0)
"$server" --listen tcp://127.0.0.1:0 --listen "unix://$dir/s.sock" --listen zmq+tcp://127.0.0.1:0 \
    "${metrics_flag[@]}" >"$dir/out" 2>&1 &
pid=$!
for _ in $(seq 100); do [ "$(grep -c '^listening on ' "$dir/out")" = 3 ] && break; sleep 0.1; done
url=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/out" | head -1)
[ -n "$url" ] && [ "${url##*:}" != 0 ] || fail "no listening line with a real port: $(cat "$dir/out")"

out=$("$ordo" call "$url" inc 41) || fail "call inc: $out"
[ "$out" = 42 ] || fail "inc 41 printed '$out'"
json='{"a":[1,2.5,"x",null,true]}'
out=$("$ordo" call "$url" echo "$json") || fail "call echo: $out"
[ "$out" = "$json" ] || fail "echo printed '$out', expected '$json'"
out=$("$ordo" call "$url" echo -- -7) || fail "call echo -7: $out"
[ "$out" = -7 ] || fail "echo -7 printed '$out'"
out=$("$ordo" call "$url" echo 18446744073709551615) || fail "call echo uint64 max: $out"
[ "$out" = 18446744073709551615 ] || fail "echo uint64 max printed '$out'"
out=$("$ordo" call "$url" echo bob) || fail "call echo bob: $out"
[ "$out" = '"bob"' ] || fail "echo bob printed '$out'"
out=$("$ordo" call "unix://$dir/s.sock" echo '[1,{"k":"v"}]') || fail "unix echo: $out"
[ "$out" = '[1,{"k":"v"}]' ] || fail "unix echo printed '$out'"
zmq=$(grep -o 'zmq+tcp://127\.0\.0\.1:[0-9]*' "$dir/out")
out=$("$ordo" call "$zmq" echo '"z"') || fail "zmq+tcp echo: $out"
[ "$out" = '"z"' ] || fail "zmq+tcp echo printed '$out'"
out=$("$ordo" call "route+tcp://${url#tcp://}" inc 2) || fail "route inc: $out"
[ "$out" = 3 ] || fail "route inc printed '$out'"
out=$("$ordo" call "$url?mode=pooled" inc 1) || fail "pooled inc: $out"
[ "$out" = 2 ] || fail "pooled inc printed '$out'"
out=$("$ordo" call --raw "$url" echo '"x"') || fail "call --raw: $out"
[ "$out" = '"x"' ] || fail "--raw printed '$out'"

err=$("$ordo" call "$url" nope 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *nope* ]] && [[ "$err" == *"${url#tcp://}"* ]] ||
    fail "unknown method: rc=$rc $err"
err=$("$ordo" call --timeout 200 "$url" sleep_ms 2000 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *sleep_ms*"timed out"* ]] || fail "timeout: rc=$rc $err"

# Streams: one item a line; a batch stream too; over a pool and a router; closing the output
# cancels the stream (the server counts the handler cancelled) and ordo exits 0.
out=$("$ordo" call "$url" count_to 4) || fail "count_to: $out"
[ "$out" = "$(printf '0\n1\n2\n3')" ] || fail "count_to 4 printed '$out'"
out=$("$ordo" call "$url" count_batch 3) || fail "count_batch: $out"
[ "$out" = "$(printf '0\n1\n2')" ] || fail "count_batch 3 printed '$out'"
out=$("$ordo" call "$url?mode=pooled" count_to 2) || fail "pooled count_to: $out"
[ "$out" = "$(printf '0\n1')" ] || fail "pooled count_to 2 printed '$out'"
out=$("$ordo" call "route+tcp://${url#tcp://}" count_to 2) || fail "routed count_to: $out"
[ "$out" = "$(printf '0\n1')" ] || fail "routed count_to 2 printed '$out'"
out=$(timeout 60 bash -c "'$ordo' call '$url' count_to 2000000000 | head -3"); rc=$?
[ $rc = 0 ] && [ "$out" = "$(printf '0\n1\n2')" ] || fail "count_to | head -3: rc=$rc '$out'"
cancelled=0
for _ in $(seq 100); do
    cancelled=$("$ordo" stats "$url" | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["methods"]["count_to"]["errors"].get("cancelled", 0))')
    [ "$cancelled" -ge 1 ] && break
    sleep 0.1
done
[ "$cancelled" -ge 1 ] || fail "count_to | head -3 did not cancel the stream on the server"
err=$("$ordo" call --stream "$url" inc 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *"does not stream"* ]] || fail "--stream on inc: rc=$rc $err"
out=$("$ordo" call --stream "$url" count_to 1) || fail "--stream count_to: $out"
[ "$out" = 0 ] || fail "--stream count_to 1 printed '$out'"

before=$("$ordo" call "$url" total) || fail "total: $before"
"$ordo" notify "$url" add 5 || fail "notify add 5"
after=$("$ordo" call "$url" total) || fail "total: $after"
[ "$after" = $((before + 5)) ] || fail "total went from $before to $after after notify add 5"
"$ordo" notify "$url?mode=pooled" add 2 || fail "pooled notify add 2"
after2=$("$ordo" call "$url" total) || fail "total: $after2"
[ "$after2" = $((after + 2)) ] || fail "total went from $after to $after2 after pooled notify"

out=$("$ordo" ping "$url") || fail "ping: $out"
[[ "$out" =~ ^ok\ [0-9]+\.[0-9]+$ ]] || fail "ping printed '$out'"

# ordo.health: the word, and the exit status an exec probe reads (0 only for serving).
out=$("$ordo" health "$url") || fail "health: $out"
[ "$out" = serving ] || fail "health printed '$out'"
if out=$("$ordo" health "$url" nosuch 2>&1); then fail "health of an unknown service exited 0: $out"; fi
grep -q 'no service "nosuch"' <<<"$out" || fail "health nosuch printed '$out'"
if out=$("$ordo" health tcp://127.0.0.1:1 --timeout 2000 2>&1); then
    fail "health of a closed port exited 0: $out"
fi

# ordo.methods: one method a line, with its parameter types.
out=$("$ordo" methods "$url") || fail "methods: $out"
grep -qx 'inc(int)' <<<"$out" || fail "methods did not list inc(int): '$out'"
grep -qx 'echo(msgpack::v2::object)\|echo(.*object)' <<<"$out" || fail "methods did not list echo: '$out'"

# ordo.stats: the server's counters as JSON, with the calls made above.
out=$("$ordo" stats "$url") || fail "stats: $out"
python3 - "$out" <<'PY' || fail "stats printed: $out"
import json, sys
s = json.loads(sys.argv[1])
assert s["methods"]["inc"]["requests"] >= 3, s["methods"]["inc"]
assert s["unknown_requests"] >= 1, s
assert s["server"]["connections"] >= 1 and s["server"]["bytes_received"] > 0, s["server"]
PY

# Prometheus: the request counter and the latency histogram move between two scrapes.
if [ "$metrics" = metrics ]; then
    murl=$(grep -o 'http://127\.0\.0\.1:[0-9]*/metrics' "$dir/out")
    [ -n "$murl" ] || fail "no 'metrics on' line: $(cat "$dir/out")"
    scrape() { python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())' "$murl"; }
    value() { grep -F "$1 " <<<"$2" | awk '{print $2}'; }
    m1=$(scrape) || fail "scrape $murl"
    "$ordo" call "$url" inc 1 >/dev/null && "$ordo" call "$url" inc 2 >/dev/null || fail "inc for metrics"
    m2=$(scrape) || fail "scrape $murl"
    for series in 'ordo_server_requests_total{method="inc",code="ok"}' \
                  'ordo_server_request_duration_seconds_count{method="inc"}'; do
        a=$(value "$series" "$m1"); b=$(value "$series" "$m2")
        [ -n "$a" ] && [ -n "$b" ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) == 2 else 1)" "$a" "$b" ||
            fail "$series went from '$a' to '$b' over two calls"
    done
    grep -q '^ordo_server_request_duration_seconds_bucket{method="inc",le="0.001"} ' <<<"$m2" ||
        fail "no latency bucket for inc: $m2"
fi

# Nothing listens on port 1: the error names the address and the reason.
err=$("$ordo" call tcp://127.0.0.1:1 inc 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *inc*127.0.0.1:1*refused* ]] || fail "refused: rc=$rc $err"
err=$("$ordo" call bogus://x inc 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *bogus* ]] || fail "bad url: rc=$rc $err"

# A router's view: one replica ready, one that refuses (reconnecting, with the reason); with none
# ready it exits 1; a URL that is not a router's is a usage error naming it.
out=$("$ordo" replicas "route+tcp://${url#tcp://},127.0.0.1:1") || fail "replicas: $out"
[[ "$(echo "$out" | sed -n 1p)" == "$url ready weight=1" ]] || fail "replicas line 1: $out"
[[ "$(echo "$out" | sed -n 2p)" == "tcp://127.0.0.1:1 reconnecting weight=1 ("*refused*")" ]] ||
    fail "replicas line 2: $out"
[[ "$(echo "$out" | sed -n 3p)" == "retry budget: 20% of calls + 10/s (retried 0, moved 0, over budget 0)" ]] ||
    fail "replicas line 3 (the retry budget): $out"
out=$("$ordo" replicas "route+tcp://${url#tcp://}?retry_budget_percent=off") ||
    fail "replicas with the budget off: $out"
[[ "$(echo "$out" | sed -n 2p)" == "retry budget: off (retried 0, moved 0, over budget 0)" ]] ||
    fail "replicas, the budget off: $out"
out=$("$ordo" replicas "route+tcp://127.0.0.1:1" 2>&1); rc=$?
[ $rc = 1 ] && [[ "$out" == *reconnecting* ]] || fail "replicas with none ready: rc=$rc $out"
err=$("$ordo" replicas "$url" 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *"needs a route+ URL"* ]] || fail "replicas of a plain URL: rc=$rc $err"

"$ordo" --help >/dev/null || fail "ordo --help"
"$ordo" call --help >/dev/null || fail "ordo call --help"
"$ordo" frobnicate >/dev/null 2>&1; rc=$?
[ $rc = 2 ] || fail "unknown subcommand exited $rc, expected 2"

kill -TERM "$pid"; wait "$pid" || fail "server exited $? after SIGTERM"
pid=

# Authentication from the shell: a server with --auth-tokens refuses a caller without a token
# (exit 1, "unauthenticated" on stderr), serves one with ?token_file=, and whoami answers its
# subject; introspection is closed to all but --allow-introspection's subjects.
printf '# tokens\nalice-token-0123456789 alice\nbob-token-0123456789ab bob\n' >"$dir/tokens"
echo alice-token-0123456789 >"$dir/alice"
echo bob-token-0123456789ab >"$dir/bob"
chmod 600 "$dir/tokens" "$dir/alice" "$dir/bob"  # secrets: a file others may read is refused
"$server" --listen tcp://127.0.0.1:0 --auth-tokens "$dir/tokens" --allow-introspection alice \
    --access-log "$dir/access.log" >"$dir/auth.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^listening on ' "$dir/auth.out" && break; sleep 0.1; done
aurl=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/auth.out" | head -1)
[ -n "$aurl" ] || fail "auth server did not listen: $(cat "$dir/auth.out")"
err=$("$ordo" call "$aurl" inc 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *unauthenticated* ]] && [[ "$err" == *"requires a token"* ]] ||
    fail "no token: rc=$rc $err"
out=$("$ordo" call "$aurl?token_file=$dir/alice" inc 1) || fail "inc with a token: $out"
[ "$out" = 2 ] || fail "inc 1 with a token printed '$out'"
out=$("$ordo" call "$aurl?token_file=$dir/alice" whoami) || fail "whoami: $out"
[ "$out" = '"alice"' ] || fail "whoami printed '$out'"
out=$("$ordo" methods "$aurl?token_file=$dir/alice") || fail "methods as alice: $out"
[[ "$out" == *whoami* ]] || fail "methods as alice printed '$out'"
err=$("$ordo" methods "$aurl?token_file=$dir/bob" 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *"permission denied"* ]] || fail "methods as bob: rc=$rc $err"
# A caller the server keeps its method list from still calls, with the arguments as given.
out=$("$ordo" call "$aurl?token_file=$dir/bob" inc 1) || fail "inc as bob (no introspection): $out"
[ "$out" = 2 ] || fail "inc 1 as bob printed '$out'"
echo wrong-token-0123456789 >"$dir/wrong"
chmod 600 "$dir/wrong"
err=$("$ordo" call "$aurl?token_file=$dir/wrong" inc 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *"not accepted"* ]] || fail "wrong token: rc=$rc $err"
grep -q "refused" "$dir/auth.out" || fail "the server did not report the refusals: $(cat "$dir/auth.out")"
# The call's context from the shell (docs/protocol.md, "Call context"): the deadline --timeout
# gives, the metadata --meta gives, a traceparent's trace id; and the access log's record of it.
tp=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
out=$("$ordo" call "$aurl?token_file=$dir/alice" context --timeout 500 --meta tenant=acme \
    --meta "traceparent=$tp") || fail "context: $out"
[[ "$out" == *'"tenant":"acme"'* ]] && [[ "$out" == *'"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"'* ]] ||
    fail "context printed '$out'"
left=$(echo "$out" | grep -o '"deadline_left_ms":[0-9]*' | cut -d: -f2)
[ -n "$left" ] && [ "$left" -gt 0 ] && [ "$left" -le 500 ] || fail "context deadline: '$out'"
kill -TERM "$pid"; wait "$pid" || fail "auth server exited $? after SIGTERM"
# One JSON line per call answered: whoami as alice, the context call with its trace id, bob's
# inc; the refused calls (bob's ordo.methods, the callers without a token) were never served,
# so they have none.
log=$(cat "$dir/access.log")
grep -q '"method":"whoami","peer":"tcp://127.0.0.1:[0-9]*","subject":"alice","status":"ok","code":0' \
    "$dir/access.log" || fail "access log has no whoami record: $log"
grep -q '"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","method":"context"' "$dir/access.log" ||
    fail "access log has no traced context record: $log"
[ "$(grep -c '"subject":"bob"' "$dir/access.log")" = 1 ] &&
    grep -q '"method":"inc","peer":"tcp://127.0.0.1:[0-9]*","subject":"bob","status":"ok"' \
        "$dir/access.log" || fail "bob's calls in the access log are not his one inc: $log"
# alice's inc, whoami, context and bob's inc (ordo.methods and the reserved methods are not
# logged).
[ "$(wc -l <"$dir/access.log")" = 4 ] || fail "access log: expected 4 records: $log"
pid=

# A msgpack-rpc server nobody here wrote (skipped without neovim).
if command -v nvim >/dev/null; then
    sock=$dir/nvim.sock
    nvim --headless --clean --listen "$sock" </dev/null >/dev/null 2>&1 &
    nvim_pid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    out=$("$ordo" call "unix://$sock" nvim_eval '"6*7"') || fail "nvim_eval: $out"
    [ "$out" = 42 ] || fail "nvim_eval 6*7 printed '$out'"
    out=$("$ordo" ping "unix://$sock") || fail "nvim ping: $out"
    kill -9 "$nvim_pid"; wait "$nvim_pid" 2>/dev/null
    nvim_pid=
else
    echo "nvim not installed: the neovim check is skipped"
fi

cleanup
echo "ok"
