#!/usr/bin/python3
"""How soon a server notices that a caller closed its connection while one of its handlers runs
for it (ordo.dask's listener always has one running per comm): the time from the caller's close
to the handler's cancellation, over tcp on loopback, against asyncio's own stream server seeing
end of stream (what Dask's tcp:// comm takes for the end). Medians of --runs.

    PYTHONPATH=build/python bench/python/closed_peer.py [--runs 20]
"""
import argparse
import asyncio
import socket
import statistics
import time

import msgpack

import ordo


async def ordo_once() -> float:
    srv = ordo.Server()
    started = asyncio.Event()
    cancelled_at: list[float] = []

    @srv.method
    async def wait() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            raise

    url = await srv.listen("tcp://127.0.0.1:0")
    s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    s.sendall(msgpack.packb([0, 1, "wait", []]))
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.monotonic()
    s.close()
    while not cancelled_at and time.monotonic() - t0 < 20:
        await asyncio.sleep(0.0005)
    await srv.stop()
    if not cancelled_at:
        raise SystemExit("ordo: the handler was not cancelled within 20 s of the close")
    return cancelled_at[0] - t0


async def asyncio_once() -> float:
    seen: list[float] = []

    async def serve(reader, writer):
        while await reader.read(65536):
            pass
        seen.append(time.monotonic())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"x")
    await asyncio.sleep(0.01)
    t0 = time.monotonic()
    s.close()
    while not seen and time.monotonic() - t0 < 20:
        await asyncio.sleep(0.0005)
    server.close()
    await server.wait_closed()
    return seen[0] - t0


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    times = {"ordo": [], "asyncio": []}
    for _ in range(a.runs):
        times["ordo"].append(await ordo_once())
        times["asyncio"].append(await asyncio_once())
    for name, ts in times.items():
        print("%-8s closed caller noticed after: median %.2f ms, max %.2f ms (%d runs)" %
              (name, statistics.median(ts) * 1e3, max(ts) * 1e3, len(ts)))


if __name__ == "__main__":
    asyncio.run(main())
