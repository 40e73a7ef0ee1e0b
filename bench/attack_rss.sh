#!/usr/bin/env bash
# Does the memory budget hold against hostile clients? Runs attack cases against
# `ordo-inc-server` with its default options (memory_budget 1 GiB, message_timeout 30 s,
# output_grace 10 s, max_queued_bytes 64 MiB), a fresh server for each case: glibc keeps memory a
# server has freed, and a case's leftovers (a sleeping handler, closing sockets) would skew the
# next one's baseline and peak. The server's VmRSS is sampled every 100 ms for the peak (VmHWM,
# the kernel's own high-water mark, is shown too), and a fresh client must get one `inc` call
# answered within 5 s while each attack holds.
#   1 huge-partial   16 connections send the first 100 MiB of a 120 MiB echo request, then stall
#   2 slowloris      2,000 connections send a header announcing a 10 MiB str, then nothing
#   3 queue-flood    sleep_ms(60000), then 65,536 echo requests of 64 KiB, on one connection
#   4 queue-flood24  the same on 24 connections at once
#   5 non-reading    8 connections send 4,096 echo(256 KiB) each and never read
#   6 idle           2,000 connections each ping once and then stay idle: RSS per connection
# After each attack the server is watched until its RSS has set no new peak for 3 s (closing
# connections may cost memory too), and a fresh client must be served then as well. Prints one
# summary line per case at the end; exits 1 if a case's peak went over 1 GiB + 200 MiB or a
# fresh client was not served. Takes about 2.5 minutes for all six.
#   bench/attack_rss.sh [CASES=1,2,3,4,5,6 (numbers or names)] [BUILD_DIR=build]
set -euo pipefail
cases=${1:-1,2,3,4,5,6}
b=${2:-build}
[ -x "$b/examples/ordo-inc-server" ] || { echo "no $b/examples/ordo-inc-server" >&2; exit 2; }

# 2,000 connections on each side, plus a few for the fresh clients.
need=2300
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$need" ]; then
    echo "need $need descriptors per process, the hard limit is $hard" >&2
    exit 2
fi
ulimit -n "$need"

tmp=$(mktemp -d)
# A copy of the server, so that a rebuild during the run does not change it between cases.
cp "$b/examples/ordo-inc-server" "$tmp/server"
srv=
stop_server() {
    [ -n "$srv" ] || return 0
    if kill -0 "$srv" 2>/dev/null; then
        # SIGTERM asks for a graceful stop; a server that has not ended after 10 s is killed.
        kill -TERM "$srv" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
        if kill -KILL "$srv" 2>/dev/null; then
            echo "(the server did not stop within 10 s of SIGTERM: killed)"
        fi
    fi
    wait "$srv" 2>/dev/null || true
    srv=
}
cleanup() {
    stop_server
    rm -rf "$tmp"
}
trap cleanup EXIT

summary=()
status=0
for c in ${cases//,/ }; do
    case $c in
        1 | huge-partial) name=huge-partial ;;
        2 | slowloris) name=slowloris ;;
        3 | queue-flood) name=queue-flood ;;
        4 | queue-flood24) name=queue-flood24 ;;
        5 | non-reading) name=non-reading ;;
        6 | idle) name=idle ;;
        *) echo "unknown case '$c'" >&2; exit 2 ;;
    esac
    # Port 0: the kernel picks a free port; the server prints "listening on tcp://HOST:PORT".
    "$tmp/server" --listen tcp://127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
    srv=$!
    for _ in $(seq 50); do grep -q 'tcp://' "$tmp/out" && break; sleep 0.1; done
    port=$(grep -o 'tcp://[0-9.]*:[0-9]*' "$tmp/out" | sed 's/.*://' || true)
    [ -n "$port" ] || { echo "the server did not start" >&2; cat "$tmp/err" >&2; exit 2; }
    echo "== $name (server pid $srv, port $port)"
    # A failing case is noted and the next one runs (pipefail: the status is python's).
    if ! /usr/bin/python3 - "$name" "$port" "$srv" <<'PY' | tee "$tmp/case"
import errno, msgpack, re, select, socket, struct, sys, threading, time

name, port, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
MiB = 1 << 20


def status_kib(field):
    """A field of /proc/PID/status in KiB, or None once the server has gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


class Sampler(threading.Thread):
    """VmRSS every 100 ms, keeping the peak and when it was last raised."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.peak_t, self.gone, self.done = 0, 0.0, False, threading.Event()

    def run(self):
        while not self.done.is_set():
            r = status_kib("VmRSS")
            if r is None:
                self.gone = True
                return
            if r > self.peak:
                self.peak, self.peak_t = r, time.monotonic()
            self.done.wait(0.1)

    def stop(self):
        self.done.set()
        self.join()


