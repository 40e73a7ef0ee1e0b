"""Call context from Python (docs/python.md, "Call context"): metadata=... on calls, a handler's
ordo.current_context() (a contextvar: it follows the handler across awaits and into the tasks it
starts), and deadlines and traces passed on by calls made inside a handler, between Python and
ordo's C++ server both ways."""
import asyncio
import os

import pytest

import ordo
from conftest import BUILD, inc_server

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def seen(ctx):
    """What a handler saw of its context, as the C++ server's `context` method answers it."""
    if ctx is None:
        return None
    left = ctx.time_left()
    return {"deadline_left_ms": None if left is None else round(left * 1000),
            "trace_id": ctx.trace_id or None,
            "metadata": ctx.metadata}


def context_server(onward=None):
    srv = ordo.Server()

    @srv.method
    def context():  # a plain function: runs in the drain, in the call's context
        return seen(ordo.current_context())

    @srv.method
    async def later():  # across an await, and in a task the handler starts
        await asyncio.sleep(0.02)
        here = seen(ordo.current_context())
        in_task = await asyncio.create_task(asyncio.sleep(0, ordo.current_context()))
        return [here, seen(in_task)]

    @srv.method
    async def parts():
        c = ordo.current_context()
        return [c.trace_id, c.parent_id, c.span_id, c.trace_flags, c.pairs]

    if onward is not None:
        @srv.method
        async def relay():
            mine = ordo.current_context()
            theirs = await onward[0].call("context")
            return [mine.span_id if mine else None, theirs]

    return srv


async def test_metadata_reaches_a_python_handler_in_order_with_bytes_and_across_awaits():
    srv = context_server()
    ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
    meta = {"tenant": "acme", "blob-bin": b"\x00\x01\xff"}
    got = await ch.call("context", metadata=meta)
    assert got["metadata"] == meta
    assert got["deadline_left_ms"] is None and got["trace_id"] is None
    here, in_task = await ch.call("later", metadata=meta, timeout=5)
    assert here["metadata"] == meta and in_task["metadata"] == meta
    assert 0 < here["deadline_left_ms"] <= 5000
    # A call without a context: none.
    assert await ch.call("context") is None
    # Trace ids read from the traceparent; the handler's own span is new.
    trace, parent, span, flags, pairs = await ch.call(
        "parts", metadata={"traceparent": TRACEPARENT, "tracestate": "v=1"})
    assert (trace, parent, flags) == (TRACE, "00f067aa0ba902b7", 1)
    assert len(span) == 16 and span != parent
    assert pairs == [["traceparent", TRACEPARENT], ["tracestate", "v=1"]]
    with pytest.raises(TypeError):
        ch.call("context", metadata={"k": 1})
    with pytest.raises(TypeError):  # bytes only for a key ending in -bin
        ch.call("context", metadata={"k": b"\xff"})
    with pytest.raises(ordo.BadArguments, match="reserved"):
        await ch.call("context", metadata={"ordo-x": "1"})
    ch.close()
    await srv.stop()


async def test_python_to_cpp_and_back_a_trace_and_deadline_pass_through_every_hop():
    # Python calls the C++ server's context, whose handler calls context on a Python server
    # (ordo-inc-server --next): metadata Python -> C++, and C++ -> Python.
    py_srv = context_server()
    py_url = await py_srv.listen("tcp://127.0.0.1:0")
    cpp = inc_server("--listen", "tcp://127.0.0.1:0", "--next", py_url, listens=1)
    try:
        ch = await ordo.connect(cpp.url)
        got = await ch.call("context", timeout=3,
                            metadata={"traceparent": TRACEPARENT, "tenant": "acme"})
        assert got["trace_id"] == TRACE
        assert got["metadata"] == {"traceparent": TRACEPARENT, "tenant": "acme"}
        assert 0 < got["deadline_left_ms"] <= 3000
        nested = got["next"]  # what the Python handler saw of the C++ handler's call
        assert nested["trace_id"] == TRACE
        assert nested["metadata"]["traceparent"].startswith(f"00-{TRACE}-")
        assert nested["metadata"]["traceparent"] != TRACEPARENT  # the C++ handler's span
        assert 0 < nested["deadline_left_ms"] <= got["deadline_left_ms"]
        ch.close()
    finally:
        cpp.stop()
        await py_srv.stop()


async def test_a_call_inside_a_python_handler_is_a_child_and_takes_what_is_left():
    cpp = inc_server("--listen", "tcp://127.0.0.1:0")
    onward = []
    srv = context_server(onward)
    try:
        onward.append(await ordo.connect(cpp.url))
        ch = await ordo.connect(await srv.listen("tcp://127.0.0.1:0"))
        span, theirs = await ch.call("relay", timeout=2, metadata={"traceparent": TRACEPARENT})
        assert theirs["trace_id"] == TRACE
        assert theirs["metadata"] == {"traceparent": f"00-{TRACE}-{span}-01"}
        assert 0 < theirs["deadline_left_ms"] <= 2000
        # Without a context the onward call carries none (the C++ side sees no deadline).
        _, plain = await ch.call("relay")
        assert plain["trace_id"] is None and plain.get("deadline_left_ms") is None
        ch.close()
        onward[0].close()
    finally:
        cpp.stop()
        await srv.stop()


async def test_a_cpp_callers_value_that_is_not_utf8_reaches_a_python_handler():
    # A C++ caller's str may hold any bytes (ordo call --meta): the handler sees them as
    # surrogates, and the server goes on.
    ordo_tool = BUILD / "tools" / "ordo"
    if not ordo_tool.exists():
        pytest.skip("the ordo command is not built (-Dtools=false)")
    srv = ordo.Server()

    @srv.method
    def raw():
        value = ordo.current_context().metadata["k"]
        return list(value.encode("utf-8", "surrogateescape"))

    url = await srv.listen("tcp://127.0.0.1:0")
    p = await asyncio.create_subprocess_exec(
        os.fsencode(str(ordo_tool)), b"call", url.encode(), b"raw", b"--meta", b"k=a\xffb",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(p.communicate(), 60)
    assert p.returncode == 0, err.decode(errors="replace")
    assert out.strip() == b"[97,255,98]", out
    ch = await ordo.connect(url)
    assert (await ch.call("raw", metadata={"k": "ok"})) == [111, 107]
    ch.close()
    await srv.stop()
