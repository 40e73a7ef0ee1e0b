"""ordo's Python binding beside Dask's comm layer and a pure-asyncio msgpack-rpc client, in one
run (bench/README.md, "Python"):

    PYTHONPATH=build/python /usr/bin/python3 bench/python/bench_python.py [--build build]
        [--scale 1] [--json FILE]

- W1, one-way messages/s: ordo notify("add", 1) to the C++ server (examples/ordo-inc-server),
  against Dask's BatchedSend (interval 2 ms) to Dask's Server; timed until the server has
  counted every message (ordo: a total() call after them; Dask: total() polled every 1 ms).
- W2, sequential call p50 (and p99): ordo inc(i) to the C++ server, against Dask's
  ConnectionPool (rpc) to Dask's Server.
- W3, calls/s with 256 in flight: the same two, and a pure-asyncio msgpack-rpc client
  (asyncio_rpc.py) to the C++ server.
- Python servers, 256 in flight: ordo.Server against Dask's Server, each in a process of its own,
  each driven by its own Python client (ordo's client; Dask's ConnectionPool), and ordo.Server
  also driven by ordo-inc-client (C++). ordo's inc is concurrent=True (as Dask's handlers have
  no order between the calls of one connection); the same handler serial is shown too.
Every server runs in its own process; the clients run here, one after the other.
"""
import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import asyncio_rpc  # noqa: E402
import ordo  # noqa: E402

INFLIGHT = 256
DEADLINE_S = 120  # no workload may run longer


class Proc:
    def __init__(self, args, env=None):
        self.p = subprocess.Popen([str(a) for a in args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        line = self.p.stdout.readline()
        if not line.startswith("listening on"):
            raise RuntimeError(f"{args} did not start: {line!r}")
        self.url = line.split()[-1]

    def stop(self):
        self.p.stdin.close()
        try:
            self.p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.p.stdout.close()


async def one_way(send, flush, count, n):
    """Sends n messages, letting the loop run every 1000 (a background writer needs it)."""
    base = await count()
    t0 = time.perf_counter()
    for i in range(n):
        send()
        if i % 1000 == 999:
            await asyncio.sleep(0)
    await flush(base + n)
    return n / (time.perf_counter() - t0)


async def sequential(call, n):
    lat = []
    for i in range(n):
        t = time.perf_counter_ns()
        r = await call(i)
        lat.append(time.perf_counter_ns() - t)
        assert r == i + 1, r
    lat.sort()
    return statistics.median(lat) / 1000, lat[int(len(lat) * 0.99)] / 1000


async def in_flight(call, n, k=INFLIGHT):
    it = iter(range(n))

    async def worker():
        for i in it:
            r = await call(i)
            assert r == i + 1, r
    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(k))), DEADLINE_S)
    return n / (time.perf_counter() - t0)


async def ordo_client(url, n):
    ch = await ordo.connect(url)
    out = {}

    async def until(want):
        got = await ch.total()
        assert got == want, (got, want)
    out["w1"] = await one_way(lambda: ch.notify("add", 1), until, ch.total, n["w1"])
    out["w2"] = await sequential(ch.inc, n["w2"])
    out["w3"] = await in_flight(ch.inc, n["w3"])
    ch.close()
    return out


