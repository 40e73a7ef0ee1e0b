#!/usr/bin/env bash
# Which HTTP library for the gateway: the same trivial server (POST /inc, read the body, answer
# "42\n") on civetweb, libmicrohttpd and cpp-httplib (Debian 12's libcivetweb-dev,
# libmicrohttpd-dev, libcpp-httplib-dev), each under `wrk -c 64 -t 2 -d SECONDS` with the body
# [41], then with -c 1 -t 1 (latency at low load). Builds them here with g++ -O2; prints
# requests/s and p50 per library.
# usage: bench/http_libs.sh [SECONDS=5]
set -u
secs=${1:-5}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
cat >"$dir/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "[41]"
LUA
build() { g++ -std=c++20 -O2 -o "$dir/$1" "$here/http_libs/$1.cpp" "${@:2}" -pthread; }
build civetweb_hello -lcivetweb || exit 1
build microhttpd_hello -lmicrohttpd || exit 1
build httplib_hello $(pkg-config --cflags --libs cpp-httplib) || exit 1
port=18190
for lib in civetweb_hello microhttpd_hello httplib_hello; do
    port=$((port + 1))
    "$dir/$lib" "$port" >"$dir/$lib.out" 2>&1 &
    pid=$!
    for _ in $(seq 50); do grep -q ready "$dir/$lib.out" && break; sleep 0.1; done
    sleep 0.2
    [ "$(curl -s -d '[41]' "http://127.0.0.1:$port/inc")" = 42 ] || { echo "$lib does not answer"; exit 1; }
    wrk -c 64 -t 2 -d "${secs}s" --latency -s "$dir/post.lua" "http://127.0.0.1:$port/inc" >"$dir/wrk"
    wrk -c 1 -t 1 -d "${secs}s" --latency -s "$dir/post.lua" "http://127.0.0.1:$port/inc" >"$dir/wrk1"
    echo "$lib: -c 64: $(awk '/^Requests\/sec/ {print $2}' "$dir/wrk") requests/s, p50 $(awk '$1 == "50%" {print $2}' "$dir/wrk"); -c 1: p50 $(awk '$1 == "50%" {print $2}' "$dir/wrk1"); $(cat "$dir/wrk" "$dir/wrk1" | grep -c 'Non-2xx\|Socket errors') error lines"
    kill "$pid"; wait "$pid" 2>/dev/null; pid=
done
