"""Streams both ways from Python: Channel.upload and Channel.two_way against ordo's C++ server and
against Python handlers registered with reads=True (docs/protocol.md, "Streams both ways")."""
import asyncio
import time
import tracemalloc

import pytest

import ordo
from conftest import cut_proxy, inc_server, stop_cut_proxy


async def eventually(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def reading_server():
    srv = ordo.Server()
    seen = {"ended": None, "read": 0}

    @srv.method(reads=True)
    async def total(items, start: int) -> int:
        n = start
        async for x in items:
            n += x
            seen["read"] += 1
        return n

    @srv.method(reads=True)
    async def echo(items, k: int):
        async for x in items:
            yield x * k

    @srv.method(reads=True)
    async def stall(items) -> int:  # reads nothing until cancelled
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["ended"] = "cancelled"
            raise
        return 0

    @srv.method(reads=True)
    async def first_three(items) -> list:  # answers before the caller has finished
        got = []
        async for x in items:
            got.append(x)
            if len(got) == 3:
                return got
        return got

    @srv.method(reads=True)
    async def boom(items) -> int:
        async for x in items:
            if x == 5:
                raise ValueError("five is too many")
        return 0

    @srv.method(reads=True)
    async def watch(items) -> int:  # records how its caller's items ended
        try:
            async for _ in items:
                seen["read"] += 1
        except ordo.OrdoError as e:
            seen["ended"] = e
            raise
        seen["ended"] = "closed"
        return seen["read"]

    return srv, seen


@pytest.mark.parametrize("server", ["cpp", "python"])
async def test_an_upload_and_a_two_way_stream_keep_their_order(server, cpp_server):
    if server == "cpp":  # ordo-inc-server: sum (a client stream), scale(k) (two-way)
        url, srv, up_method, tw_method, start = cpp_server.url, None, "sum", "scale", ()
    else:
        srv, _ = reading_server()
        url, up_method, tw_method, start = await srv.listen("tcp://127.0.0.1:0"), "total", \
            "echo", (0,)
    ch = await ordo.connect(url)
    up = ch.upload(up_method, *start, timeout=60)
    for i in range(20000):
        assert await up.write(i)
    assert await up.finish() == sum(range(20000))
    assert up.written == 20000

    s = ch.two_way(tw_method, 3, timeout=60)

    async def writer():
        for i in range(30000):
            assert await s.write(i)
        s.close()

    w = asyncio.ensure_future(writer())
    got = [x async for x in s]
    await w
    assert got == [3 * i for i in range(30000)]
    ch.close()
    if srv is not None:
        await srv.stop()


async def test_a_python_two_way_handler_held_by_its_callers_window_goes_on():
    # The handler's writes wait for credit (window=2) while the caller's items and its close
    # arrive; once the caller reads, every echo comes.
    srv, _ = reading_server()
    ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
    s = ch.two_way("echo", 2, window=2)
    for i in range(10):
        assert await s.write(i)
    s.close()
    await asyncio.sleep(0.5)  # the handler is held at the window meanwhile

    async def read_all():
        return [x async for x in s]

    assert await asyncio.wait_for(read_all(), 30) == [2 * i for i in range(10)]
    ch.close()
    await srv.stop()


async def test_a_handler_that_does_not_read_holds_the_writer():
    srv, seen = reading_server()
    ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
    up = ch.upload("stall")
    item = b"x" * 65536

    async def writer():
        for _ in range(1000):
            await up.write(item)

    w = asyncio.ensure_future(writer())
    # Held: the server's window (1 MiB), the Reader's room (1 MiB), what waits on its way to
    # the connection (1 MiB) and an item or two of each: under 64 items of 64 KiB, never 1000.
    await eventually(lambda: up.written >= 16, "the first window")
    held, deadline = -1, time.monotonic() + 30
    while up.written != held:  # until it has stood still for a second (a loaded machine is slow)
        assert time.monotonic() < deadline, "the writer never stopped"
        held = up.written
        await asyncio.sleep(1.0)
    assert held < 64, held
    assert not w.done()
    more = [asyncio.ensure_future(up.write(item)) for _ in range(3)]  # writers waiting together
    await asyncio.sleep(0.2)
    up.cancel()  # the caller's cancel ends the handler
    await eventually(lambda: seen["ended"] == "cancelled", "the handler's cancellation")
    with pytest.raises(ordo.Cancelled):
        await up.finish()
    await w  # its writes return False from the end on
    # Every writer that waited is woken by the end: none is left waiting.
    assert all(isinstance(r, bool) for r in await asyncio.wait_for(asyncio.gather(*more), 10))
    ch.close()
    await srv.stop()


async def test_an_early_answer_ends_the_writes_and_an_error_names_the_method():
    srv, _ = reading_server()
    ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
    up = ch.upload("first_three")
    results = []
    for i in range(100000):
        ok = await up.write(i)
        results.append(ok)
        if not ok:
            break
    assert results[-1] is False  # the answer came first: later writes say so
    assert await up.finish() == [0, 1, 2]

    bad = ch.upload("boom")
    for i in range(10):
        if not await bad.write(i):
            break
    with pytest.raises(ordo.RemoteError, match="five is too many") as e:
        await bad.finish()
    assert "boom" in str(e.value)

    s = ch.two_way("scale_nothing")  # no such method: the reader gets the error
    with pytest.raises(ordo.MethodNotFound):
        async for _ in s:
            pass
    ch.close()
    await srv.stop()


async def test_a_caller_that_goes_ends_the_handlers_read_with_peer_lost():
    srv, seen = reading_server()
    ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
    up = ch.upload("watch")
    for i in range(10):
        await up.write(i)
    await eventually(lambda: seen["read"] == 10, "the items read")
    ch.close()  # the connection ends with the stream still open
    await eventually(lambda: seen["ended"] is not None, "the handler's read to end")
    assert isinstance(seen["ended"], ordo.PeerLost), seen["ended"]

    seen["ended"], seen["read"] = None, 0
    ch = await ordo.connect(srv_url := await srv.listen("tcp://127.0.0.1:0"))
    up = ch.upload("watch")
    for i in range(7):
        await up.write(i)
    assert await up.finish() == 7 and seen["ended"] == "closed", srv_url
    ch.close()
    await srv.stop()


async def test_a_two_way_stream_survives_cuts_exactly_once(cpp_server):
    proxy = cut_proxy(cpp_server.url)
    cuts = 0
    try:
        ch = await ordo.connect(proxy.url + "?resume_ms=10000")
        s = ch.two_way("scale", 2, timeout=60)

        async def writer():
            for i in range(20000):
                assert await s.write(i)
            s.close()

        w = asyncio.ensure_future(writer())
        got = [x async for x in s]
        await w
        assert got == [2 * i for i in range(20000)]  # none lost, none twice, in order
        ch.close()
    finally:
        cuts = stop_cut_proxy(proxy)
    assert cuts >= 3, cuts


async def test_a_stream_through_a_router_stays_on_one_replica():
    a, b = inc_server("--listen", "tcp://127.0.0.1:0"), inc_server("--listen", "tcp://127.0.0.1:0")
    try:
        hosts = ",".join(u.removeprefix("tcp://") for u in (a.url, b.url))
        ch = await ordo.connect(f"route+tcp://{hosts}?policy=round_robin")
        for k in range(4):  # round robin: the streams go to both replicas, each to one
            up = ch.upload("sum", key=f"k{k}", timeout=30)
            for i in range(2000):
                assert await up.write(1)
            assert await up.finish() == 2000
        ch.close()
    finally:
        a.stop()
        b.stop()


async def test_a_callers_big_bin_that_ends_its_item_is_sent_from_where_it_is():
    # ordo.packb_split: the item's front is copied, its last big bin (bytes that cannot change)
    # is sent from its object. Packed whole, the write would make a 16 MiB bytes object.
    srv = ordo.Server()

    @srv.method(reads=True, zero_copy=True)
    async def sizes(items) -> list:
        return [[x[0], len(x[1])] async for x in items]

    ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
    up = ch.upload("sizes")
    big = bytes(16 << 20)
    tracemalloc.start()
    try:
        await up.write([1, big])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    up.close()
    assert await asyncio.wait_for(up.finish(), 30) == [[1, 16 << 20]]
    ch.close()
    await srv.stop()
