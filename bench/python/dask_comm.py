#!/usr/bin/python3
"""A Dask comm moving large messages, ordo:// against tcp:// in one run (bench/README.md,
"Dask"):

    PYTHONPATH=build/python /usr/bin/python3 bench/python/dask_comm.py [--runs 3]
        [--mb 20] [--count 20] [--json FILE]

Per run and protocol, a listener process (this script with --serve) and this process connect
with Dask's own connect() and listen() on loopback; messages are ``{"op": "data", "x":
to_serialize(bytes)}`` of random bytes, as a worker's get_data answer carries its data:
- up: this process writes --count messages of --mb MB, then a "sync" whose answer comes once the
  listener has read them all (the comm is ordered); MB/s from the first write to that answer;
- down: the listener writes them and this process reads them; MB/s from the request to the last;
- small beside large: while this process writes the large messages on one comm, it sends a small
  message on a second comm every millisecond and the listener answers it: its round trip, p50
  and max over the transfer.
The protocols interleave run after run; medians of the runs, and ordo/tcp. The listener is
stopped by its PID.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time

from distributed.comm import connect, listen
from distributed.protocol import to_serialize


def payload(mb: int) -> bytes:
    """Random bytes: Dask compresses what compresses (lz4), which would be measured instead."""
    return random.Random(mb).randbytes(mb * 1_000_000)


async def serve(scheme: str) -> None:
    """The listener: reads and counts data, answers ping and sync, sends on request."""
    async def handle(comm):
        try:
            while True:
                msg = await comm.read()
                op = msg["op"]
                if op == "ping":
                    await comm.write({"op": "pong"})
                elif op == "sync":
                    await comm.write({"op": "synced"})
                elif op == "send":
                    data = payload(msg["mb"])
                    for _ in range(msg["count"]):
                        await comm.write({"op": "data", "x": to_serialize(data)})
        except Exception:  # noqa: BLE001 - the other side closed the comm
            pass
        finally:
            await comm.close()

    async with listen(f"{scheme}127.0.0.1:0", handle) as lst:
        print(lst.contact_address, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed


async def measure(address: str, mb: int, count: int) -> dict:
    data = payload(mb)
    comm = await connect(address)
    t = time.perf_counter()
    for _ in range(count):
        await comm.write({"op": "data", "x": to_serialize(data)})
    await comm.write({"op": "sync"})
    assert (await comm.read())["op"] == "synced"
    up = mb * count / (time.perf_counter() - t)

    t = time.perf_counter()
    await comm.write({"op": "send", "mb": mb, "count": count})
    for _ in range(count):
        assert len((await comm.read())["x"]) == len(data)
    down = mb * count / (time.perf_counter() - t)

    small = await connect(address)
    rtts: list[float] = []

    async def writer():
        for _ in range(count):
            await comm.write({"op": "data", "x": to_serialize(data)})
        await comm.write({"op": "sync"})
        await comm.read()

    w = asyncio.ensure_future(writer())
    deadline = time.monotonic() + 120
    while not w.done() and time.monotonic() < deadline and len(rtts) < 100_000:
        t = time.perf_counter()
        await small.write({"op": "ping"})
        await small.read()
        rtts.append((time.perf_counter() - t) * 1e3)
        await asyncio.sleep(0.001)
    await asyncio.wait_for(w, 120)
    await small.close()
    await comm.close()
    return {"up": up, "down": down, "small_p50": statistics.median(rtts),
            "small_max": max(rtts), "small_n": len(rtts)}


def one_run(scheme: str, mb: int, count: int) -> dict:
    srv = subprocess.Popen([sys.executable, __file__, "--serve", scheme],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = srv.stdout.readline().strip()
        if not address:
            raise SystemExit(f"the {scheme} listener did not start")
        return asyncio.run(measure(address, mb, count))
    finally:
        srv.stdin.close()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--protocols", default="tcp://,ordo://")
    ap.add_argument("--json")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        asyncio.run(serve(a.serve))
        return
    protocols = a.protocols.split(",")
    res: dict = {p: [] for p in protocols}
    for _ in range(a.runs):
        for p in protocols:
            res[p].append(one_run(p, a.mb, a.count))
    med = {p: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for p, runs in res.items()}
    print(f"{a.mb} MB messages, {a.count} per run, medians of {a.runs} runs:")
    for p in protocols:
        m = med[p]
        print("  %-8s up %6.0f MB/s  down %6.0f MB/s  small message beside them: p50 %6.2f ms, "
              "max %6.2f ms (%d)" % (p, m["up"], m["down"], m["small_p50"], m["small_max"],
                                     m["small_n"]))
    if "tcp://" in med and "ordo://" in med:
        o, t = med["ordo://"], med["tcp://"]
        print("  ordo/tcp: up %.2fx  down %.2fx  small p50 %.2fx" %
              (o["up"] / t["up"], o["down"] / t["down"], o["small_p50"] / t["small_p50"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": res, "medians": med, "mb": a.mb, "count": a.count}, f, indent=1)


if __name__ == "__main__":
    main()
