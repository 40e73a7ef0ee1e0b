"""Lanes from Python (ch.lane, docs/protocol.md "Lanes") against ordo's C++ server."""
import asyncio

import pytest

import ordo


async def test_a_waiting_lane_does_not_hold_the_default_lane(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    slow = ch.lane("slow")
    waiting = asyncio.ensure_future(slow.sleep_ms(5000))
    # sleep_ms is a serial handler: on one lane, inc would wait the 5 s behind it.
    assert await asyncio.wait_for(ch.inc(1), 4.5) == 2
    assert await asyncio.wait_for(ch.lane("other").inc(2), 4.5) == 3
    assert not waiting.done()
    assert await waiting == 5000
    ch.close()


async def test_each_lane_keeps_its_order_and_large_messages_arrive_whole(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    bulk = ch.lane("bulk")
    assert bulk.lane("") is ch and ch.lane("") is ch
    blob = bytes(range(256)) * 4096  # 1 MiB: in pieces
    big = [bulk.echo(blob) for _ in range(4)]
    base = await ch.total()
    calls = []
    for i in range(1, 201):
        ch.notify("add", 1)
        calls.append(ch.total())
    assert await asyncio.gather(*calls) == [base + i for i in range(1, 201)]
    assert await asyncio.gather(*big) == [blob] * 4
    bulk.close()  # closes nothing: the connection is ch's
    assert await ch.inc(1) == 2
    ch.close()


async def test_small_calls_pass_a_large_call_on_another_lane(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    assert await ch.lane("bulk").inc(0) == 1  # asks once whether the server reads lanes
    blob = b"z" * (16 << 20)
    big = asyncio.ensure_future(ch.lane("bulk").echo(blob))
    passed = 0
    while not big.done() and passed < 100000:
        assert await ch.inc(passed) == passed + 1
        if not big.done():
            passed += 1
    assert await big == blob
    assert passed >= 5, "small calls waited behind the large one"
    ch.close()


async def test_lane_names_are_bounded(cpp_server):
    ch = await ordo.connect(cpp_server.url)
    with pytest.raises(ValueError):
        ch.lane("x" * 65)
    assert await ch.lane("y" * 64).inc(1) == 2
    ch.close()
