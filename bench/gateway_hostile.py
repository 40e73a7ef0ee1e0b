#!/usr/bin/python3
"""Hostile requests against `ordo gateway`: does it keep serving, and does its memory hold?

Starts ordo-inc-server and a gateway in front of it on loopback (free ports, stopped by PID),
makes 2,000 normal calls on one connection and 4,000 on connections of their own, 32 at a time,
half of them with a 110 KB body (so that every civetweb thread has served a large request),
reads its RSS, sends N hostile requests, each
on a fresh connection, in a fixed rotation (bodies nested 70, 300 and 100,000 deep, reserved
ordo.* methods, two Content-Lengths, Content-Length with Transfer-Encoding, a text/plain body, a
body over --max-body-bytes, numbers JSON cannot hold, garbage JSON, a preflight from a foreign
origin, a bad Host, a request line of garbage), checks that each got the status it should, then
makes 2,000 normal calls again and reads the RSS once more. Prints one line; exits 1 if any
hostile request got another status, a normal call failed, the gateway restarted, or its RSS grew
by more than 20%.

usage: gateway_hostile.py ORDO INC_SERVER [N=10000]
"""
import concurrent.futures
import http.client
import os
import re
import socket
import subprocess
import sys
import time

JSON = {"Content-Type": "application/json"}



def start(argv, pattern):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        m = re.search(pattern, line or "")
        if m:
            return p, m.group(1)
        if not line:
            break
    p.kill()
    raise SystemExit(f"error: {argv[0]} did not start")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def raw(addr, data):
    """Sends data on a fresh connection; returns the status of the first response line."""
    s = socket.create_connection(addr, timeout=10)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass  # refused before the whole body was sent: its answer may still be there
        got = b""
        while b"\r\n" not in got:
            try:
                chunk = s.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        m = re.match(rb"HTTP/1\.[01] (\d+)", got)
        return int(m.group(1)) if m else None
    finally:
        s.close()


def post(addr, body, ctype="application/json", host=None, path="/echo"):
    head = f"POST {path} HTTP/1.1\r\nHost: {host or 'x'}\r\nContent-Type: {ctype}\r\n"
    data = body.encode() if isinstance(body, str) else body
    return raw(addr, head.encode() + b"Content-Length: %d\r\n\r\n" % len(data) + data)


def hostile_cases(addr):
    deep = lambda n: "[" * n + "]" * n  # noqa: E731
    return [
        ("70 deep", lambda: post(addr, deep(70)), 413),
        ("300 deep", lambda: post(addr, deep(300)), 413),
        ("100,000 deep", lambda: post(addr, deep(100_000)), 413),
        ("ordo.goaway", lambda: post(addr, '[0, "bye"]', path="/ordo.goaway?notify=1"), 404),
        ("ordo.cancel", lambda: post(addr, "[1]", path="/ordo.cancel?notify=1"), 404),
        ("ordo.stats", lambda: post(addr, "[]", path="/ordo.stats"), 404),
        ("two lengths", lambda: raw(addr, b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Length: 1"
                                          b"\r\nContent-Length: 2\r\n\r\n1"), 400),
        ("length and chunked", lambda: raw(addr, b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-"
                                                 b"Length: 1\r\nTransfer-Encoding: chunked\r\n"
                                                 b"\r\n1"), 400),
        ("text/plain", lambda: post(addr, "[1]", ctype="text/plain"), 415),
        ("over max body", lambda: post(addr, "[" + "1," * 150_000 + "1]"), 413),
        ("1e400", lambda: post(addr, "[1e400]"), 400),
        ("garbage JSON", lambda: post(addr, "[1, 2"), 400),
        ("foreign preflight", lambda: raw(addr, b"OPTIONS /inc HTTP/1.1\r\nHost: x\r\nOrigin: "
                                                b"http://evil.example\r\nAccess-Control-Request-"
                                                b"Method: POST\r\n\r\n"), 405),
        ("bad Host", lambda: post(addr, "[1]", host="rebound.evil.example", path="/inc"), 403),
        ("garbage request line", lambda: raw(addr, b"\x00\x01\x02 nonsense\r\n\r\n"), 400),
    ]


