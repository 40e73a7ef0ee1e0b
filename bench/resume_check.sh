#!/usr/bin/env bash
# Starts ordo-inc-server --threads T on loopback, runs ordo-resume-check against it (through its
# cutting proxy) with the remaining arguments, prints its line, and stops the server by its PID.
#   bench/resume_check.sh SERVER CHECK THREADS [ordo-resume-check flags...]
# Exit status: the check's (1 if the server did not start).
set -u
server=$1
check=$2
threads=$3
shift 3
dir=$(mktemp -d)
"$server" --listen tcp://127.0.0.1:0 --threads "$threads" >"$dir/out" 2>&1 &
pid=$!
stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"; }
for _ in $(seq 100); do grep -q '^listening on ' "$dir/out" && break; sleep 0.1; done
url=$(grep -o 'tcp://127\.0\.0\.1:[0-9]*' "$dir/out" | head -1)
if [ -z "$url" ]; then
    echo "error: the server did not start: $(cat "$dir/out")"
    stop
    exit 1
fi
"$check" --connect "$url" "$@"
rc=$?
stop
exit $rc
