#!/usr/bin/env bash
# ordo-inc-server and ordo-inc-client as other checks drive them: the server prints
# "listening on URL" with the real port, the client prints "ok N calls ...", errors read
# "error: ..." with exit status 1, and the server exits 0 on SIGTERM and on SIGINT. The README's
# hello world (examples/hello.cpp) prints "inc(1) = 2", and names the failure with exit status 1.
set -u
server=$1
client=$2
hello=$3
dir=$(mktemp -d)
fail() { echo "FAIL: $*"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; exit 1; }

for sig in TERM INT; do
    : >"$dir/out"  # emptied first: the wait below must not read the last server's lines
    "$server" --listen tcp://127.0.0.1:0 --listen "unix://$dir/s.sock" >"$dir/out" 2>&1 &
    pid=$!
    for _ in $(seq 300); do [ "$(grep -c '^listening on ' "$dir/out")" = 2 ] && break; sleep 0.1; done
    url=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/out" | head -1)
    [ -n "$url" ] && [ "${url##*:}" != 0 ] || fail "no listening line with a real port: $(cat "$dir/out")"
    grep -q "^listening on unix://$dir/s.sock$" "$dir/out" || fail "no unix listening line"

    out=$("$hello" "$url") || fail "hello failed: $out"
    [ "$out" = "inc(1) = 2" ] || fail "hello printed '$out', not 'inc(1) = 2'"
    out=$("$client" --connect "$url" --calls 2000 --inflight 16) || fail "client failed: $out"
    [[ "$out" =~ ^ok\ 2000\ calls\ in\ [0-9.]+\ s\ \([0-9]+\ calls/s\)$ ]] || fail "bad ok line: $out"
    out=$("$client" --connect "unix://$dir/s.sock" --calls 500 --inflight 1) || fail "unix client: $out"

    out=$("$client" --connect "$url" --mode pooled --calls 2000 --inflight 8) || fail "pooled: $out"
    [[ "$out" =~ ^ok\ 2000\ calls ]] || fail "bad pooled ok line: $out"
    err=$("$client" --connect "$url" --mode bogus 2>&1 >/dev/null); rc=$?
    [ $rc = 1 ] && [[ "$err" == error:* ]] || fail "bad mode: rc=$rc $err"

    kill -"$sig" "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && fail "server still running 10 s after SIG$sig"
    wait "$pid"; rc=$?
    [ $rc = 0 ] || fail "server exited $rc after SIG$sig"
    pid=
done

# --threads 2: connections spread over two loops; add() runs on a strand and stays in order with
# the calls of its connection (total() grew by exactly the adds), while other clients call.
: >"$dir/out"  # emptied first: the wait below must not read the last server's lines
"$server" --listen tcp://127.0.0.1:0 --threads 2 >"$dir/out" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q '^listening on ' "$dir/out" && break; sleep 0.1; done
url=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/out")
[ -n "$url" ] || fail "--threads 2: no listening line: $(cat "$dir/out")"
"$client" --connect "$url" --calls 5000 --inflight 16 >"$dir/side" 2>&1 &
side=$!
out=$("$client" --connect "$url" --calls 2000 --inflight 16 --adds 500) || fail "threads adds: $out"
[[ "$out" =~ ^ok\ 2000\ calls\ .*\;\ total\ grew\ by\ 500$ ]] || fail "bad --threads adds line: $out"
wait "$side" || fail "--threads 2: side client: $(cat "$dir/side")"
err=$("$server" --threads 0 2>&1); rc=$?
[ $rc = 2 ] && [[ "$err" == *--threads* ]] || fail "--threads 0: rc=$rc $err"
kill -TERM "$pid"
wait "$pid"; rc=$?
[ $rc = 0 ] || fail "--threads 2 server exited $rc after SIGTERM"
pid=

# --adds: add(1) notifications among the calls, and total() grew by exactly that many (over a
# resumable session too); refused where notifications are not ordered with calls; and the
# error when another client adds meanwhile.
: >"$dir/out"  # emptied first: the wait below must not read the last server's lines
"$server" --listen tcp://127.0.0.1:0 >"$dir/out" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q '^listening on ' "$dir/out" && break; sleep 0.1; done
url=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/out")
[ -n "$url" ] || fail "no listening line: $(cat "$dir/out")"
out=$("$client" --connect "$url" --calls 2000 --inflight 16 --adds 500) || fail "adds: $out"
[[ "$out" =~ ^ok\ 2000\ calls\ .*\;\ total\ grew\ by\ 500$ ]] || fail "bad adds ok line: $out"
out=$("$client" --connect "$url?resume_ms=5000" --calls 2000 --inflight 8 --adds 777) ||
    fail "adds with resume_ms: $out"
