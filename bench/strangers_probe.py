#!/usr/bin/python3
"""Strangers against named callers, on 127.0.0.0/8 (docs/security.md, "Strangers").

1. ordo-inc-server --auth-tokens: alice (a token) makes fresh connections that authenticate
   and call `inc 1` (small) and `echo` with 1 MiB, first with no strangers, then while strangers
   hold 10,000 silent connections (from 100 addresses of 127.0.0.0/8) and send 10 unfinished
   100 MiB ordo.auth messages. Prints the medians and p99s, and the ratio (done when each median
   is within 2x).
2. `ordo gateway --auth-tokens` (http, then https): real requests (a fresh connection each, with
   a bearer token) first alone, then beside 10,000 idle connections (from 100 addresses) and 100
   slowloris connections (a header byte a second). Prints p50 and p99 (done when p99 <= 50 ms)
   and the gateway's RSS.

Everything runs on loopback, started here and stopped by PID.
usage: strangers_probe.py ORDO INC_SERVER [SAMPLES=100] [STRANGERS=10000]
"""
import os
import re
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import msgpack

ALICE = "alice-token-0123456789"
procs = []


def start(argv, pattern):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs.append(p)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        m = re.search(pattern, line or "")
        if m:
            return p, m.group(1)
        if not line:
            break
    raise RuntimeError(f"{argv[0]} did not start")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def addr_of(url):
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def source(i):
    """One of 100 stranger addresses: 127.0.1.1 ... 127.0.1.100."""
    return ("127.0.1.%d" % (1 + i % 100), 0)


def silent_connections(addr, n):
    held = []
    for i in range(n):
        s = socket.socket()
        s.bind(source(i))
        s.setblocking(False)
        try:
            s.connect(addr)
        except BlockingIOError:
            pass
        held.append(s)
    return held