# Fresh clients: each opens its own connection and makes one inc(41) call, answered within 5 s or
# counted as not served. Threads, so that the attack goes on meanwhile.
probes, probe_threads = [], []


def probe(delay):
    time.sleep(delay)
    began = time.monotonic()
    how = "no answer within 5 s"
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(msgpack.packb([0, 7, "inc", [41]]))
        unp = msgpack.Unpacker(raw=False)
        while (left := began + 5 - time.monotonic()) > 0:
            s.settimeout(left)
            data = s.recv(4096)
            if not data:
                how = "closed without an answer"
                break
            unp.feed(data)
            for m in unp:
                if m[:2] == [1, 7]:
                    how = "ok" if m[2] is None and m[3] == 42 else f"wrong answer {m}"
                    break
                if m[:2] == [2, "ordo.closing"]:
                    how = f"told ordo.closing {m[2]}"
            if how == "ok" or how.startswith("wrong"):
                break
        s.close()
    except OSError as e:
        how = f"{type(e).__name__}: {e}"
    probes.append((began, how, time.monotonic() - began))


def probe_later(delay=0):
    t = threading.Thread(target=probe, args=(delay,), daemon=True)
    t.start()
    probe_threads.append(t)


def probe_verdict():
    for t in probe_threads:
        t.join(timeout=15)
    ok = [dt for _, how, dt in probes if how == "ok"]
    bad = [f"the one at {t - start:.1f} s: {how}" for t, how, _ in sorted(probes) if how != "ok"]
    if len(ok) == len(probe_threads) and ok:
        return f"yes ({len(ok)}/{len(ok)}, slowest {max(ok) * 1000:.0f} ms)"
    return f"NO ({len(ok)}/{len(probe_threads)} answered; {'; '.join(bad) or 'missing'})"


def connect():
    return socket.create_connection(("127.0.0.1", port), timeout=5)


class Conn:
    """One attacking connection: sends what `source` yields (non-blocking), optionally reads,
    and notes when and how the server ended it."""

    def __init__(self, sock, source, read):
        self.s, self.fd, self.source, self.read = sock, sock.fileno(), source, read
        self.s.setblocking(False)
        self.pending = memoryview(b"")
        self.sent, self.first, self.sent_all = 0, None, False
        self.closed_at, self.how, self.said = None, None, None
        self.unp = msgpack.Unpacker(raw=False)

    def ended(self, how):
        self.closed_at, self.how = time.monotonic(), how
        self.s.close()

    def push(self):
        """Sends until the kernel takes no more (at most 16 MiB, to share time fairly)."""
        total = 0
        while total < 16 * MiB:
            if not self.pending:
                chunk = next(self.source, None)
                if chunk is None:
                    self.sent_all = True
                    break
                self.pending = memoryview(chunk)
            try:
                n = self.s.send(self.pending[: 4 * MiB])
            except BlockingIOError:
                break
            except OSError as e:
                self.ended("send: " + errno.errorcode.get(e.errno, str(e)))
                break
            if self.first is None:
                self.first = time.monotonic()
            self.pending = self.pending[n:]
            self.sent += n
            total += n
        return total

    def pull(self):
        try:
            data = self.s.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as e:
            reset = e.errno == errno.ECONNRESET
            self.ended("reset" if reset else errno.errorcode.get(e.errno, str(e)))
            return
        if not data:
            self.ended("end of stream")
            return
        self.unp.feed(data)
        for m in self.unp:
            if isinstance(m, list) and m[:2] == [2, "ordo.closing"]:
                self.said = m[2]


def pump(conns, until, send=True, stall_s=None):
    """Sends (if `send`) and watches for the server ending connections, until `until`, until every
    connection has ended, or while sending: until all is sent or nothing was taken for `stall_s`.
    Returns why it stopped."""
    poller, by_fd = select.poll(), {}

    gone = select.POLLRDHUP | select.POLLHUP | select.POLLERR

    def mask(c):
        m = select.POLLRDHUP | (select.POLLIN if c.read else 0)
        return m | (select.POLLOUT if send and not c.sent_all else 0)

    for c in conns:
        if c.closed_at is None:
            poller.register(c.fd, mask(c))
            by_fd[c.fd] = c
    progress = time.monotonic()
    while by_fd:
        now = time.monotonic()
        if now >= until:
            return "time"
        if send and stall_s and now - progress >= stall_s:
            return "stalled"
        if send and all(c.sent_all for c in by_fd.values()):
            return "all sent"
        for fd, ev in poller.poll(100):
            c = by_fd.get(fd)
            if c is None:
                continue
            if ev & select.POLLOUT and c.closed_at is None:
                if c.push():
                    progress = time.monotonic()
                if c.sent_all:
                    poller.modify(fd, mask(c))
            if c.closed_at is None and c.read and ev & (select.POLLIN | gone):
                c.pull()
            elif c.closed_at is None and ev & gone:
                # Not reading, so the end shows as a hang-up or error (a reset when the server
                # closes with our bytes unread).
                c.ended("hang-up" if ev & select.POLLHUP else
                        "peer shut down" if ev & select.POLLRDHUP else "error")
            if c.closed_at is not None:
                poller.unregister(fd)
                del by_fd[fd]
    return "all ended"


