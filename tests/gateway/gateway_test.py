#!/usr/bin/python3
"""`ordo gateway` driven over HTTP with Python's http.client, raw sockets and aiohttp.

Starts three ordo-inc-server replicas and gateways on loopback (free ports), all stopped by PID:
  main    -> route+ over the three replicas
  single  -> one ordered tcp:// channel (notification order, a lost peer)
  tight   -> the same route, with small limits (headers, body, time, connections)
  narrow  -> a route with max_concurrent=1&max_queued=1 (overloaded)

usage: gateway_test.py ORDO INC_SERVER
"""
import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import ssl
import sys
import tempfile
import threading
import time
import unittest

ORDO = INC_SERVER = None
procs = []
gateways = []


def start(argv, pattern, limit=15.0):
    """Starts argv, returns (process, first match of pattern in its stdout)."""
    # stderr (the gateway's event lines) goes to the test's log; stdout is read here.
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    procs.append(p)
    deadline = time.monotonic() + limit
    seen = []
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return p, m.group(1)
    raise RuntimeError(f"{argv[0]} did not print {pattern!r}: {''.join(seen)}")


def replica():
    return start([INC_SERVER, "--listen", "tcp://127.0.0.1:0"], r"listening on (tcp://\S+)")


def gateway(to, *flags, listen="http://127.0.0.1:0"):
    p, url = start([ORDO, "gateway", "--listen", listen, "--to", to, *flags],
                   r"listening on https?://(\S+) for")
    gateways.append(p)
    host, port = url.rsplit(":", 1)
    return p, (host, int(port))


def stop(p):
    if p.poll() is None:
        p.kill()
        p.wait(10)
    p.stdout.close()


class gw:
    pass


def setUpModule():
    reps = [replica() for _ in range(3)]
    gw.replicas = reps
    items = ",".join(url[len("tcp://"):] for _, url in reps)
    gw.route = "route+tcp://" + items
    # aperture=all: calls spread over every replica, whatever the aperture would learn from
    # the timings of a busy machine.
    _, gw.main = gateway(gw.route + "?max_concurrent=64&aperture=all", "--metrics",
                         "--max-connections", "64")
    _, gw.single = gateway(reps[0][1], "--max-connections", "8")
    _, gw.tight = gateway(gw.route, "--max-connections", "4", "--max-header-bytes", "2048",
                          "--max-body-bytes", "1024", "--request-timeout-ms", "500",
                          "--idle-timeout-ms", "700")
    _, gw.narrow = gateway(gw.route.split(",")[0] + "?max_concurrent=1&max_queued=1",
                           "--max-connections", "8")


def tearDownModule():
    # Gateways stop on SIGTERM and exit 0 (under ASan, a leak or an error makes it 1).
    bad = []
    for p in gateways:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                bad.append(f"{p.args}: still running 30 s after SIGTERM")
        if p.returncode not in (0, None):
            bad.append(f"{p.args}: exit status {p.returncode}")
    for p in procs:
        stop(p)
    if bad:
        raise AssertionError("; ".join(bad))


JSON = {"Content-Type": "application/json"}


def request(addr, method, path, body=None, headers=None, timeout=10):
    """A body is sent as JSON unless headers name another Content-Type."""
    c = http.client.HTTPConnection(*addr, timeout=timeout)
    headers = dict(headers or {})
    if body is not None and not any(k.lower() == "content-type" for k in headers):
        headers.update(JSON)
    try:
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type"), r.read().decode()
    finally:
        c.close()


def post(addr, path, body=None, headers=None, timeout=10):
    return request(addr, "POST", path, body, headers, timeout)


def post_for_headers(addr, path, body):
    """(status, the response's headers as a dict, body)"""
    c = http.client.HTTPConnection(*addr, timeout=10)
    try:
        c.request("POST", path, body=body, headers=JSON)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        c.close()


def error_of(text):
    j = json.loads(text)
    return j["code"], j["message"]


def raw_exchange(addr, data, limit=10.0):
    """Sends data on a fresh connection; returns everything read until the server closes it
    (or limit passes: then the connection was left open, and None is returned)."""
    s = socket.create_connection(addr, timeout=limit)
    try:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
        return None
    except socket.timeout:
        return None
    finally:
        s.close()


