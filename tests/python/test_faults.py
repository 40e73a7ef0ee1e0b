"""Resume through a cutting proxy, uvloop, and no hang at exit."""
import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

import ordo
from conftest import cut_proxy, stop_cut_proxy


async def test_a_resumed_session_delivers_every_message_exactly_once(cpp_server):
    proxy = cut_proxy(cpp_server.url)
    cuts = 0
    try:
        ch = await ordo.connect(proxy.url + "?resume_ms=10000")
        base = await ch.total(timeout=30)
        checks = []
        for i in range(1, 3001):
            ch.notify("add", 1)
            if i % 10 == 0:  # each sees exactly the adds sent before it: none lost, none twice
                checks.append((base + i, ch.total(timeout=30)))
            if i % 300 == 0:
                await asyncio.sleep(0)
        incs = await asyncio.gather(*(ch.inc(i, timeout=30) for i in range(500)))
        assert incs == [i + 1 for i in range(500)]
        for want, call in checks:
            assert await call == want
        ch.close()
    finally:
        cuts = stop_cut_proxy(proxy)
    assert cuts >= 3, cuts


async def test_the_same_calls_run_under_uvloop(cpp_server):
    uvloop = pytest.importorskip("uvloop")

    async def body():
        peer = await ordo.connect(cpp_server.url)
        res = await peer.inc(1)
        assert res == 2
        assert [x async for x in peer.stream("count_to", 100)] == list(range(100))
        srv = ordo.Server()

        @srv.method
        async def twice(x: int) -> int:
            return 2 * x
        ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
        assert await asyncio.gather(*(ch.twice(i) for i in range(100))) == \
            [2 * i for i in range(100)]
        ch.close()
        peer.close()
        await srv.stop()

    loop = uvloop.new_event_loop()
    try:
        # This test's own loop waits while uvloop's runs: run it on a thread of its own.
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: loop.run_until_complete(asyncio.wait_for(body(), 60)))
    finally:
        loop.close()


EXIT_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    import ordo

    async def main(mode):
        srv = ordo.Server()

        @srv.method
        async def forever():
            await asyncio.sleep(3600)

        @srv.method
        async def boom():
            raise RuntimeError("raised on purpose")

        url = await srv.listen("tcp://127.0.0.1:0")
        ch = await ordo.connect(url)
        pool = await ordo.connect(url + "?mode=pooled")
        try:
            await ch.boom()
        except ordo.RemoteError as e:
            print("handler raised:", e.detail, flush=True)
        async def call_forever(c):
            await c.forever()
        # Tasks, as an application has them: asyncio.run cancels them as it ends.
        pending = [asyncio.ensure_future(call_forever(c)) for c in (ch, pool) for _ in range(5)]
        calls = [c.forever() for c in (ch, pool)]  # bare calls, never awaited
        # "at-once": the requests are still on their way to the server's handlers as the
        # loop ends (they start in its last turns, which used to leave their tasks pending).
        await asyncio.sleep(0 if mode == "at-once" else 0.05)
        if mode == "exit":
            sys.exit(3)  # calls still pending, nothing closed
        print("leaving")

    asyncio.run(main(sys.argv[1]))
""")


@pytest.mark.parametrize("mode", ["return", "exit", "at-once"])
def test_a_process_with_calls_pending_exits_without_hanging(mode):
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-X", "dev", "-c", EXIT_SCRIPT, mode], env=env,
                       capture_output=True, text=True, timeout=60)
    assert "handler raised: boom: RuntimeError: raised on purpose" in p.stdout, p.stderr
    assert p.returncode == (3 if mode == "exit" else 0), p.stderr
    # -X dev reports tasks destroyed while pending, unclosed resources, and futures whose
    # exception nobody read (here: the bare calls, failed as the loop ended).
    assert "Task was destroyed" not in p.stderr and "ResourceWarning" not in p.stderr, p.stderr


def test_calls_after_shutdown_fail_with_closed():
    script = textwrap.dedent("""
        import asyncio, ordo
        async def main(url):
            srv = ordo.Server()
            srv.method(lambda x: x, name="echo")
            ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
            assert await ch.echo(1) == 1
            ordo.shutdown()
            for attempt in (ch.echo(2), ordo.connect("tcp://127.0.0.1:1")):
                try:
                    await asyncio.wait_for(attempt, 10)
                except ordo.Closed as e:
                    print("closed:", e)
        asyncio.run(main(None))
    """)
    p = subprocess.run([sys.executable, "-X", "dev", "-c", script], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("closed: ordo: ") == 2, p.stdout


async def test_notifications_taken_and_never_written_are_told_to_their_channel(caplog):
    # A peer that accepts and never reads: notifications fill the sockets' buffers, and the
    # rest wait in ordo's output. Its connection then ends with a reset: those never written
    # are counted on the channel, the first is logged, and the next notify raises why.
    import socket
    import struct

    accepted = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    ch = await ordo.connect(f"tcp://127.0.0.1:{port}")
    conn, _ = await asyncio.get_running_loop().sock_accept(listener)
    accepted.append(conn)
    blob = b"x" * (256 << 10)
    for i in range(64):  # 16 MiB: more than the sockets hold, less than ordo's output bound
        ch.notify("sink", i, blob)
    await asyncio.sleep(0.5)  # written as far as the sockets take them
    assert ch.undelivered == 0
    with caplog.at_level("WARNING", logger="ordo"):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # a reset: what ordo still holds cannot go anywhere
        listener.close()
        deadline = asyncio.get_running_loop().time() + 20
        while ch.undelivered == 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the rest of the reports, in the same drain or the next
    assert 0 < ch.undelivered < 64, ch.undelivered
    assert any("sink was taken and not delivered" in r.getMessage() for r in caplog.records)
    with pytest.raises(ordo.OrdoError) as e:
        ch.notify("sink", 64, b"")
    assert "not delivered" in str(e.value)
    # Raised once: what comes next is this connection's own end (a resumable channel would go
    # on with a new session).
    with pytest.raises(ordo.OrdoError) as e:
        ch.notify("sink", 65, b"")
        await asyncio.sleep(0.2)
        ch.notify("sink", 66, b"")
    assert "not delivered" not in str(e.value)
    ch.close()
