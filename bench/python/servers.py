"""The Python servers the benchmark drives, each run as a process of its own:

    /usr/bin/python3 bench/python/servers.py dask    # Dask's distributed.core.Server
    /usr/bin/python3 bench/python/servers.py ordo    # ordo.Server (PYTHONPATH=build/python)

Each serves inc(x) -> x + 1, total() -> the sum of add(x) so far, and add(x) (Dask: as a
stream handler, fed by BatchedSend; ordo: a notification), prints "listening on URL", and runs
until its stdin closes.
"""
import asyncio
import sys


async def serve_dask() -> None:
    from distributed.core import Server
    state = {"total": 0}

    async def inc(x):
        return x + 1

    async def total():
        return state["total"]

    def add(x):
        state["total"] += x

    srv = Server({"inc": inc, "total": total}, stream_handlers={"add": add})
    await srv.listen("tcp://127.0.0.1:0")
    print("listening on", srv.address, flush=True)
    await until_stdin_closes()
    srv.stop()


async def serve_ordo() -> None:
    import ordo
    srv = ordo.Server()
    state = {"total": 0}

    # Concurrent, as Dask's handlers are: inc has no order to keep between the calls of one
    # connection, so the server takes every call in flight at once (a serial handler's calls
    # also cross to the loop many at a time, but run one after another).
    @srv.method(concurrent=True)
    async def inc(x: int) -> int:
        return x + 1

    @srv.method  # the same, serial: one call of the connection at a time
    async def inc_serial(x: int) -> int:
        return x + 1

    @srv.method
    async def total() -> int:
        return state["total"]

    @srv.method
    def add(x: int) -> int:
        state["total"] += x
        return state["total"]

    print("listening on", await srv.listen("tcp://127.0.0.1:0"), flush=True)
    await until_stdin_closes()
    await srv.stop()


async def until_stdin_closes() -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run({"dask": serve_dask, "ordo": serve_ordo}[sys.argv[1]]())
