#!/usr/bin/env bash
# Server memory per idle connection: RSS of `ordo-bench --serve` before and after N idle TCP
# connections (each sends one ordo.ping and reads the answer, so every per-connection buffer has
# been used once, and the server knows it: a silent stranger would be closed, see
# server_options::strangers). One address may hold max_per_address (1,024) connections.
# Usage: bench/idle_cost.sh [path/to/ordo-bench] [N=1000]
set -euo pipefail
bin=${1:-build/bench/ordo-bench}
n=${2:-1000}
ulimit -n $((n + 100))
port=$((30000 + RANDOM % 20000))
fifo=$(mktemp -u)
mkfifo "$fifo"
"$bin" --serve "tcp://127.0.0.1:$port" <"$fifo" >/dev/null &
pid=$!
exec 3>"$fifo"
sleep 1
/usr/bin/python3 - "$port" "$n" "$pid" <<'PY'
import socket, sys, time
port, n, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def rss_kib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
before = rss_kib()
ping = b"\x94\x00\x01\xa9ordo.ping\x90"  # [0, 1, "ordo.ping", []]
socks = []
for _ in range(n):  # each answered before the next connects: never more than one stranger
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(ping)
    s.recv(100)
    socks.append(s)
time.sleep(2)
after = rss_kib()
print(f"RSS {before} KiB -> {after} KiB with {n} idle connections: "
      f"{(after - before) / n:.1f} KiB each")
PY
exec 3>&-
wait "$pid"
rm -f "$fifo"