def normal_calls(addr, n):
    c = http.client.HTTPConnection(*addr, timeout=10)
    try:
        for i in range(n):
            c.request("POST", "/echo", body=f"[{i}]", headers=JSON)
            r = c.getresponse()
            body = r.read()
            if r.status != 200 or body != f"{i}\n".encode():
                return f"call {i}: {r.status} {body[:80]!r}"
    finally:
        c.close()
    return None


def large_call(addr):
    """One normal call with a large body (a 20,000-number array, ~110 KB), on a connection of
    its own: legitimate traffic that fills a civetweb thread's request buffer as a large hostile
    body does."""
    body = "[[" + ",".join(str(i) for i in range(20000)) + "]]"
    c = http.client.HTTPConnection(*addr, timeout=10)
    try:
        c.request("POST", "/echo", body=body, headers=JSON)
        r = c.getresponse()
        got = r.read()
        if r.status != 200 or got.strip() != body[1:-1].encode():
            return f"large call: {r.status} {got[:80]!r}"
    finally:
        c.close()
    return None


def main():
    ordo, inc = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    max_growth = float(sys.argv[4]) / 100 if len(sys.argv) > 4 else None
    srv, url = start([inc, "--listen", "tcp://127.0.0.1:0"], r"listening on (tcp://\S+)")
    gw, hp = start([ordo, "gateway", "--listen", "http://127.0.0.1:0", "--to", url,
                    "--allow-host", "x", "--allow-host", "127.0.0.1", "--max-body-bytes", "262144"],
                   r"listening on http://(\S+) for")
    host, port = hp.rsplit(":", 1)
    addr = (host, int(port))
    failures = []
    try:
        if (err := normal_calls(addr, 2000)):
            failures.append("before: " + err)
        first = rss_kib(gw.pid)
        # Normal traffic first: 4,000 calls, each on a connection of its own, 32 at a time, half
        # of them with a large body, so that civetweb's threads (max_connections + 4, each with
        # its stack, its request buffer of 2 x max_header_bytes and a malloc arena) have all
        # served; what they cost then is the gateway's size in use, not growth.
        # (Large bodies only when the RSS is checked: the suite's smoke run, under ASan too,
        # checks statuses and service.)
        def warm(i):
            return large_call(addr) if i % 2 and max_growth is not None else normal_calls(addr, 1)
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            errs = [e for e in pool.map(warm, range(4000)) if e]
        if errs:
            failures.append("warm-up: " + errs[0])
        before = rss_kib(gw.pid)
        cases = hostile_cases(addr)
        t0 = time.monotonic()
        for i in range(n):
            name, send, want = cases[i % len(cases)]
            got = send()
            if got != want:
                failures.append(f"{name}: {got}, not {want}")
                if len(failures) > 10:
                    break
        took = time.monotonic() - t0
        if (err := normal_calls(addr, 2000)):
            failures.append("after: " + err)
        after = rss_kib(gw.pid)
        if gw.poll() is not None:
            failures.append(f"the gateway exited ({gw.returncode})")
        growth = (after - before) / before if before else 0
        if max_growth is not None and growth > max_growth:
            failures.append(f"RSS grew {growth:.0%}")
        print(f"gateway hostile: {n} requests ({len(cases)} kinds) in {took:.1f} s; RSS "
              f"{first / 1024:.1f} MiB after 2,000 calls on one connection, {before / 1024:.1f} "
              f"after 4,000 on their own, {after / 1024:.1f} after the hostile ones "
              f"({growth:+.1%}); normal calls "
              f"served before and after; " + ("ok" if not failures else "FAILED: " +
                                              "; ".join(failures[:10])))
    finally:
        for p in (gw, srv):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
