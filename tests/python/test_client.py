"""The Python client against ordo's C++ server (examples/ordo-inc-server)."""
import asyncio
import pathlib
import re
import subprocess
import sys
import time

import pytest

import ordo


async def test_seed_example_runs_as_written(cpp_server):
    peer = await ordo.connect(cpp_server.url)
    res = await peer.inc(1)
    assert res == 2
    peer.close()


@pytest.mark.parametrize("form", ["tcp", "unix", "pooled", "route", "resume"])
async def test_every_url_form_calls(cpp_server, form):
    tcp, unix = cpp_server.urls
    url = {"tcp": tcp, "unix": unix, "pooled": tcp + "?mode=pooled&max_connections=4",
           "route": "route+" + tcp, "resume": tcp + "?resume_ms=10000"}[form]
    ch = await ordo.connect(url)
    assert await ch.call("inc", 41) == 42
    assert await asyncio.gather(*(ch.inc(i) for i in range(100))) == [i + 1 for i in range(100)]
    ch.close()


async def test_tls_calls(tmp_path):
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    from conftest import inc_server
    s = inc_server("--listen", "tls://127.0.0.1:0", "--cert", cert, "--key", key)
    try:
        ch = await ordo.connect(f"{s.url}?ca={cert}")
        assert await ch.inc(1) == 2
        ch.close()
    finally:
        s.stop()