def drop_times(conns, since):
    t = [c.closed_at - since(c) for c in conns if c.closed_at is not None]
    left = sum(c.closed_at is None for c in conns)
    s = f"{min(t):.1f}-{max(t):.1f} s" if t else "-"
    return s + (f", {left} of {len(conns)} still open" if left else "")


def hows(conns):
    h = {}
    for c in conns:
        k = c.how or "still open"
        h[k] = h.get(k, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(h.items()))


def saids(conns):
    """The ordo.closing reasons read, grouped once the parts that differ by connection (its
    address, byte counts, the budget's figures) are taken out."""
    s = {}
    for c in conns:
        if c.said is not None:
            k = re.sub(r" from \S+,", ",", str(c.said))
            k = re.sub(r"\d+ (bytes|of \d+ bytes used)", r"N \1", k)
            s[k] = s.get(k, 0) + 1
    return "; ".join(f"{n} x {k}" for k, n in s.items()) or "no ordo.closing read"


def sending_stopped(conns, why):
    sent = [c.sent / MiB for c in conns]
    print(f"sending stopped ({why}) after {time.monotonic() - t0:.1f} s: {sum(sent):.0f} MiB "
          f"taken, {min(sent):.1f}-{max(sent):.1f} MiB each; RSS {status_kib('VmRSS') / 1024:.0f} "
          "MiB", flush=True)


def request(msgid_bytes, payload_head):
    """[0, msgid, "echo", [<payload>]] up to the payload's own header."""
    return b"\x94\x00" + msgid_bytes + b"\xa4echo\x91" + payload_head


def echo_source(count, size, first=b"", per_block=16):
    """Yields `first`, then `count` requests echo(bin of `size`) with msgids 1.., built into one
    reused block of `per_block` requests (the block is refilled only once it has all been sent)."""
    if first:
        yield first
    req = request(b"\xce\0\0\0\0", b"\xc6" + struct.pack(">I", size)) + bytes(size)
    block = bytearray(req * per_block)
    i = 0
    while i < count:
        k = min(per_block, count - i)
        for j in range(k):
            struct.pack_into(">I", block, j * len(req) + 3, i + j + 1)
        i += k
        yield memoryview(block)[: k * len(req)]


# A warm-up call, so the baseline includes what serving the first connection costs.
probe(0)
probes.clear()
time.sleep(0.5)
base = status_kib("VmRSS")
sampler = Sampler()
sampler.start()
t0 = start = time.monotonic()
drop, notes = "-", ""

if name == "huge-partial":
    n, want, announced = 16, 100 * MiB, 120 * MiB
    data = request(b"\x01", b"\xc6" + struct.pack(">I", announced))
    data += bytes(want - len(data))
    conns = [Conn(connect(), iter([data]), read=True) for _ in range(n)]
    probe_later(10)
    why = pump(conns, t0 + 20)  # as much as the server takes within 20 s
    sending_stopped(conns, why)
    probe_later(0)
    pump(conns, max(c.first or t0 for c in conns) + 45, send=False)
    drop = drop_times(conns, lambda c: c.first)
    notes = f"{hows(conns)}; said: {saids(conns)}"

elif name == "slowloris":
    n = 2000
    head = request(b"\x01", b"\xdb" + struct.pack(">I", 10 * MiB))
    conns = []
    for _ in range(n):
        if time.monotonic() > t0 + 30:
            break
        s = connect()
        s.sendall(head)
        conns.append(Conn(s, iter(()), read=True))
        conns[-1].first, conns[-1].sent = time.monotonic(), len(head)
    print(f"{len(conns)} connections sent their header in {time.monotonic() - t0:.1f} s; "
          f"RSS {status_kib('VmRSS') / 1024:.0f} MiB", flush=True)
    probe_later(0)
    probe_later(15)
    pump(conns, max(c.first for c in conns) + 45, send=False)
    last = max(c.closed_at or time.monotonic() for c in conns)
    drop = drop_times(conns, lambda c: c.first)
    drop += f" (all ended {last - t0:.1f} s after the first connected)"
    notes = f"{hows(conns)}; said: {saids(conns)}"

