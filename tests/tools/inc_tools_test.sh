#!/usr/bin/env bash
# ordo-inc-server and ordo-inc-client as other checks drive them: the server prints
# "listening on URL" with the real port, the client prints "ok N calls ...", errors read
# "error: ..." with exit status 1, and the server exits 0 on SIGTERM and on SIGINT.
set -u
server=$1
client=$2
dir=$(mktemp -d)
fail() { echo "FAIL: $*"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; exit 1; }

for sig in TERM INT; do
    "$server" --listen tcp://127.0.0.1:0 --listen "unix://$dir/s.sock" >"$dir/out" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [ "$(grep -c '^listening on ' "$dir/out")" = 2 ] && break; sleep 0.1; done
    url=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/out" | head -1)
    [ -n "$url" ] && [ "${url##*:}" != 0 ] || fail "no listening line with a real port: $(cat "$dir/out")"
    grep -q "^listening on unix://$dir/s.sock$" "$dir/out" || fail "no unix listening line"

    out=$("$client" --connect "$url" --calls 2000 --inflight 16) || fail "client failed: $out"
    [[ "$out" =~ ^ok\ 2000\ calls\ in\ [0-9.]+\ s\ \([0-9]+\ calls/s\)$ ]] || fail "bad ok line: $out"
    out=$("$client" --connect "unix://$dir/s.sock" --calls 500 --inflight 1) || fail "unix client: $out"

    out=$("$client" --connect "$url" --mode pooled --calls 2000 --inflight 8) || fail "pooled: $out"
    [[ "$out" =~ ^ok\ 2000\ calls ]] || fail "bad pooled ok line: $out"
    err=$("$client" --connect "$url" --mode bogus 2>&1 >/dev/null); rc=$?
    [ $rc = 1 ] && [[ "$err" == error:* ]] || fail "bad mode: rc=$rc $err"

    kill -"$sig" "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && fail "server still running 10 s after SIG$sig"
    wait "$pid"; rc=$?
    [ $rc = 0 ] || fail "server exited $rc after SIG$sig"
    pid=
done

# A refused connection is an error line and exit status 1.
err=$("$client" --connect "unix://$dir/none.sock" --calls 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == error:*none.sock* ]] || fail "refused connection: rc=$rc $err"
rm -rf "$dir"
echo "ok"
