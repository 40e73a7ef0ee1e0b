#!/usr/bin/python3
"""A Dask comm moving large messages, ordo:// against tcp:// in one run (bench/README.md,
"Dask"):

    PYTHONPATH=build/python /usr/bin/python3 bench/python/dask_comm.py [--runs 3]
        [--mb 20] [--count 20] [--json FILE]

Per run and protocol, on one comm made by Dask's own connect() and listen() on loopback:
- up: the connector writes --count messages of --mb MB (``{"op": "data", "x":
  to_serialize(bytes)}``, as a worker's get_data answer carries its data) and the listener reads
  them; MB/s from the first write to the last read;
- down: the same from the listener to the connector;
- small while large: while the connector writes the large messages, the listener sends a small
  message and the connector answers it on a second comm; its round trip p50 and max.
The two protocols interleave run after run; medians of the runs, and ordo/tcp.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from distributed.comm import connect, listen
from distributed.protocol import to_serialize


def payload(mb: int) -> bytes:
    return bytes(range(256)) * (mb * 1_000_000 // 256)


async def one_way(scheme: str, mb: int, count: int, down: bool) -> float:
    """MB/s of `count` messages of `mb` MB over one comm, up (connector -> listener) or down."""
    data = payload(mb)
    done: asyncio.Future = asyncio.get_running_loop().create_future()

    async def handle(comm):
        try:
            if down:
                await comm.read()  # "go"
                for _ in range(count):
                    await comm.write({"op": "data", "x": to_serialize(data)})
            else:
                for _ in range(count):
                    msg = await comm.read()
                    assert len(msg["x"]) == len(data)
                done.set_result(time.perf_counter())
            await comm.read()  # the connector's close
        except Exception as e:  # noqa: BLE001 - reported by the run
            if not done.done():
                done.set_exception(e)
        finally:
            await comm.close()

    async with listen(f"{scheme}127.0.0.1:0", handle) as lst:
        comm = await connect(lst.contact_address)
        t0 = time.perf_counter()
        if down:
            await comm.write({"op": "go"})
            for _ in range(count):
                msg = await comm.read()
                assert len(msg["x"]) == len(data)
            t1 = time.perf_counter()
        else:
            for _ in range(count):
                await comm.write({"op": "data", "x": to_serialize(data)})
            t1 = await asyncio.wait_for(done, 120)
        await comm.close()
    return mb * count / (t1 - t0)


async def small_while_large(scheme: str, mb: int, count: int) -> list[float]:
    """Round trips (ms) of small messages on one comm while the listener reads large ones from
    another comm of the same connector process."""
    data = payload(mb)
    rtts: list[float] = []
    all_read = asyncio.Event()

    async def handle(comm):
        try:
            while True:
                msg = await comm.read()
                if msg["op"] == "ping":
                    await comm.write({"op": "pong"})
                elif msg["op"] == "data":
                    handle.large += 1
                    if handle.large == count:
                        all_read.set()
        except Exception:  # noqa: BLE001 - the connector closed
            pass
        finally:
            await comm.close()
    handle.large = 0

    async with listen(f"{scheme}127.0.0.1:0", handle) as lst:
        big = await connect(lst.contact_address)
        small = await connect(lst.contact_address)

        async def writer():
            for _ in range(count):
                await big.write({"op": "data", "x": to_serialize(data)})

        w = asyncio.ensure_future(writer())
        deadline = time.monotonic() + 60
        while not all_read.is_set() and time.monotonic() < deadline and len(rtts) < 10_000:
            t = time.perf_counter()
            await small.write({"op": "ping"})
            await small.read()
            rtts.append((time.perf_counter() - t) * 1e3)
            await asyncio.sleep(0.001)
        await w
        await asyncio.wait_for(all_read.wait(), 60)
        await big.close()
        await small.close()
    return rtts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--protocols", default="tcp://,ordo://")
    ap.add_argument("--json")
    a = ap.parse_args()
    protocols = a.protocols.split(",")
    res: dict = {p: {"up": [], "down": [], "small_p50": [], "small_max": []} for p in protocols}
    for _ in range(a.runs):
        for p in protocols:
            r = res[p]
            r["up"].append(asyncio.run(one_way(p, a.mb, a.count, down=False)))
            r["down"].append(asyncio.run(one_way(p, a.mb, a.count, down=True)))
            rtts = asyncio.run(small_while_large(p, a.mb, a.count))
            r["small_p50"].append(statistics.median(rtts))
            r["small_max"].append(max(rtts))
    med = {p: {k: statistics.median(v) for k, v in r.items()} for p, r in res.items()}
    print(f"{a.mb} MB messages, {a.count} per run, medians of {a.runs} runs:")
    for p in protocols:
        m = med[p]
        print("  %-8s up %7.0f MB/s  down %7.0f MB/s  small beside: p50 %6.2f ms, max %7.2f ms"
              % (p, m["up"], m["down"], m["small_p50"], m["small_max"]))
    if "tcp://" in med and "ordo://" in med:
        o, t = med["ordo://"], med["tcp://"]
        print("  ordo/tcp: up %.2fx  down %.2fx" % (o["up"] / t["up"], o["down"] / t["down"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": res, "medians": med, "mb": a.mb, "count": a.count}, f, indent=1)


if __name__ == "__main__":
    main()
