#!/usr/bin/env bash
# Do healthy idle connections stay open? Starts `ordo-bench --serve` with the default options,
# opens N TCP connections to it (each sends one ordo.ping and reads the answer), leaves them idle
# for S seconds while watching for any the server ends, then pings every one again and counts
# the answers. Also reports the kernel's keepalive probes per second (TcpExt TCPKeepAlive: only
# the server's sockets have keepalive on), its timeout aborts, loopback backlog drops, and the
# server's RSS. Exits 1 if a connection was lost.
#   bench/idle_keepalive.sh [BUILD_DIR=build] [N=10000] [S=120]
set -euo pipefail
b=${1:-build}
n=${2:-10000}
s=${3:-120}
# Each side holds N descriptors (the server in one process, so it cannot be split).
need=$((n + 200))
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$need" ]; then
    echo "need $need descriptors per process, the hard limit is $hard" >&2
    exit 2
fi
ulimit -n "$need"
fifo=$(mktemp -u)
out=$(mktemp)
mkfifo "$fifo"
srv=
cleanup() {
    exec 3>&- 2>/dev/null || true
    if [ -n "$srv" ] && kill -0 "$srv" 2>/dev/null; then
        # Its stdin is closed: give it a moment to stop, then end it.
        sleep 2
        kill "$srv" 2>/dev/null || true
    fi
    rm -f "$fifo" "$out"
}
trap cleanup EXIT
# Port 0: the kernel picks a free port; the server prints the address it bound.
"$b/bench/ordo-bench" --serve tcp://127.0.0.1:0 <"$fifo" >"$out" &
srv=$!
exec 3>"$fifo"
for _ in $(seq 50); do grep -q 'tcp://' "$out" && break; sleep 0.1; done
port=$(grep -o 'tcp://[0-9.]*:[0-9]*' "$out" | sed 's/.*://')
[ -n "$port" ] || { echo "the server did not start" >&2; exit 2; }
status=0
/usr/bin/python3 - "$port" "$n" "$s" "$srv" <<'PY' || status=$?
import errno, selectors, socket, sys, time
port, n, idle_s, pid = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

def rss_kib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])

def counters():
    """TcpExt counters of this network namespace, plus loopback backlog drops."""
    lines = open("/proc/net/netstat").read().splitlines()
    c = {}
    for head, vals in zip(lines[::2], lines[1::2]):
        if head.startswith("TcpExt:"):
            c.update(zip(head.split()[1:], map(int, vals.split()[1:])))
    c["backlog_drops"] = sum(int(l.split()[1], 16) for l in open("/proc/net/softnet_stat"))
    return c

WATCH = ["TCPKeepAlive", "TCPAbortOnTimeout", "TCPACKSkippedSeq", "backlog_drops"]

def ping(msgid):
    return bytes([0x94, 0x00, msgid]) + b"\xa9ordo.ping\x90"  # [0, msgid, "ordo.ping", []]

def is_answer(data, msgid):
    return data[:3] == bytes([0x94, 0x01, msgid])  # [1, msgid, nil, ...]

t0 = time.monotonic()
socks = []
for i in range(n):
    socks.append(socket.create_connection(("127.0.0.1", port)))
    socks[-1].sendall(ping(1))
bad = 0
for s in socks:
    s.settimeout(10)
    if not is_answer(s.recv(100), 1):
        bad += 1
print(f"{n} connections opened and pinged in {time.monotonic() - t0:.1f} s"
      f" ({bad} wrong first answers), server RSS {rss_kib()} KiB", flush=True)

# Idle: nothing is sent; a connection the server ends becomes readable (ordo.closing, end of
# stream, or a reset from the kernel).
sel = selectors.DefaultSelector()
for i, s in enumerate(socks):
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, i)
lost = {}  # index -> (seconds into the idle time, how)
c0 = counters()
start = time.monotonic()
last_report, c_last = start, c0
while (now := time.monotonic()) < start + idle_s:
    for key, _ in sel.select(timeout=min(1.0, start + idle_s - now)):
        i = key.data
        try:
            data = key.fileobj.recv(4096)
            how = "message (ordo.closing?)" if data else "end of stream"
        except ConnectionResetError:
            how = "reset"
        except OSError as e:
            how = errno.errorcode.get(e.errno, str(e))
        lost[i] = (time.monotonic() - start, how)
        sel.unregister(key.fileobj)
    if now - last_report >= 10:
        c = counters()
        probes = (c["TCPKeepAlive"] - c_last["TCPKeepAlive"]) / (now - last_report)
        print(f"  {now - start:5.0f} s: {len(lost)} lost, {probes:.0f} keepalive probes/s, "
              f"backlog drops +{c['backlog_drops'] - c_last['backlog_drops']}, "
              f"server RSS {rss_kib()} KiB", flush=True)
        last_report, c_last = now, c
c1 = counters()
elapsed = time.monotonic() - start

# Every connection still open is pinged again and must answer.
for key in list(sel.get_map().values()):
    try:
        key.fileobj.send(ping(2))
    except OSError as e:
        lost[key.data] = (elapsed, "send: " + errno.errorcode.get(e.errno, str(e)))
        sel.unregister(key.fileobj)
answered = 0
deadline = time.monotonic() + 10
while sel.get_map() and time.monotonic() < deadline:
    for key, _ in sel.select(timeout=1.0):
        try:
            data = key.fileobj.recv(4096)
            if is_answer(data, 2):
                answered += 1
            else:
                lost[key.data] = (elapsed, "no answer: " + (data[:16].hex() or "end of stream"))
        except OSError as e:
            lost[key.data] = (elapsed, "after idle: " + errno.errorcode.get(e.errno, str(e)))
        sel.unregister(key.fileobj)
for key in list(sel.get_map().values()):
    lost[key.data] = (elapsed, "no answer within 10 s")

print(f"after {elapsed:.0f} s idle: {answered} of {n} answered a ping, {len(lost)} lost")
if lost:
    hows = {}
    for t, how in lost.values():
        hows.setdefault(how, []).append(t)
    for how, ts in sorted(hows.items()):
        print(f"  {len(ts)} by {how}, between {min(ts):.1f} and {max(ts):.1f} s")
print(f"keepalive probes: {(c1['TCPKeepAlive'] - c0['TCPKeepAlive']) / elapsed:.0f}/s; "
      + ", ".join(f"{k} +{c1[k] - c0[k]}" for k in WATCH[1:]))
print(f"server RSS {rss_kib()} KiB")
for s in socks:
    s.close()
sys.exit(1 if lost or answered != n else 0)
PY
exec 3>&-
for _ in $(seq 50); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
exit "$status"