elif name in ("queue-flood", "queue-flood24"):
    n = 1 if name == "queue-flood" else 24
    sleep = msgpack.packb([0, 0, "sleep_ms", [60000]])
    conns = [Conn(connect(), echo_source(65536, 64 * 1024, sleep, 64), read=True) for _ in range(n)]
    probe_later(3)
    why = pump(conns, t0 + 20, stall_s=3)  # as much as the server takes within 20 s
    held = time.monotonic()
    sending_stopped(conns, why)
    probe_later(0)
    pump(conns, held + 3, send=False)  # hold, and see whether the server ends any
    ended_by_server = sum(c.closed_at is not None for c in conns)
    for c in conns:
        if c.closed_at is None:
            c.ended("closed by us")
    notes = (f"{sum(c.sent for c in conns) / MiB:.0f} MiB taken; "
             f"{ended_by_server} ended by the server")

elif name == "non-reading":
    n = 8
    conns = [Conn(connect(), echo_source(4096, 256 * 1024), read=False) for _ in range(n)]
    probe_later(4)
    probe_later(9)
    if pump(conns, t0 + 45) == "all sent":
        pump(conns, t0 + 45, send=False)
    drop = drop_times(conns, lambda c: t0)
    notes = f"{sum(c.sent for c in conns) / MiB:.0f} MiB taken; {hows(conns)}"

elif name == "idle":
    n = 2000
    ping = msgpack.packb([0, 1, "ordo.ping", []])
    socks = []
    for _ in range(n):
        if time.monotonic() > t0 + 30:
            break
        socks.append(connect())
        socks[-1].sendall(ping)
    bad = 0
    for s in socks:
        try:
            # Each answer within 5 s (connect() set that timeout), all within 40 s.
            if time.monotonic() > t0 + 40 or s.recv(100)[:3] != b"\x94\x01\x01":
                bad += 1
        except OSError:
            bad += 1
    time.sleep(2)
    after = status_kib("VmRSS")
    probe_later(0)
    probe_verdict()
    for s in socks:
        s.close()
    notes = (f"{len(socks)} connections ({bad} bad answers): {base} -> {after} KiB, "
             f"{(after - base) / len(socks):.1f} KiB each")

# Aftermath: what the server does once the attack is over (closing connections may cost memory
# and time of their own), until its RSS has set no new peak for 3 s (at most 20 s). A fresh
# client must be served then too.
attack_peak = sampler.peak
after = ""
if name != "idle":
    t_end = time.monotonic()
    probe_later(1)
    while time.monotonic() < t_end + 20 and time.monotonic() - max(t_end, sampler.peak_t) < 3:
        time.sleep(0.1)
    rss = status_kib("VmRSS") or 0
    if sampler.peak > attack_peak + 1024:
        after = f", after it {sampler.peak / 1024:.0f}"
    after += f"; {rss / 1024:.0f} MiB {time.monotonic() - t_end:.0f} s after"
fresh = probe_verdict()
sampler.stop()
hwm = status_kib("VmHWM")
if sampler.gone:
    notes += "; THE SERVER HAS GONE"
print(f"SUMMARY {name:<14} peak {sampler.peak / 1024:6.0f} MiB (VmHWM {(hwm or 0) / 1024:.0f}; "
      f"during the attack {attack_peak / 1024:.0f}{after})  baseline {base / 1024:.1f} MiB  "
      f"dropped after {drop}  fresh client served: {fresh}  [{notes}]")
# Over the budget by more than 200 MiB, or a fresh client not served: the case fails.
failed = sampler.peak > (1024 + 200) * 1024 or not fresh.startswith("yes") or sampler.gone
sys.exit(1 if failed else 0)
PY
    then
        status=1
    fi
    summary+=("$(sed -n 's/^SUMMARY //p' "$tmp/case")")
    if ! kill -0 "$srv" 2>/dev/null; then
        echo "the server ended during $name:" >&2
        tail -5 "$tmp/err" >&2
    fi
    stop_server
done
echo
echo "== summary (a fresh server for each case; peak = sampled VmRSS; dropped after = from each"
echo "   connection's first bytes, or non-reading: from the start of the attack)"
printf '%s\n' "${summary[@]}"
exit "$status"