[[ "$out" =~ ^ok\ 2000\ calls\ .*\;\ total\ grew\ by\ 777$ ]] || fail "bad resume_ms ok line: $out"
out=$("$client" --connect "$url" --calls 0 --adds 3) || fail "adds without calls: $out"
[[ "$out" =~ total\ grew\ by\ 3$ ]] || fail "bad ok line for --calls 0: $out"
err=$("$client" --connect "$url" --mode pooled --adds 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == error:*--adds* ]] || fail "pooled adds: rc=$rc $err"
# A long run (its calls one at a time) while short ones add back to back: the long one's total
# grows by more than its own add. (A short run takes milliseconds, the long one over a second.)
"$client" --connect "$url" --calls 50000 --adds 1 >"$dir/long" 2>&1 &
long=$!
while kill -0 "$long" 2>/dev/null; do
    "$client" --connect "$url" --calls 1 --adds 1 >/dev/null 2>&1
done
wait "$long"; rc=$?
err=$(cat "$dir/long")
[ $rc = 1 ] && [[ "$err" =~ ^error:\ total\ grew\ by\ [0-9]+,\ expected\ 1$ ]] ||
    fail "concurrent adds not detected: rc=$rc $err"
kill -TERM "$pid"; wait "$pid" || fail "server exited $? after SIGTERM"
pid=

# Every socket scheme, and tls with the certificate flags (a throwaway CA made with openssl).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=test CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null || fail "openssl: no CA"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
    -keyout "$dir/srv.key" -out "$dir/srv.csr" 2>/dev/null || fail "openssl: no request"
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$dir/ext"
openssl x509 -req -in "$dir/srv.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 1 -extfile "$dir/ext" -out "$dir/srv.pem" 2>/dev/null || fail "openssl: no certificate"
"$server" --listen tls://127.0.0.1:0 --listen zmq+tcp://127.0.0.1:0 --listen "zmq+ipc://$dir/z.sock" \
    --cert "$dir/srv.pem" --key "$dir/srv.key" >"$dir/out2" 2>"$dir/err2" &
pid=$!
for _ in $(seq 300); do [ "$(grep -c '^listening on ' "$dir/out2")" = 3 ] && break; sleep 0.1; done
tls=$(grep -o 'tls://127\.0\.0\.1:[0-9]*' "$dir/out2")
zmq=$(grep -o 'zmq+tcp://127\.0\.0\.1:[0-9]*' "$dir/out2")
[ -n "$tls" ] && [ -n "$zmq" ] || fail "no tls or zmq listening line: $(cat "$dir/out2" "$dir/err2")"
out=$("$client" --connect "$tls" --ca "$dir/ca.pem" --calls 1000 --inflight 16) || fail "tls: $out"
out=$("$client" --connect "$tls" --ca "$dir/ca.pem" --mode pooled --calls 500 --inflight 4) ||
    fail "tls pooled: $out"
out=$("$client" --connect "$zmq" --calls 1000 --inflight 16) || fail "zmq+tcp: $out"
out=$("$client" --connect "zmq+ipc://$dir/z.sock" --calls 1000 --inflight 16) || fail "zmq+ipc: $out"
# Without the CA the server's certificate is not trusted: an error naming why, both sides.
err=$("$client" --connect "$tls" --calls 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *"certificate verify failed"* ]] || fail "untrusted tls: rc=$rc $err"
for _ in $(seq 50); do grep -q '^refused: .*TLS handshake' "$dir/err2" && break; sleep 0.1; done
grep -q '^refused: .*TLS handshake' "$dir/err2" || fail "server did not report the refused handshake"
kill -TERM "$pid"; wait "$pid" || fail "server exited $? after SIGTERM"
pid=

# A router over two servers: calls spread over both (each server's total counts its own adds).
"$server" --listen tcp://127.0.0.1:0 >"$dir/r1" 2>&1 &
pid=$!
"$server" --listen tcp://127.0.0.1:0 >"$dir/r2" 2>&1 &
pid2=$!
for _ in $(seq 300); do grep -q '^listening on ' "$dir/r1" && grep -q '^listening on ' "$dir/r2" && break; sleep 0.1; done
h1=$(grep -o '127\.0\.0\.1:[0-9]*' "$dir/r1"); h2=$(grep -o '127\.0\.0\.1:[0-9]*' "$dir/r2")
[ -n "$h1" ] && [ -n "$h2" ] || { kill -9 "$pid2"; fail "router replicas did not start"; }
out=$("$client" --connect "route+tcp://$h1,$h2?max_concurrent=8&policy=round_robin" --calls 2000 \
    --inflight 64) || { kill -9 "$pid2"; fail "route: $out"; }
[[ "$out" =~ ^ok\ 2000\ calls ]] || { kill -9 "$pid2"; fail "bad route ok line: $out"; }
err=$("$client" --connect "route+tcp://$h1,$h2?policy=random" --calls 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == *"policy must be"* ]] || { kill -9 "$pid2"; fail "bad policy: rc=$rc $err"; }
kill -TERM "$pid" "$pid2"; wait "$pid" "$pid2"
pid=

# A refused connection is an error line and exit status 1.
err=$("$client" --connect "unix://$dir/none.sock" --calls 1 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == error:*none.sock* ]] || fail "refused connection: rc=$rc $err"
err=$("$hello" "unix://$dir/none.sock" 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ "$err" == "ordo: connect to unix://$dir/none.sock failed"* ]] ||
    fail "hello, refused: rc=$rc $err"
rm -rf "$dir"
echo "ok"
