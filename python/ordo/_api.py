"""The caller's side: connect(), Channel and Stream, on the loop's hub (_hub)."""
from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import math
from asyncio import events

from . import _ordo
from ._context import _current, _outgoing
from ._errors import Closed, OrdoError, TimedOut, _error
from ._hub import _LoopHub, _check_running, _hub, _packb, _tokens, _unpackb


def _timeout_ms(timeout: float | None) -> int:
    if timeout is None:
        return 0
    if timeout <= 0:
        raise ValueError("ordo: timeout must be positive (None: no deadline)")
    return max(1, math.ceil(timeout * 1000))


class _Call(asyncio.Future):
    """A call's result. Cancelling it (or the task awaiting it) withdraws the call and sends
    ordo.cancel to the server."""

    __slots__ = ("_lh", "_token")

    def cancel(self, msg=None) -> bool:
        lh = self._lh
        if lh.futures.pop(self._token, None) is not None:
            lh.flush()
            lh.hub.cancel(self._token)
        return super().cancel(msg)


def _new_call(lh: _LoopHub, token: int) -> _Call:
    fut = _Call(loop=lh.loop)
    fut._lh = lh
    fut._token = token
    lh.futures[token] = fut
    return fut


async def _wait(lh: _LoopHub, token: int, fut: asyncio.Future):
    try:
        return await fut
    except asyncio.CancelledError:
        if lh.futures.pop(token, None) is not None:
            lh.flush()
            lh.hub.cancel(token)  # withdraws the connect
        raise


# ---- client -------------------------------------------------------------------------------

async def connect(url: str, *, handlers=None) -> Channel:
    """Connects to `url` (tcp://, unix://, tls://, route+..., ?mode=pooled, ?resume_ms=...:
    every form ordo::async_connect takes) on the running loop's ordo hub. `handlers` (an
    ordo.Server, listening or not) serves what the remote side calls back over this
    connection (ordered channels)."""
    _check_running(f"connect to {url}")
    lh = _hub()
    token = next(_tokens)
    fut = lh.loop.create_future()
    lh.futures[token] = fut
    server = 0
    if handlers is not None:
        handlers._attach(lh)
        server = handlers._id
    lh.hub.connect(token, url, server)
    chan, remote = await _wait(lh, token, fut)
    return Channel(lh, chan, remote)


# Ids of lanes' channels, chosen here (the core's own ids count up from 1).
_lane_ids = itertools.count(1 << 62)