async def ordo_w3(url, n):
    ch = await ordo.connect(url)
    w3 = await in_flight(ch.inc, n["w3"])
    serial = await in_flight(ch.inc_serial, n["w3"] // 4)
    ch.close()
    return w3, serial


async def dask_client(addr, n):
    from distributed.batched import BatchedSend
    from distributed.comm import connect
    from distributed.core import ConnectionPool
    pool = await ConnectionPool(limit=2 * INFLIGHT)
    r = pool(addr)
    out = {}
    comm = await connect(addr)
    await comm.write({"op": "connection_stream", "reply": False})
    bs = BatchedSend(interval="2ms")
    bs.start(comm)

    async def count():
        return await pool(addr).total()

    async def until(want):
        deadline = time.monotonic() + DEADLINE_S
        while await count() != want:
            assert time.monotonic() < deadline, "Dask's server did not count every message"
            await asyncio.sleep(0.001)
    out["w1"] = await one_way(lambda: bs.send({"op": "add", "x": 1}), until, count, n["w1"])
    out["w2"] = await sequential(lambda i: r.inc(x=i), n["w2"])
    out["w3"] = await in_flight(lambda i: pool(addr).inc(x=i), n["w3"])
    await bs.close()
    await pool.close()
    return out


async def asyncio_client(url, n):
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    c = await asyncio_rpc.Client.connect(host, int(port))
    w3 = await in_flight(lambda i: c.call("inc", i), n["w3"])
    c.close()
    return w3


def cpp_client_on(build, url, n):
    out = subprocess.run([build / "examples" / "ordo-inc-client", "--connect", url, "--calls",
                          str(n), "--inflight", str(INFLIGHT), "--timeout-ms", "60000"],
                         capture_output=True, text=True, timeout=DEADLINE_S, check=True).stdout
    return float(out.split("(")[1].split()[0])  # "ok N calls in S s (R calls/s)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json", help="also write the figures here, as JSON")
    a = ap.parse_args()
    build = pathlib.Path(a.build)
    n = {k: max(50, int(v * a.scale)) for k, v in
         {"w1": 300_000, "w2": 3000, "w3": 30_000}.items()}
    env = dict(os.environ, PYTHONPATH=str(build / "python"))
    py = sys.executable
    res = {"n": n}
    cpp = Proc([build / "examples" / "ordo-inc-server", "--listen", "tcp://127.0.0.1:0"])
    dask = Proc([py, HERE / "servers.py", "dask"], env)
    pyo = Proc([py, HERE / "servers.py", "ordo"], env)
    try:
        res["ordo"] = asyncio.run(ordo_client(cpp.url, n))
        res["asyncio_w3"] = asyncio.run(asyncio_client(cpp.url, n))
        res["dask"] = asyncio.run(dask_client(dask.url, n))
        res["ordo_py_server_w3"], res["ordo_py_server_serial_w3"] = \
            asyncio.run(ordo_w3(pyo.url, n))
        res["ordo_py_server_cpp_client_w3"] = cpp_client_on(build, pyo.url, n["w3"])
    finally:
        for p in (cpp, dask, pyo):
            p.stop()
    o, d = res["ordo"], res["dask"]
    rows = [
        ("W1 one-way msgs/s", f"{o['w1']:,.0f}", f"{d['w1']:,.0f} (BatchedSend)",
         f"{o['w1'] / d['w1']:.1f}x", ">= 2x"),
        ("W2 sequential p50 µs", f"{o['w2'][0]:.0f} (p99 {o['w2'][1]:.0f})",
         f"{d['w2'][0]:.0f} (p99 {d['w2'][1]:.0f}) (ConnectionPool)",
         f"{o['w2'][0] / d['w2'][0]:.2f}x", "<= 0.5x"),
        ("W3 calls/s, 256 in flight", f"{o['w3']:,.0f}", f"{d['w3']:,.0f} (ConnectionPool)",
         f"{o['w3'] / d['w3']:.1f}x", ">= 10x"),
        ("W3 vs pure-asyncio msgpack-rpc", f"{o['w3']:,.0f}", f"{res['asyncio_w3']:,.0f}",
         f"{o['w3'] / res['asyncio_w3']:.1f}x", ">= 2x"),
        ("Python server, 256 in flight (Python clients)", f"{res['ordo_py_server_w3']:,.0f}",
         f"{d['w3']:,.0f} (Dask Server)", f"{res['ordo_py_server_w3'] / d['w3']:.1f}x", ">= 5x"),
        ("Python server, 256 in flight (ordo-inc-client)",
         f"{res['ordo_py_server_cpp_client_w3']:,.0f}", "", "", ""),
        ("Python server, serial handler, 256 in flight on one connection",
         f"{res['ordo_py_server_serial_w3']:,.0f}", "", "", ""),
    ]
    print("| workload | ordo (Python) | other | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res))


if __name__ == "__main__":
    main()