class Calls(unittest.TestCase):
    def test_a_call_returns_its_result_as_json(self):
        self.assertEqual(post(gw.main, "/inc", "[41]"), (200, "application/json", "42\n"))
        # One value for a one-parameter method; an array argument inside the params array.
        self.assertEqual(post(gw.main, "/inc", "41")[2], "42\n")
        self.assertEqual(json.loads(post(gw.main, "/echo", '[{"a":[1,2.5,"x",null,true]}]')[2]),
                         {"a": [1, 2.5, "x", None, True]})
        self.assertEqual(json.loads(post(gw.main, "/echo", "[[1,2]]")[2]), [1, 2])
        # No body: no params.
        status, _, text = post(gw.single, "/total")
        self.assertEqual(status, 200)
        int(text)

    def test_every_error_has_its_status_and_names_method_and_peer(self):
        status, _, text = post(gw.main, "/nope", "[1]")
        self.assertEqual(status, 404)
        code, msg = error_of(text)
        self.assertEqual(code, "method_not_found")
        self.assertIn("nope", msg)
        self.assertIn("route:", msg)
        status, _, text = post(gw.main, "/inc", '["x"]')
        self.assertEqual((status, error_of(text)[0]), (400, "bad_arguments"))
        self.assertIn("inc(int)", error_of(text)[1])
        status, _, text = post(gw.main, "/fail", '"account 42 is frozen"')
        self.assertEqual((status, error_of(text)[0]), (500, "remote_error"))
        self.assertIn("account 42 is frozen", error_of(text)[1])
        status, _, text = post(gw.main, "/sleep_ms?relative_slo_ms=50", "[3000]")
        self.assertEqual((status, error_of(text)[0]), (504, "timed_out"))
        # Not calls at all.
        status, _, text = post(gw.main, "/inc", "[41")
        self.assertEqual((status, error_of(text)[0]), (400, "bad_json"))
        self.assertEqual(request(gw.main, "GET", "/inc")[0], 405)
        self.assertEqual(request(gw.main, "GET", "/a/b")[0], 404)
        status, _, text = post(gw.main, "/inc?colour=red", "[1]")
        self.assertEqual((status, error_of(text)[0]), (400, "bad_parameter"))

    def test_a_full_router_queue_is_503_overloaded(self):
        async def go():
            import aiohttp
            async with aiohttp.ClientSession() as s:
                async def one():
                    async with s.post(f"http://{gw.narrow[0]}:{gw.narrow[1]}/sleep_ms",
                                      data="[3000]", headers=JSON) as r:
                        return r.status, await r.text(), r.headers.get("Retry-After")
                # 3 s calls: the four reach the router while the first still runs, however
                # slowly a busy machine starts them.
                return await asyncio.gather(*[one() for _ in range(4)])
        results = asyncio.run(go())
        over = [(t, h) for s, t, h in results if s == 503]
        self.assertTrue(over, results)
        self.assertEqual(error_of(over[0][0])[0], "overloaded")
        self.assertIn("max_queued_calls", error_of(over[0][0])[1])
        # The router's own full queue gives no hint: Retry-After is its least, 1 s.
        self.assertEqual(over[0][1], "1")

    def test_an_overloaded_backend_is_503_with_retry_after(self):
        # One call at a time on this replica (ordo-inc-server --concurrency 1): while one
        # sleeps, the next is refused at once, and the gateway says when to come back.
        # Not shared among callers (--fair-queue 0): a call over the limit is refused at once.
        _, url = start([INC_SERVER, "--listen", "tcp://127.0.0.1:0", "--concurrency", "1",
                        "--fair-queue", "0"], r"listening on (tcp://\S+)")
        _, g = gateway(url, "--max-connections", "8")
        # The held call comes on a connection of its own: behind the gateway's, it would wait
        # in that connection's queue (sleep_ms is a serial handler) rather than be refused.
        holder = subprocess.Popen([ORDO, "call", url, "sleep_ms", "5000"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # It runs once the server counts two handlers: it and the gateway's health watch
            # (which no limit refuses).
            deadline = time.monotonic() + 10
            running = 0
            while time.monotonic() < deadline and running < 2:
                out = subprocess.run([ORDO, "stats", url], capture_output=True, text=True,
                                     timeout=10).stdout
                try:
                    running = json.loads(out)["server"]["running_handlers"]
                except (ValueError, KeyError):
                    running = 0
                time.sleep(0.02)
            self.assertEqual(running, 2)
            status, headers, text = post_for_headers(g, "/sleep_ms", "[1]")
            self.assertEqual((status, error_of(text)[0]), (503, "overloaded"), text)
            self.assertIn("retry after", error_of(text)[1])
            self.assertGreaterEqual(int(headers.get("Retry-After", "0")), 1, headers)
        finally:
            holder.kill()  # its call ends with its connection
            holder.wait(30)
        # With the slot free again, calls pass, and nothing asks them to wait.
        status, headers, text = post_for_headers(g, "/inc", "[1]")
        self.assertEqual(status, 200, text)
        self.assertNotIn("Retry-After", headers)

    def test_a_lost_peer_is_502_and_no_live_replica_503(self):
        p, url = replica()
        _, lone = gateway(url, "--max-connections", "8", "--no-reconnect")
        _, routed = gateway("route+" + url, "--max-connections", "8")
        self.assertEqual(post(lone, "/inc", "[1]")[0], 200)
        self.assertEqual(post(routed, "/inc", "[1]")[0], 200)
        stop(p)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status, _, text = post(lone, "/inc", "[1]")
            if status != 200:
                break
        self.assertEqual((status, error_of(text)[0]), (502, "peer_lost"), text)
        while time.monotonic() < deadline:
            status, _, text = post(routed, "/inc", "[1]")
            if status == 503:
                break
        self.assertEqual((status, error_of(text)[0]), (503, "peer_lost"), text)
        self.assertIn("no live replica", error_of(text)[1])
        self.assertEqual(request(lone, "GET", "/-/healthz")[0], 503)


class Reconnect(unittest.TestCase):
    def test_a_restarted_backend_is_503_while_away_then_served_again(self):
        # --to tcp:// without --no-reconnect: the gateway reconnects by itself.
        p, url = replica()
        _, g = gateway(url, "--max-connections", "8")
        self.assertEqual(post(g, "/inc", "[1]")[:1], (200,))
        # A goaway notification used to end the one upstream connection for good: it is 404,
        # and a call after it is served.
        self.assertEqual(post(g, "/ordo.goaway?notify=1", '[0, "bye"]')[0], 404)
        self.assertEqual(post(g, "/inc", "[2]")[2], "3\n")
        stop(p)
        deadline = time.monotonic() + 20
        status = 200
        # A call sent as the backend died fails 502 (peer_lost: it may have run); once the
        # gateway knows the backend is away, calls are 503 at once.
        while status != 503 and time.monotonic() < deadline:
            status, _, text = post(g, "/inc", "[1]")
            self.assertIn(status, (200, 502, 503), text)
        self.assertEqual(status, 503, text)
        self.assertEqual(request(g, "GET", "/-/healthz")[0], 503)
        # The backend comes back on the same port.
        again, _ = start([INC_SERVER, "--listen", url], r"listening on (tcp://\S+)")
        while time.monotonic() < deadline:
            status, _, text = post(g, "/inc", "[41]")
            if status == 200:
                break
            time.sleep(0.05)
        self.assertEqual((status, text), (200, "42\n"))
        self.assertEqual(request(g, "GET", "/-/healthz")[0], 200)
        stop(again)


ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"
GATEWAY = "gateway-token-0123456789"


class Auth(unittest.TestCase):
    """--auth-tokens: bearer tokens at the edge, each caller's calls presenting its own token
    to a backend that authenticates (the same table), so that the backend names the caller."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.tokens = os.path.join(cls.dir, "tokens")
        with open(cls.tokens, "w") as f:
            f.write(f"{ALICE} alice\n{BOB} bob\n{GATEWAY} gateway\n")
        own = os.path.join(cls.dir, "gateway-token")
        with open(own, "w") as f:
            f.write(GATEWAY + "\n")
        for f in (cls.tokens, own):
            os.chmod(f, 0o600)  # tokens are secrets: a file others may read is refused
        _, backend = start([INC_SERVER, "--listen", "tcp://127.0.0.1:0", "--auth-tokens",
                            cls.tokens, "--allow-introspection", "gateway",
                            "--allow-introspection", "alice"],
                           r"listening on (tcp://\S+)")
        _, cls.g = gateway(backend + "?token_file=" + own, "--auth-tokens", cls.tokens,
                           "--max-connections", "8")

    def test_a_request_without_an_accepted_token_is_401(self):
        for headers in ({}, {"Authorization": "Bearer not-a-token-0123456789"},
                        {"Authorization": "Basic " + ALICE}):
            c = http.client.HTTPConnection(*self.g, timeout=10)
            c.request("POST", "/inc", body="[1]", headers={**JSON, **headers})
            r = c.getresponse()
            text = r.read().decode()
            self.assertEqual(r.status, 401, text)
            self.assertEqual(r.getheader("WWW-Authenticate"), "Bearer")
            self.assertEqual(error_of(text)[0], "unauthenticated")
            c.close()

    def test_the_backend_sees_each_caller_by_its_token(self):
        for token, subject in ((ALICE, "alice"), (BOB, "bob"), (ALICE, "alice")):
            auth = {"Authorization": "Bearer " + token}
            self.assertEqual(post(self.g, "/whoami", headers=auth)[::2], (200, f'"{subject}"\n'))
            self.assertEqual(post(self.g, "/inc", "[1]", headers=auth)[::2], (200, "2\n"))

    def test_health_needs_no_token_and_routes_ask_as_the_caller(self):
        # A stranger learns whether the backend serves, not where it is.
        status, _, text = request(self.g, "GET", "/-/healthz")
        self.assertEqual((status, json.loads(text)), (200, {"status": "ok"}))
        status, _, text = request(self.g, "GET", "/-/healthz",
                                  headers={"Authorization": "Bearer " + BOB})
        self.assertEqual(status, 200, text)
        self.assertIn("to", json.loads(text))
        self.assertEqual(request(self.g, "GET", "/-/routes")[0], 401)
        # /-/routes asks the backend as the caller: bob may not list its methods, alice may.
        status, _, text = request(self.g, "GET", "/-/routes",
                                  headers={"Authorization": "Bearer " + BOB})
        self.assertEqual((status, error_of(text)[0]), (403, "permission_denied"), text)
        status, _, text = request(self.g, "GET", "/-/routes",
                                  headers={"Authorization": "Bearer " + ALICE})
        self.assertEqual(status, 200, text)
        self.assertIn("whoami", text)

    def test_a_caller_over_its_share_of_the_backend_is_429(self):
        # The backend runs one call at a time, shared among callers with a queue of one each;
        # alice weighs 100. While alice's call runs, bob's (through the gateway) waits; when
        # alice's second comes, two wait where the limit queues one, and the caller furthest
        # over its share, bob, loses his: 429, not 503 (the backend is not full for alice).
        _, url = start([INC_SERVER, "--listen", "tcp://127.0.0.1:0", "--concurrency", "1",
                        "--fair-queue", "1", "--weight", "alice=100", "--auth-tokens",
                        self.tokens, "--allow-introspection", "gateway"],
                       r"listening on (tcp://\S+)")
        own = os.path.join(self.dir, "gateway-token")
        alice = os.path.join(self.dir, "alice-token")
        with open(alice, "w") as f:
            f.write(ALICE + "\n")
        os.chmod(alice, 0o600)
        _, g = gateway(url + "?token_file=" + own, "--auth-tokens", self.tokens,
                       "--max-connections", "8")

        def caller(name):
            """The backend's figures for caller `name` (ordo stats), or {}."""
            out = subprocess.run([ORDO, "stats", url + "?token_file=" + own],
                                 capture_output=True, text=True, timeout=10).stdout
            try:
                for c in json.loads(out)["concurrency"]["callers"]:
                    if c["caller"] == name:
                        return c
            except (ValueError, KeyError):
                pass
            return {}

        def until(cond):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not cond():
                time.sleep(0.05)
            return cond()

        holders = [subprocess.Popen([ORDO, "call", url + "?token_file=" + alice, "sleep_ms",
                                     "8000"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)]
        result = []
        try:
            self.assertTrue(until(lambda: caller("alice").get("running") == 1))
            auth = {**JSON, "Authorization": "Bearer " + BOB}

            def bob():
                c = http.client.HTTPConnection(*g, timeout=30)
                try:
                    c.request("POST", "/sleep_ms", body="[1]", headers=auth)
                    r = c.getresponse()
                    result.append((r.status, dict(r.getheaders()), r.read().decode()))
                finally:
                    c.close()
            t = threading.Thread(target=bob)
            t.start()
            self.assertTrue(until(lambda: caller("bob").get("waiting") == 1))
            holders.append(subprocess.Popen([ORDO, "call", url + "?token_file=" + alice,
                                             "sleep_ms", "1"], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
            t.join(30)
            self.assertEqual(len(result), 1)
            status, headers, text = result[0]
            self.assertEqual((status, error_of(text)[0]), (429, "overloaded"), text)
            self.assertIn("over its share", error_of(text)[1])
            self.assertIn("caller bob", error_of(text)[1])
            self.assertGreaterEqual(int(headers.get("Retry-After", "0")), 1, headers)
            self.assertEqual(caller("bob").get("refused"), 1)
        finally:
            for h in holders:
                h.kill()
                h.wait(30)

    def test_two_authorization_headers_are_400(self):
        req = (b"POST /whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + BOB.encode() +
               b"\r\nAuthorization: Bearer " + ALICE.encode() + b"\r\nContent-Length: 0\r\n\r\n")
        reply = raw_exchange(self.g, req)
        self.assertIsNotNone(reply, "the connection was left open")
        self.assertRegex(reply[:12], rb"^HTTP/1\.1 400", reply[:200])
        self.assertIn(b"more than one Authorization", reply)


class Disconnect(unittest.TestCase):
    def test_a_client_that_goes_away_cancels_its_unary_call(self):
        p, url = replica()
        _, g = gateway(url, "--max-connections", "8", "--metrics")
        sock = socket.create_connection(g, timeout=10)
        body = b"[20000]"
        sock.sendall(b"POST /sleep_ms HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        def polled(read, until=bool):
            """read(`ordo stats URL` as JSON) once until(it), within 10 s; else the last."""
            deadline = time.monotonic() + 10
            value = 0
            while time.monotonic() < deadline:
                out = subprocess.run([ORDO, "stats", url], capture_output=True, text=True,
                                     timeout=10).stdout
                try:
                    value = read(json.loads(out))
                except (ValueError, KeyError):
                    value = 0
                if until(value):
                    return value
                time.sleep(0.05)
            return value
        # The call is running on the backend before the client goes: two handlers run there,
        # the call and the gateway's router's ordo.health_watch.
        self.assertEqual(polled(lambda s: s["server"]["running_handlers"],
                                lambda n: n >= 2), 2)
        sock.close()
        # The backend's handler is cancelled (ordo.cancel), long before its 20 s.
        cancelled = polled(lambda s: s["methods"]["sleep_ms"]["errors"].get("cancelled", 0))
        self.assertEqual(cancelled, 1)
        metrics = request(g, "GET", "/metrics")[2]
        self.assertIn("ordo_gateway_calls_abandoned_total 1", metrics)
        stop(p)


class Https(unittest.TestCase):
    def test_https_with_a_certificate_and_key(self):
        d = tempfile.mkdtemp()
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                        "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        _, url = replica()
        _, g = gateway(url, "--max-connections", "8",
                       listen=f"https://127.0.0.1:0?cert={cert}&key={key}")
        ctx = ssl.create_default_context(cafile=cert)
        c = http.client.HTTPSConnection(*g, timeout=10, context=ctx)
        c.request("POST", "/inc", body="[41]", headers=JSON)
        r = c.getresponse()
        self.assertEqual((r.status, r.read().decode()), (200, "42\n"))
        c.close()
        # Plain HTTP to the https port is not served.
        plain = raw_exchange(g, b"GET /-/healthz HTTP/1.1\r\nHost: x\r\n\r\n", 5.0)
        self.assertNotIn(b"200 OK", plain or b"")
        # With ca=, a client must show a certificate that CA signed (here the same
        # self-signed one).
        _, m = gateway(url, "--max-connections", "8",
                       listen=f"https://127.0.0.1:0?cert={cert}&key={key}&ca={cert}")
        c = http.client.HTTPSConnection(*m, timeout=10, context=ctx)
        with self.assertRaises((ssl.SSLError, ConnectionError, OSError)):
            c.request("POST", "/inc", body="[1]", headers=JSON)
            c.getresponse().read()
        c.close()
        mutual = ssl.create_default_context(cafile=cert)
        mutual.load_cert_chain(cert, key)
        c = http.client.HTTPSConnection(*m, timeout=10, context=mutual)
        c.request("POST", "/inc", body="[1]", headers=JSON)
        r = c.getresponse()
        self.assertEqual((r.status, r.read().decode()), (200, "2\n"))
        c.close()
        # When the gateway closes an idle connection, the client sees the end of the stream.
        _, idle = gateway(url, "--max-connections", "8", "--idle-timeout-ms", "300",
                          listen=f"https://127.0.0.1:0?cert={cert}&key={key}")
        c = http.client.HTTPSConnection(*idle, timeout=10, context=ctx)
        c.request("POST", "/inc", body="[1]", headers=JSON)
        self.assertEqual(c.getresponse().read(), b"2\n")
        self.assertEqual(c.sock.recv(1), b"")  # the end of the stream, not the 10 s timeout
        c.close()
        # HTTPS is served in the gateway itself: it listens on its one port, with no plain
        # HTTP server relayed to on another.
        pid = gateways[-1].pid
        ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        ports = {int(m.group(1)) for m in re.finditer(r":(\d+)\s.*pid=%d," % pid, ss)}
        self.assertEqual(ports, {idle[1]}, ss)
        # Event lines name the real client, over https too (no relay in between).
        log = os.path.join(d, "events")
        with open(log, "w") as err:
            q = subprocess.Popen([ORDO, "gateway", "--listen",
                                  f"https://127.0.0.1:0?cert={cert}&key={key}", "--to", url,
                                  "--max-header-bytes", "1024"],
                                 stdout=subprocess.PIPE, stderr=err, text=True)
        procs.append(q)
        gateways.append(q)
        m = re.search(r"listening on https://(\S+):(\d+) for", q.stdout.readline())
        raw = socket.create_connection((m.group(1), int(m.group(2))), timeout=10,
                                       source_address=("127.0.0.3", 0))
        t = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        t.sendall(b"POST /inc HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
        self.assertIn(b"431", t.recv(4096))
        t.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "from tls://127.0.0.3:" not in open(log).read():
            time.sleep(0.05)
        self.assertIn("max_header_bytes (1024) from tls://127.0.0.3:", open(log).read())
        # A listen URL that names no key is refused, naming what is missing.
        p = subprocess.run([ORDO, "gateway", "--listen", f"https://127.0.0.1:0?cert={cert}",
                            "--to", url], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertIn("cert= and key=", p.stderr)


class Browsers(unittest.TestCase):
    """What a web page of another origin, or a DNS name rebound to 127.0.0.1, can do."""

    def test_no_origin_is_granted_unless_named(self):
        pre = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type"}
        c = http.client.HTTPConnection(*gw.single, timeout=10)
        c.request("OPTIONS", "/inc", headers=pre)
        r = c.getresponse()
        r.read()
        self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
        self.assertNotEqual(r.status // 100, 2)
        c.request("POST", "/inc", body="[1]", headers={**JSON, "Origin": "http://evil.example"})
        r = c.getresponse()
        r.read()
        self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
        c.close()

    def test_a_named_origin_is_granted_and_no_other(self):
        p, url = replica()
        _, g = gateway(url, "--cors-origin", "https://app.example")
        c = http.client.HTTPConnection(*g, timeout=10)
        c.request("OPTIONS", "/inc", headers={"Origin": "https://app.example",
                                              "Access-Control-Request-Method": "POST"})
        r = c.getresponse()
        r.read()
        self.assertEqual(r.status, 204)
        self.assertEqual(r.getheader("Access-Control-Allow-Origin"), "https://app.example")
        self.assertIn("POST", r.getheader("Access-Control-Allow-Methods"))
        c.request("POST", "/inc", body="[1]", headers={**JSON, "Origin": "https://app.example"})
        r = c.getresponse()
        self.assertEqual(r.read(), b"2\n")
        self.assertEqual(r.getheader("Access-Control-Allow-Origin"), "https://app.example")
        c.request("OPTIONS", "/inc", headers={"Origin": "https://evil.example",
                                              "Access-Control-Request-Method": "POST"})
        r = c.getresponse()
        r.read()
        self.assertEqual(r.status, 403)
        self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
        c.close()

    def test_a_body_that_is_not_json_is_415(self):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": ctype} if ctype else {"Content-Type": ""}
            status, _, text = post(gw.single, "/inc", "[1]", headers)
            self.assertEqual(status, 415, ctype)
            self.assertEqual(error_of(text)[0], "unsupported_media_type")
        status, _, text = post(gw.single, "/inc", "[1]",
                               {"Content-Type": "application/json; charset=utf-8"})
        self.assertEqual(status, 200, text)
        # No body: nothing to label.
        self.assertEqual(post(gw.single, "/total")[0], 200)

    def test_allow_host_refuses_other_names(self):
        p, url = replica()
        _, g = gateway(url, "--allow-host", "localhost", "--allow-host", "127.0.0.1")
        self.assertEqual(post(g, "/inc", "[1]")[0], 200)  # Host: 127.0.0.1:PORT
        status, _, text = post(g, "/inc", "[1]", {"Host": "rebound.evil.example"})
        self.assertEqual((status, error_of(text)[0]), (403, "forbidden_host"), text)
        self.assertIn("rebound.evil.example", error_of(text)[1])


class Deadlines(unittest.TestCase):
    def test_relative_and_absolute_slos_become_the_deadline(self):
        self.assertEqual(post(gw.main, "/sleep_ms?relative_slo_ms=5000", "[10]")[0], 200)
        self.assertEqual(post(gw.main, "/sleep_ms?relative_slo_ms=12.5", "[1000]")[0], 504)
        now_ms = time.time() * 1000
        self.assertEqual(post(gw.main, f"/sleep_ms?absolute_slo_ms={now_ms + 5000:.0f}",
                              "[10]")[0], 200)
        self.assertEqual(post(gw.main, f"/sleep_ms?absolute_slo_ms={now_ms + 100:.0f}",
                              "[3000]")[0], 504)
        status, _, text = post(gw.main, f"/inc?absolute_slo_ms={now_ms - 1000:.0f}", "[1]")
        self.assertEqual((status, error_of(text)[0]), (504, "timed_out"))
        self.assertIn("absolute_slo_ms had passed", text)
        self.assertEqual(post(gw.main, "/sleep_ms", "[3000]",
                              {"Ordo-Relative-Slo-Ms": "50"})[0], 504)
        self.assertEqual(post(gw.main, "/sleep_ms", "[3000]",
                              {"Ordo-Absolute-Slo-Ms": f"{now_ms + 100:.0f}"})[0], 504)

    def test_two_negative_zero_or_malformed_deadlines_are_400_with_the_reason(self):
        cases = [
            ("/inc?relative_slo_ms=10&absolute_slo_ms=99999999999999", {}, "not both"),
            ("/inc?relative_slo_ms=10", {"Ordo-Relative-Slo-Ms": "10"}, "not both"),
            ("/inc?relative_slo_ms=-5", {}, "positive"),
            ("/inc?relative_slo_ms=0", {}, "positive"),
            ("/inc?relative_slo_ms=abc", {}, "\"abc\""),
            ("/inc?absolute_slo_ms=", {}, "positive"),
            ("/inc?relative_slo_ms=1e400", {}, "positive"),
            ("/inc", {"Ordo-Absolute-Slo-Ms": "12x"}, "12x"),
        ]
        for path, headers, why in cases:
            status, _, text = post(gw.main, path, "[1]", headers)
            self.assertEqual((status, error_of(text)[0]), (400, "bad_deadline"), path)
            self.assertIn(why, error_of(text)[1], path)


class Notifications(unittest.TestCase):
    def test_a_notification_is_202_and_takes_effect_in_order(self):
        before = int(post(gw.single, "/total")[2])
        self.assertEqual(post(gw.single, "/add?notify=1", "[5]")[:1], (202,))
        self.assertEqual(post(gw.single, "/add", "[7]", {"Ordo-Notify": "1"})[0], 202)
        # The channel is ordered: the call after them sees both.
        self.assertEqual(int(post(gw.single, "/total")[2]), before + 12)


class Streams(unittest.TestCase):
    def test_a_stream_is_chunked_ndjson(self):
        c = http.client.HTTPConnection(*gw.main, timeout=10)
        c.request("POST", "/count_to", body="[5]", headers=JSON)
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.getheader("Content-Type"), "application/x-ndjson")
        self.assertEqual(r.getheader("Transfer-Encoding"), "chunked")
        self.assertEqual([json.loads(x) for x in r.read().decode().splitlines()], [0, 1, 2, 3, 4])
        # The connection stays for the next request.
        c.request("POST", "/inc", body="[1]", headers=JSON)
        self.assertEqual(c.getresponse().read(), b"2\n")
        c.close()

    def test_a_stream_that_fails_before_its_first_item_is_an_error_status(self):
        status, _, text = post(gw.main, "/count_to", '["x"]')
        self.assertEqual((status, error_of(text)[0]), (400, "bad_arguments"))

    def test_a_client_that_goes_away_cancels_its_stream(self):
        def abandoned():
            text = request(gw.main, "GET", "/metrics")[2]
            return int(re.search(r"ordo_gateway_streams_abandoned_total (\d+)", text).group(1))
        before = abandoned()
        s = socket.create_connection(gw.main, timeout=10)
        s.sendall(b"POST /count_to HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 11\r\n\r\n[100000000]")
        got = b""
        while got.count(b"\n") < 12:
            got += s.recv(4096)
        s.close()
        deadline = time.monotonic() + 20
        while abandoned() == before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(abandoned(), before + 1)
        self.assertEqual(post(gw.main, "/inc", "[1]")[0], 200)


NDJSON = {"Content-Type": "application/x-ndjson"}


def chunked(lines, per_chunk=100):
    """An NDJSON body as an iterable of chunks (http.client sends it chunked)."""
    for i in range(0, len(lines), per_chunk):
        yield "".join(f"{json.dumps(x)}\n" for x in lines[i:i + per_chunk]).encode()


class ClientStreams(unittest.TestCase):
    """An NDJSON body's lines are the items of a client or two-way stream."""

    def test_an_upload_sums_every_line_in_order(self):
        c = http.client.HTTPConnection(*gw.main, timeout=30)
        c.request("POST", "/sum", body=chunked(list(range(10000))), headers=NDJSON,
                  encode_chunked=True)
        r = c.getresponse()
        self.assertEqual((r.status, r.read()), (200, f"{sum(range(10000))}\n".encode()))
        # With a Content-Length too, a last line without its end, and blank lines; the
        # connection stays for the next request.
        c.request("POST", "/sum", body="1\n\n2\r\n 3", headers=NDJSON)
        self.assertEqual(c.getresponse().read(), b"6\n")
        c.request("POST", "/inc", body="[1]", headers=JSON)
        self.assertEqual(c.getresponse().read(), b"2\n")
        c.close()

    def test_a_two_way_stream_answers_while_its_body_is_still_coming(self):
        s = socket.create_connection(gw.single, timeout=20)
        s.sendall(b"POST /scale?params=%5B3%5D HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
        got = b""
        for i in range(1, 21):  # each echo comes back before the next line is sent
            line = f"{i}\n".encode()
            s.sendall(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            while f"\r\n{3 * i}\n".encode() not in got:
                chunk = s.recv(65536)
                self.assertTrue(chunk, got)
                got += chunk
        s.sendall(b"0\r\n\r\n")
        while not got.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            self.assertTrue(chunk, got)
            got += chunk
        s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 200 OK\r\n"), got)
        body = got.split(b"\r\n\r\n", 1)[1]
        items = [int(x) for x in re.findall(rb"\r\n(\d+)\n\r\n", body)]
        self.assertEqual(items, [3 * i for i in range(1, 21)])
        # A whole body at once: every line once, in order, while the answer streams back.
        c = http.client.HTTPConnection(*gw.main, timeout=30)
        c.request("POST", "/scale?params=%5B2%5D", body=chunked(list(range(5000))),
                  headers=NDJSON, encode_chunked=True)
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual([json.loads(x) for x in r.read().decode().splitlines()],
                         [2 * i for i in range(5000)])
        c.close()

    def test_bad_lines_and_bodies_are_refused_by_name(self):
        status, _, text = post(gw.main, "/sum", "1\n2\n{oops\n4\n", headers=NDJSON)
        self.assertEqual((status, error_of(text)[0]), (400, "bad_json"), text)
        self.assertIn("sum: line 3", error_of(text)[1])
        status, _, text = post(gw.main, "/sum", '1\n"two"\n', headers=NDJSON)
        self.assertEqual((status, error_of(text)[0]), (400, "bad_arguments"), text)
        self.assertIn("item 2", error_of(text)[1])
        # tight: --max-body-bytes 1024 bounds a line, not the body.
        ok = "".join(f"{i}\n" for i in range(1000))  # 3,890 bytes
        self.assertEqual(post(gw.tight, "/sum", ok, headers=NDJSON)[:3:2], (200, "499500\n"))
        status, _, text = post(gw.tight, "/sum", "1" * 2000 + "\n", headers=NDJSON)
        self.assertEqual((status, error_of(text)[0]), (413, "too_large"), text)
        # The shapes must match: JSON to a client stream, NDJSON to a call.
        status, _, text = post(gw.main, "/sum", "[1, 2]")
        self.assertEqual((status, error_of(text)[0]), (415, "unsupported_media_type"), text)
        self.assertIn("NDJSON", error_of(text)[1])
        status, _, text = post(gw.main, "/inc", "1\n", headers=NDJSON)
        self.assertEqual((status, error_of(text)[0]), (400, "not_a_client_stream"), text)
        status, _, text = post(gw.main, "/inc?params=%5B1%5D", "[1]")
        self.assertEqual((status, error_of(text)[0]), (400, "bad_parameter"), text)

    def test_a_body_that_comes_with_its_head_is_taken_by_lines_and_close_is_kept(self):
        # Head and 3,890 bytes of short lines in one write, to a gateway whose --max-body-bytes
        # is 1024: a line is bounded, not the body; Connection: close closes after the answer.
        body = "".join(f"{i}\n" for i in range(1000)).encode()
        out = raw_exchange(gw.tight, b"POST /sum HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                           b"Content-Type: application/x-ndjson\r\nContent-Length: " +
                           str(len(body)).encode() + b"\r\n\r\n" + body, limit=10)
        self.assertIsNotNone(out, "the connection was left open")
        self.assertTrue(out.startswith(b"HTTP/1.1 200 OK"), out)
        self.assertTrue(out.endswith(b"\r\n\r\n499500\n"), out)

    def test_a_two_way_body_that_stops_ends_with_request_timeout(self):
        # tight: --idle-timeout-ms 700.
        s = socket.create_connection(gw.tight, timeout=20)
        s.sendall(b"POST /scale?params=%5B5%5D HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n1\n\r\n")
        got = b""
        deadline = time.monotonic() + 15
        while not got.endswith(b"0\r\n\r\n") and time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()
        self.assertIn(b"\r\n5\n\r\n", got)  # the echo, then the end with why
        self.assertIn(b'"code":"request_timeout"', got)
        self.assertTrue(got.endswith(b"0\r\n\r\n"), got)

    def test_a_client_that_goes_away_cancels_its_upload(self):
        def abandoned():
            text = request(gw.main, "GET", "/metrics")[2]
            return int(re.search(r"ordo_gateway_streams_abandoned_total (\d+)", text).group(1))
        before = abandoned()
        s = socket.create_connection(gw.main, timeout=10)
        s.sendall(b"POST /sum HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n4\r\n1\n2\n\r\n")
        time.sleep(0.2)
        s.close()
        deadline = time.monotonic() + 20
        while abandoned() == before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(abandoned(), before + 1)


class Introspection(unittest.TestCase):
    def test_routes_lists_methods_and_marks_streams(self):
        status, _, text = request(gw.main, "GET", "/-/routes")
        self.assertEqual(status, 200)
        routes = {r["method"]: r for r in json.loads(text)["routes"]}
        self.assertEqual(routes["inc"], {"method": "inc", "path": "/inc", "params": "(int)",
                                         "stream": False, "shape": "call"})
        self.assertTrue(routes["count_to"]["stream"])
        self.assertFalse(routes["echo"]["stream"])
        # Streams both ways: "stream" when the answer streams; "shape" says which.
        self.assertEqual([routes[m]["shape"] for m in ("count_to", "sum", "scale")],
                         ["stream", "client_stream", "two_way_stream"])
        self.assertEqual([routes[m]["stream"] for m in ("sum", "scale")], [False, True])

    def test_healthz_and_metrics(self):
        status, _, text = request(gw.main, "GET", "/-/healthz")
        self.assertEqual((status, json.loads(text)["status"]), (200, "ok"))
        status, ctype, text = request(gw.main, "GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith("text/plain"))
        self.assertRegex(text, r'ordo_gateway_requests_total\{status="2xx"\} [1-9]')
        self.assertIn("ordo_gateway_router_expired_in_queue_total", text)
        # Not served unless asked for.
        self.assertEqual(request(gw.single, "GET", "/metrics")[0], 404)

    def test_healthz_says_what_the_backend_says_of_its_health(self):
        # A replica that warms up says not_serving first (ordo.health), then serving.
        p, url = start([INC_SERVER, "--listen", "tcp://127.0.0.1:0", "--warm-up-ms", "3000"],
                       r"listening on (tcp://\S+)")
        _, g = gateway(url, "--max-connections", "8")
        status, _, text = request(g, "GET", "/-/healthz")
        self.assertEqual(status, 503, text)
        self.assertIn("not serving", json.loads(text)["message"])
        # The gateway's router sends it no call meanwhile: it has no replica that serves.
        status, _, text = post(g, "/inc", "[1]")
        self.assertEqual((status, error_of(text)[0]), (503, "peer_lost"), text)
        self.assertIn("1 not serving", error_of(text)[1])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, _, text = request(g, "GET", "/-/healthz")
            if status == 200:
                break
            time.sleep(0.1)
        self.assertEqual((status, json.loads(text)["status"]), (200, "ok"), text)
        stop(p)


class Connections(unittest.TestCase):
    def test_keep_alive_serves_many_calls_on_one_connection(self):
        c = http.client.HTTPConnection(*gw.main, timeout=10)
        c.connect()
        sock = c.sock
        for i in range(200):
            c.request("POST", "/inc", body=str(i), headers=JSON)
            self.assertEqual(c.getresponse().read(), f"{i + 1}\n".encode())
        self.assertIs(c.sock, sock)
        c.close()

    def test_pipelined_requests_are_answered_in_order(self):
        s = socket.create_connection(gw.main, timeout=10)
        s.sendall(b"".join(b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%d"
                           % (len(str(i)), i) for i in range(3)))
        got = b""
        deadline = time.monotonic() + 10
        while got.count(b"HTTP/1.1 200") < 3 or not got.endswith(b"\n"):
            if time.monotonic() > deadline:
                break
            got += s.recv(4096)
        s.close()
        self.assertEqual(re.findall(rb"\r\n\r\n(\d+)\n", got), [b"1", b"2", b"3"])

    def test_calls_from_many_connections_run_at_once_through_the_channel(self):
        async def go():
            import aiohttp
            conn = aiohttp.TCPConnector(limit=30)
            async with aiohttp.ClientSession(connector=conn) as s:
                async def one():
                    async with s.post(f"http://{gw.main[0]}:{gw.main[1]}/sleep_ms",
                                      data="[500]", headers=JSON) as r:
                        return r.status
                t0 = time.monotonic()
                statuses = await asyncio.gather(*[one() for _ in range(30)])
                return statuses, time.monotonic() - t0
        statuses, took = asyncio.run(go())
        self.assertEqual(statuses, [200] * 30)
        # sleep_ms is a serial handler: each replica runs one at a time, so 30 calls take
        # 5 s over the three replicas, and 15 s one after another (or on one replica).
        self.assertLess(took, 11)


class Hostile(unittest.TestCase):
    """Requests that must break neither the gateway nor the upstream connection its clients
    share: each is refused, then a normal call through the same gateway still works."""

    def assert_still_serving(self):
        status, _, body = post(gw.single, "/inc", "41")
        self.assertEqual((status, body), (200, "42\n"))

    def test_deep_bodies_are_refused_by_name_and_never_reach_the_backend(self):
        # 70 deep made the backend close the shared connection (its max_depth is 64); 300
        # deep crashed the gateway (a recursive conversion on a 100 KiB thread stack).
        for depth in (70, 300, 100000):
            body = "[" * depth + "]" * depth
            status, _, text = post(gw.single, "/echo", body)
            self.assertEqual(status, 413, text)
            code, message = error_of(text)
            self.assertEqual(code, "too_large")
            self.assertIn("max_depth", message)
            self.assert_still_serving()
        # As deep as the server takes (64, with the message's own array around the params).
        body = "[" * 63 + "]" * 63
        status, _, text = post(gw.single, "/echo", body)
        self.assertEqual(status, 200, text)
        self.assertEqual(json.loads(text), json.loads("[" * 62 + "]" * 62))
        self.assert_still_serving()

    def test_numbers_json_cannot_hold_are_400_bad_json(self):
        # 1e400 overflows a double: the parser's out_of_range used to escape as a 500.
        for body in ("[1e400]", "[-1e400]"):
            status, _, text = post(gw.single, "/echo", body)
            self.assertEqual((status, error_of(text)[0]), (400, "bad_json"), text)
        self.assert_still_serving()

    def test_reserved_methods_are_not_found(self):
        for path, body in (("/ordo.goaway?notify=1", '[0, "bye"]'), ("/ordo.cancel?notify=1", "[1]"),
                           ("/ordo.stats", "[]"), ("/ordo.methods", "[]")):
            status, _, text = post(gw.single, path, body)
            self.assertEqual(status, 404, path + ": " + text)
            code, message = error_of(text)
            self.assertEqual(code, "not_found")
            self.assertIn("--expose-admin", message)
        self.assert_still_serving()

    def test_ambiguous_body_lengths_are_400_and_close_the_connection(self):
        for headers in (b"Content-Length: 1\r\nContent-Length: 2\r\n",
                        b"Content-Length: 1, 1\r\n",
                        b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n",
                        # Digits only (RFC 9110 section 8.6): not +1, not 1abc.
                        b"Content-Length: +1\r\n",
                        b"Content-Length: 1abc\r\n",
                        # Whitespace before the colon (RFC 9112 section 5.1).
                        b"Content-Length : 1\r\n"):
            req = b"POST /inc HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n1"
            reply = raw_exchange(gw.single, req)
            self.assertIsNotNone(reply, "the connection was left open")
            self.assertRegex(reply[:12], rb"^HTTP/1\.[01] 400", reply[:200])
            self.assertIn(b"RFC 9112", reply)
        self.assert_still_serving()


class Limits(unittest.TestCase):
    def assert_closed_with(self, reply, status, why):
        self.assertIsNotNone(reply, "the connection was left open")
        # (HTTP/1.0 or 1.1: the status line of a request that could not be read.)
        self.assertRegex(reply[:12], rb"^HTTP/1\.[01] %d" % status, reply[:200])
        self.assertIn(why.encode(), reply)

    def test_headers_over_the_limit_close_that_connection_with_431(self):
        other = http.client.HTTPConnection(*gw.tight, timeout=10)
        other.request("POST", "/inc", body="1", headers=JSON)
        self.assertEqual(other.getresponse().read(), b"2\n")
        big = b"POST /inc HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3000 + b"\r\n\r\n"
        self.assert_closed_with(raw_exchange(gw.tight, big), 431, "max_header_bytes")
        huge = b"POST /inc HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n"
        # However far over the limit: counted as they come, refused by name (RFC 6585's 431).
        self.assert_closed_with(raw_exchange(gw.tight, huge), 431, "max_header_bytes")
        # The other connection is untouched.
        other.request("POST", "/inc", body="2", headers=JSON)
        self.assertEqual(other.getresponse().read(), b"3\n")
        other.close()

    def test_a_body_over_the_limit_closes_that_connection_with_413(self):
        req = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"1" * 5000
        self.assert_closed_with(raw_exchange(gw.tight, req), 413, "max_body_bytes")
        chunk = b"[" + b"1," * 600 + b"1]"
        req = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(chunk) + chunk + b"\r\n0\r\n\r\n")
        self.assert_closed_with(raw_exchange(gw.tight, req), 413, "max_body_bytes")

    def test_slow_headers_and_slow_bodies_are_closed_with_408(self):
        s = socket.create_connection(gw.tight, timeout=10)
        t0 = time.monotonic()
        s.sendall(b"POST /inc HTTP/1.1\r\n")
        got = b""
        try:
            for _ in range(60):  # a header byte every 100 ms, never finishing
                s.sendall(b"X")
                time.sleep(0.1)
        except OSError:
            pass
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        s.close()
        self.assertRegex(got[:12], rb"^HTTP/1\.[01] 408", got[:200])
        self.assertIn(b"request_timeout", got)
        self.assertLess(time.monotonic() - t0, 8)
        req = b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n[4"
        self.assert_closed_with(raw_exchange(gw.tight, req), 408, "request_timeout")

    def test_connections_over_the_limit_are_refused_with_503(self):
        held = []
        for i in range(4):
            c = http.client.HTTPConnection(*gw.tight, timeout=10)
            c.request("POST", "/inc", body=str(i), headers=JSON)
            self.assertEqual(c.getresponse().read(), f"{i + 1}\n".encode())
            held.append(c)
        reply = raw_exchange(gw.tight, b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        self.assert_closed_with(reply, 503, "max_connections")
        for i, c in enumerate(held):
            c.request("POST", "/inc", body=str(i), headers=JSON)
            self.assertEqual(c.getresponse().read(), f"{i + 1}\n".encode())
            c.close()

    def test_silent_connections_make_room_for_real_requests(self):
        # Strangers that never send a whole request do not hold the gateway: at
        # max_connections, the oldest of them is closed for a new connection.
        silent = [socket.create_connection(gw.tight, timeout=10) for _ in range(4)]
        try:
            status, _, text = post(gw.tight, "/inc", "41")
            self.assertEqual((status, text), (200, "42\n"))
            # The oldest was closed to make room.
            self.assertEqual(silent[0].recv(1), b"")
        finally:
            for s in silent:
                s.close()

    def test_connections_per_address_are_capped(self):
        p, url = replica()
        _, g = gateway(url, "--max-connections-per-address", "2")
        held = []
        for i in range(2):
            c = http.client.HTTPConnection(*g, timeout=10)
            c.request("POST", "/inc", body=str(i), headers=JSON)
            self.assertEqual(c.getresponse().read(), f"{i + 1}\n".encode())
            held.append(c)
        reply = raw_exchange(g, b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        self.assert_closed_with(reply, 503, "max_connections_per_address")
        # Another address of 127.0.0.0/8 is served.
        s = socket.create_connection(g, timeout=10, source_address=("127.0.0.2", 0))
        s.sendall(b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1\r\nConnection: close\r\n\r\n1")
        got = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got)
        for c in held:
            c.close()
        stop(p)

    def test_an_idle_connection_is_closed_after_idle_timeout(self):
        s = socket.create_connection(gw.tight, timeout=10)
        s.sendall(b"POST /inc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1\r\n\r\n1")
        got = b""
        while not got.endswith(b"2\n"):
            got += s.recv(4096)
        t0 = time.monotonic()
        self.assertEqual(s.recv(4096), b"")  # closed by the server, not by the 10 s timeout
        self.assertLess(time.monotonic() - t0, 5)
        s.close()


if __name__ == "__main__":
    ORDO, INC_SERVER = sys.argv[1], sys.argv[2]
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