def rpc_call(addr, method, arg):
    """A fresh connection from 127.0.0.1: ordo.auth, then one call; seconds until its answer."""
    t0 = time.perf_counter()
    s = socket.create_connection(addr, timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(msgpack.packb([2, "ordo.auth", [{"token": ALICE}]]) +
              msgpack.packb([0, 1, method, [arg]], use_bin_type=True))
    u = msgpack.Unpacker(raw=False, max_buffer_size=64 << 20)
    while True:
        chunk = s.recv(1 << 20)
        if not chunk:
            raise RuntimeError(f"{method}: the server closed the connection")
        u.feed(chunk)
        for m in u:
            if m[0] == 1 and m[1] == 1:
                took = time.perf_counter() - t0
                s.close()
                if m[2] is not None:
                    raise RuntimeError(f"{method} failed: {m[2]}")
                return took


def server_part(ordo_server, samples, strangers, d):
    tokens = os.path.join(d, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{ALICE} alice\n")
    os.chmod(tokens, 0o600)
    p, url = start([ordo_server, "--listen", "tcp://127.0.0.1:0", "--auth-tokens", tokens],
                   r"listening on (tcp://\S+)")
    addr = addr_of(url)
    big = b"x" * (1 << 20)

    def measure():
        small = [rpc_call(addr, "inc", 1) for _ in range(samples)]
        large = [rpc_call(addr, "echo", big) for _ in range(max(10, samples // 5))]
        return small, large

    rss0 = rss_mib(p.pid)
    small0, large0 = measure()
    held = silent_connections(addr, strangers)
    # Ten unfinished 100 MiB ordo.auth messages: the header and 64 KiB of the token.
    head = (b"\x93\x02\xa9ordo.auth\x91\x81\xa5token\xdb" + (100 << 20).to_bytes(4, "big"))
    unfinished = []
    for i in range(10):
        s = socket.socket()
        s.bind(("127.0.2.%d" % (1 + i), 0))
        s.connect(addr)
        try:
            s.sendall(head + b"t" * 65536)
        except OSError:
            pass  # refused at the header: the connection is gone
        unfinished.append(s)
    time.sleep(1)
    small1, large1 = measure()
    rss1 = rss_mib(p.pid)
    for s in held + unfinished:
        s.close()
    p.kill()
    p.wait(10)
    for name, a, b in (("small call (connect, ordo.auth, inc)", small0, small1),
                       ("1 MiB call (connect, ordo.auth, echo)", large0, large1)):
        m0, m1 = statistics.median(a), statistics.median(b)
        print(f"server: {name}: median {m0 * 1e3:.2f} ms alone, {m1 * 1e3:.2f} ms beside "
              f"{strangers} silent connections and 10 unfinished 100 MiB messages "
              f"({m1 / m0:.2f}x); p99 {pct(a, .99) * 1e3:.2f} -> {pct(b, .99) * 1e3:.2f} ms")
    print(f"server: RSS {rss0:.1f} MiB before, {rss1:.1f} MiB during")


def http_request(addr, ctx):
    t0 = time.perf_counter()
    s = socket.create_connection(addr, timeout=30)
    if ctx:
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    s.sendall(b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + ALICE.encode() +
              b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n41")
    got = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    if not got.startswith(b"HTTP/1.1 200") or not got.endswith(b"42\n"):
        raise RuntimeError(f"gateway answered {got[:200]!r}")
    return time.perf_counter() - t0


def slowloris(addr, ctx, n, stop):
    def begin(i):
        """A connection from a slowloris address that starts a request and never ends it."""
        try:
            s = socket.socket()
            s.bind(("127.0.3.%d" % (1 + i % 100), 0))
            s.connect(addr)
            if ctx:
                s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
            s.sendall(b"POST /inc HTTP/1.1\r\n")
            return s
        except OSError:
            return None

    conns = [begin(i) for i in range(n)]
    while not stop.is_set():
        for i, s in enumerate(conns):
            try:
                if s is None:
                    raise OSError
                s.sendall(b"X")
            except OSError:
                # Closed by the gateway (request_timeout): a new one takes its place.
                conns[i] = begin(i)
        stop.wait(1.0)
    for s in conns:
        if s is not None:
            s.close()


def gateway_part(ordo, ordo_server, samples, strangers, d, https):
    tokens = os.path.join(d, "tokens")
    _, url = start([ordo_server, "--listen", "tcp://127.0.0.1:0"], r"listening on (tcp://\S+)")
    listen = "http://127.0.0.1:0"
    ctx = None
    if https:
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        if not os.path.exists(cert):
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                            "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                            "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        listen = f"https://127.0.0.1:0?cert={cert}&key={key}"
        ctx = ssl.create_default_context(cafile=cert)
    g, gurl = start([ordo, "gateway", "--listen", listen, "--to", url, "--auth-tokens", tokens],
                    r"listening on (https?://\S+) for")
    addr = addr_of(gurl)
    alone = [http_request(addr, ctx) for _ in range(samples)]
    held = silent_connections(addr, strangers)
    stop = threading.Event()
    loris = threading.Thread(target=slowloris, args=(addr, ctx, 100, stop))
    loris.start()
    time.sleep(2)
    rss_held = rss_mib(g.pid)
    beside = [http_request(addr, ctx) for _ in range(samples)]
    stop.set()
    loris.join()
    for s in held:
        s.close()
    g.kill()
    g.wait(10)
    scheme = "https" if https else "http"
    print(f"gateway {scheme}: real requests (fresh connection each) p50 "
          f"{statistics.median(alone) * 1e3:.2f} ms, p99 {pct(alone, .99) * 1e3:.2f} ms alone; "
          f"p50 {statistics.median(beside) * 1e3:.2f} ms, p99 {pct(beside, .99) * 1e3:.2f} ms "
          f"beside {strangers} idle and 100 slowloris connections; gateway RSS "
          f"{rss_held:.1f} MiB while they were held")


def main():
    ordo, ordo_server = sys.argv[1], sys.argv[2]
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    strangers = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
    want = strangers + 2048
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, soft), max(want, hard)))
    d = tempfile.mkdtemp()
    try:
        server_part(ordo_server, samples, strangers, d)
        for https in (False, True):
            gateway_part(ordo, ordo_server, samples, strangers, d, https)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


if __name__ == "__main__":
    main()