class Channel:
    """What call sites hold: an ordered peer, a pool or a router, as the URL chose.

    `await ch.inc(1)` is `await ch.call("inc", 1)`. On an ordered channel, calls and
    notifications reach the server in the order they were made. Use it on the loop that
    connected it. `close()` (or dropping it) closes the connection after sending what is queued.
    """

    def __init__(self, lh: _LoopHub, chan: int, remote: str, owned: bool = True):
        self._lh = lh
        self._out = lh.out
        self._id = chan
        self.remote_address = remote
        self._failed: OrdoError | None = None
        self._closed = False
        self._base: Channel | None = None  # a lane's channel: the channel it is a lane of
        # Notifications taken for sending and not written when the connection ended (those of
        # its lanes too); the first is logged, and the next notify raises why.
        self.undelivered = 0
        self._failed_once = False  # _failed is an undelivered report: raised once
        lh.channels[chan] = self

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        stub = functools.partial(self.call, name)  # (*args, timeout=None, key="", metadata=None)
        self.__dict__[name] = stub
        return stub

    def call(self, method: str, *args, timeout: float | None = None, key: str = "",
             metadata: dict[str, str | bytes] | None = None):
        """Calls `method(*args)`; an awaitable of its result. `timeout` (seconds) fails it
        with TimedOut, and goes with the call as its deadline; `key` is the affinity key of
        routers; `metadata` reaches the handler's call context (a key ending in -bin carries
        bytes; "ordo-" keys are reserved). Inside a handler, the call also takes what is left of
        the handler's deadline and its trace (current_context()). Cancelling the awaiting task
        withdraws the call and sends ordo.cancel to the server."""
        lh = self._lh
        if lh.loop is not events._get_running_loop():
            raise RuntimeError("ordo: a channel is used on the loop that connected it")
        if self._closed:
            raise Closed(f"ordo: call {method} to {self.remote_address} failed: closed")
        params = _packb(args)  # raises TypeError for what msgpack cannot carry
        timeout_ms = _timeout_ms(timeout) if timeout is not None else 0
        ctx = _current.get()
        pairs = None
        if metadata is not None or ctx is not None:
            # Checked before the call is registered: a TypeError leaves nothing behind.
            pairs, timeout_ms = _outgoing(method, metadata, ctx, timeout_ms)
        token = next(_tokens)
        fut = _Call(loop=lh.loop)
        fut._lh = lh
        fut._token = token
        if timeout_ms < 0:
            fut.set_exception(TimedOut(
                f"ordo: call {method} to {self.remote_address} failed: timed out (the "
                f"deadline of the call whose handler made it had passed)"))
            return fut
        lh.futures[token] = fut
        out = self._out  # _LoopHub.queue, inlined
        if pairs is None:
            out.append((1, self._id, token, method, params, timeout_ms, key))
        else:
            out.append((1, self._id, token, method, params, timeout_ms, key, pairs))
        if len(out) == 1:
            lh.schedule_flush()
        return fut

    def notify(self, method: str, *args) -> None:
        """Sends a one-way message, in order with the calls. Raises the reason a previous
        notification was not taken (Overloaded, Closed; TypeError for arguments msgpack
        cannot carry, found when the turn's messages are packed together), if any."""
        if self._failed is not None or self._closed:
            if self._failed is not None:
                failed = self._failed
                if self._failed_once:
                    self._failed, self._failed_once = None, False
                raise failed
            raise Closed(f"ordo: notify {method} to {self.remote_address}: closed")
        out = self._out  # _LoopHub.queue, inlined: this is the one-way hot path
        out.append((0, self._id, method, args))  # packed with the batch (flush)
        if len(out) == 1:
            self._lh.schedule_flush()

    def stream(self, method: str, *args, timeout: float | None = None, key: str = "",
               window: int = 0, window_bytes: int = 0, zero_copy: bool = False) -> Stream:
        """A streaming call: `async for x in ch.stream("count_to", 10)`. `window` is the
        credit in items (0: ordo's default, 8192), `window_bytes` in bytes (0: 1 MiB; one
        item always goes); a reader that stops holds the server. zero_copy: bytes of 64 KiB
        or more in items arrive as writable memoryviews of the message."""
        return self._open(Stream, 0, method, args, timeout, key, window, window_bytes, zero_copy)

    def two_way(self, method: str, *args, timeout: float | None = None, key: str = "",
                window: int = 0, window_bytes: int = 0, zero_copy: bool = False):
        """A two-way stream (docs/protocol.md, "Streams both ways"): `await s.write(x)`, then
        `s.close()`, while `async for y in s` reads the handler's items; each direction is in
        order and has its own credit. Options as for stream(). Returns an ordo.TwoWay."""
        from ._writing import TwoWay
        return self._open(TwoWay, 1, method, args, timeout, key, window, window_bytes, zero_copy)

    def upload(self, method: str, *args, timeout: float | None = None, key: str = ""):
        """A client stream: `await up.write(x)` for each item (it waits while the handler is
        behind), then `await up.finish()` for the handler's answer. Returns an ordo.Upload."""
        from ._writing import Upload
        return self._open(Upload, 2, method, args, timeout, key, 1, 0, False)

    def _open(self, cls, shape: int, method: str, args, timeout, key, window, window_bytes,
              zero_copy):
        _check_running(f"stream {method}")
        lh = self._lh
        params = _packb(args)  # raises TypeError for what msgpack cannot carry
        token = next(_tokens)
        st = cls(lh, token, method)
        st._views = zero_copy
        # Credit goes back when half the window (in items or bytes) is read, as ordo's reader
        # grants it: taken items are reported to the io thread only then, in one entry.
        st._due = (max(1, min(window or 8192, 65536) // 2), (window_bytes or 1 << 20) // 2)
        lh.streams[token] = st
        lh.flush()
        lh.hub.stream(self._id, token, method, params, _timeout_ms(timeout), key, window,
                      window_bytes, shape)
        return st

    def lane(self, name: str) -> Channel:
        """A channel on the same connection whose calls and notifications go on lane `name`
        (docs/protocol.md "Lanes"): in order with one another and in no order with other
        lanes', whose large messages they do not wait behind; the server runs each lane's
        handlers apart. "" is the default lane. Closing it (or dropping it) closes nothing:
        the connection is its channel's. Raises ValueError for a name over 64 bytes."""
        if len(name.encode()) > 64:
            raise ValueError(f"ordo: lane name of {len(name.encode())} bytes, over the most of 64")
        base = self._base or self
        if name == "":
            return base
        chan = next(_lane_ids)
        self._lh.flush()  # what was sent before on this connection goes first
        self._lh.hub.open_lane(base._id, chan, name)
        ch = Channel(self._lh, chan, self.remote_address)
        ch._base = base
        return ch

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._lh.flush()
            if self._base is not None:
                self._lh.hub.forget_channel(self._id)
            else:
                self._lh.hub.close_channel(self._id)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class Identity:
    """Who a handler's caller is (Peer.identity; C++ ordo::identity): `subject`, as the
    server's authentication accepted it ("" without one); `address`; for a tls:// client
    certificate, `cert_subject`, `cert_sans` and `cert_sha256`; for unix://, `unix` as
    (uid, gid, pid); `token_subject`, when the caller presented a token."""

    __slots__ = ("subject", "address", "cert_subject", "cert_sans", "cert_sha256",
                 "token_subject", "unix")

    def __init__(self, d: dict):
        self.subject: str = d.get("subject", "")
        self.address: str = d.get("address", "")
        self.cert_subject: str = d.get("cert_subject", "")
        self.cert_sans: list[str] = list(d.get("cert_sans", ()))
        self.cert_sha256: str = d.get("cert_sha256", "")
        self.token_subject: str = d.get("token_subject", "")
        self.unix: tuple[int, int, int] | None = d.get("unix")

    def __repr__(self) -> str:
        return f"Identity(subject={self.subject!r}, address={self.address!r})"


class Peer(Channel):
    """The caller of a handler, as a channel back to it over the same ordered connection.
    Dropping it does not close the connection (the server owns it); close() does."""

    @property
    def identity(self) -> Identity:
        """Who the caller is (see Identity)."""
        return Identity(_ordo.peer_identity(self._id) or {})

    def close(self) -> None:
        """Drops this caller: closes its connection, after what was sent to it (C++'s
        peer::close). Its calls in progress are cancelled; it may connect again."""
        if not self._closed:
            self._closed = True
            self._lh.flush()  # what this side sent it goes first
            self._lh.hub.close_peer(self._id)

    def __del__(self):
        pass  # dropped, not closed: the connection is the server's


class Stream:
    """The items of a streaming call, in order: `async for x in stream`. Leaving the loop
    early does not end the call: `cancel()` (or dropping the stream) does (ordo.cancel)."""

    def __init__(self, lh: _LoopHub, token: int, method: str):
        self._lh = lh
        self._token = token
        self.method = method
        self._items: collections.deque = collections.deque()
        self._outcome: tuple | None = None
        self._waiter: asyncio.Future | None = None
        self._finished = False
        self._views = False
        self._due = (1, 1)  # report taken items from this many items or bytes (stream())
        self._taken = [0, 0]  # items and bytes taken and not yet reported
        self._result = None  # an upload's answer (Upload.finish)

    def _item(self, data: bytes, size: int) -> None:
        self._items.append((data, size))
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _ended(self, code: int, text, detail, data=None) -> None:
        self._outcome = (code, text, detail)
        self._result = data
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self):
        while not self._items:
            if self._outcome is not None:
                self._finished = True
                code, text, detail = self._outcome
                if code:
                    raise _error(code, text, detail)
                raise StopAsyncIteration
            self._waiter = self._lh.loop.create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                self.cancel()
                raise
            finally:
                self._waiter = None
        data, size = self._items.popleft()
        taken = self._taken
        taken[0] += 1
        taken[1] += size
        if taken[0] >= self._due[0] or taken[1] >= self._due[1]:
            self._lh.queue((4, self._token, taken[1], taken[0]))  # with the turn's batch
            taken[0] = taken[1] = 0
        return _unpackb(data, False, self._views)

    def cancel(self) -> None:
        """Ends the call: the server's handler is cancelled; later reads raise Cancelled
        once the items already here are read."""
        if not self._finished and self._outcome is None:
            self._lh.flush()
            self._lh.hub.stream_cancel(self._token)

    def __del__(self):
        try:
            if self._outcome is None:
                self._lh.hub.stream_forget(self._token)
        except Exception:
            pass