async def test_calls_and_notifications_keep_their_order(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    base = await ch.total()
    calls = []
    for i in range(1, 301):
        ch.notify("add", 1)
        calls.append(ch.total())  # each sees exactly the notifications sent before it
    assert await asyncio.gather(*calls) == [base + i for i in range(1, 301)]
    ch.close()


async def test_what_was_notified_before_close_arrives_though_the_channel_is_dropped(cpp_server):
    probe = await ordo.connect(cpp_server.url)
    base = await probe.total()
    for _ in range(20):
        ch = await ordo.connect(cpp_server.url)
        for _ in range(100):
            ch.notify("add", 1)
        ch.close()
        del ch  # the last handle: the connection must still send what it took first
    for _ in range(600):  # up to a minute
        if await probe.total() == base + 2000:
            break
        await asyncio.sleep(0.1)
    assert await probe.total() == base + 2000
    probe.close()


async def test_a_stream_yields_every_item_in_order(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    assert [x async for x in ch.stream("count_to", 2000, window=16)] == list(range(2000))
    ch.close()


async def test_a_cancelled_stream_stops_the_handler(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    st = ch.stream("count_to", 10_000_000, window=8)
    got = []
    with pytest.raises(ordo.Cancelled):
        async for x in st:
            got.append(x)
            if x == 20:
                st.cancel()
    assert got[:21] == list(range(21))
    # The handler is serial: the next call is served only once it has stopped.
    assert await ch.inc(1, timeout=20) == 2
    ch.close()


async def test_batches_answer_each_caller(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    assert await asyncio.gather(*(ch.square_batch(i) for i in range(200))) == \
        [i * i for i in range(200)]
    async def read(n):
        return [x async for x in ch.stream("count_batch", n)]
    items = await asyncio.gather(*(read(n) for n in (0, 1, 5)))
    assert items == [[], [0], [0, 1, 2, 3, 4]]
    ch.close()


async def test_a_timeout_fails_the_call_with_timed_out(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    t = time.monotonic()
    with pytest.raises(ordo.TimedOut) as e:
        await ch.sleep_ms(30_000, timeout=0.1)
    assert isinstance(e.value, TimeoutError) and e.value.code == 2
    assert time.monotonic() - t < 20
    # ordo.cancel stopped the serial handler: the next call does not wait 30 s.
    assert await ch.inc(2, timeout=20) == 3
    ch.close()


async def test_cancelling_the_task_cancels_the_call_on_the_server(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    task = asyncio.ensure_future(ch.sleep_ms(30_000))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await ch.inc(3, timeout=20) == 4
    ch.close()


async def test_errors_carry_ordo_code_and_message(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    with pytest.raises(ordo.RemoteError) as e:
        await ch.fail("it broke")
    assert e.value.code == 7 and e.value.detail == "it broke" and "fail" in str(e.value)
    with pytest.raises(ordo.BadArguments) as e:
        await ch.inc("not a number")
    assert e.value.code == 6 and "inc" in str(e.value)
    with pytest.raises(ordo.MethodNotFound):
        await ch.no_such_method()
    with pytest.raises(TypeError):  # not msgpack: refused before anything is sent
        await ch.echo(object())
    ch.notify("add", object())  # not msgpack: reported by the next notify, nothing sent
    assert await ch.echo(1) == 1
    with pytest.raises(TypeError):
        ch.notify("add", 1)
    assert await ch.echo({"a": [1, 2.5, "x", b"y", None]}) == {"a": [1, 2.5, "x", b"y", None]}
    with pytest.raises(ordo.PeerLost):
        await ordo.connect("tcp://127.0.0.1:1")
    with pytest.raises(ordo.BadAddress):
        await ordo.connect("nonsense://x")
    ch.close()
    with pytest.raises(ordo.Closed):
        await ch.inc(1)


async def test_a_killed_server_fails_every_pending_call_with_peer_lost(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    calls = [asyncio.ensure_future(ch.sleep_ms(30_000)) for _ in range(50)]
    await asyncio.sleep(0.2)
    cpp_server.kill()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 20)
    assert all(isinstance(r, ordo.PeerLost) and isinstance(r, ConnectionError)
               for r in results), results
    with pytest.raises(ordo.PeerLost):
        await ch.inc(1)


def test_the_readme_example_runs_as_written(cpp_server):
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Python\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "res = await peer.inc(1)" in code and "assert res == 2" in code
    code = code.replace("tcp://127.0.0.1:7000", cpp_server.url)
    p = subprocess.run([sys.executable, "-X", "dev", "-W", "error", "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(i) for i in range(10)]


async def test_a_key_keeps_a_routers_calls_on_one_replica():
    from conftest import inc_server
    a, b = (inc_server("--listen", "tcp://127.0.0.1:0") for _ in range(2))
    try:
        hosts = ",".join(s.url.removeprefix("tcp://") for s in (a, b))
        ch = await ordo.connect(f"route+tcp://{hosts}?policy=round_robin")
        # add() returns its replica's own total: one replica counts every keyed call.
        assert [await ch.add(1, key="user-42") for _ in range(20)] == list(range(1, 21))
        unkeyed = [await ch.add(1) for _ in range(20)]
        assert unkeyed != list(range(21, 41)), unkeyed  # round robin: both replicas count
        ch.close()
    finally:
        a.stop()
        b.stop()


def test_the_package_says_its_version_as_meson_build_does():
    meson = (pathlib.Path(__file__).resolve().parents[2] / "meson.build").read_text()
    assert ordo.__version__ == re.search(r"version : '([^']+)'", meson).group(1)


async def test_ordos_thread_does_not_preempt_the_thread_that_wakes_it(cpp_server):
    # docs/python.md, Threading: ordo's io thread runs as a batch thread, whose wake-ups the
    # kernel never lets preempt the running thread; Python's own threads are left as they are.
    import os
    import threading

    def try_batch(out):  # in a thread of its own, which ends: is the policy allowed here?
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            out.append(True)
        except OSError:
            out.append(False)
    allowed = []
    t = threading.Thread(target=try_batch, args=(allowed,))
    t.start()
    t.join()
    if not allowed[0]:
        pytest.skip("this system does not let a thread become SCHED_BATCH")
    ch = await ordo.connect(cpp_server.url)
    assert await ch.inc(1) == 2  # ordo's thread is running
    policies = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            policies[int(tid)] = os.sched_getscheduler(int(tid))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    # ordo's thread, and Asio's resolver thread that it started (which inherits the policy)
    assert os.SCHED_BATCH in policies.values(), policies
    assert policies[threading.get_native_id()] == os.SCHED_OTHER
    ch.close()
