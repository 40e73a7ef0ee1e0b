"""Streams both ways (docs/protocol.md, "Streams both ways"): the caller's writing half (TwoWay,
Upload), the handler's reading half (Reader), and the bound on items handed to the io thread
and not yet sent (_Writer), which a streaming handler's items share."""
from __future__ import annotations

import asyncio
import collections

from ._api import Stream
from ._errors import _error
from ._hub import _LoopHub, _packb_split, _unpackb

# Items this big go to the io thread at once, read in place; smaller ones with the turn's batch.
_BIG = 1 << 18


class _Writer:
    """Items written and not yet sent: at most `window` of them, and at most `window_bytes`
    (one item always goes)."""

    def __init__(self, lh: _LoopHub, window: int = 64, window_bytes: int = 64 << 20):
        self.lh = lh
        self.window = window
        self.window_bytes = window_bytes
        self.sent = 0
        self.acked = 0
        self.sizes: collections.deque = collections.deque()  # of the items not yet sent
        self.nbytes = 0
        self.waiters: list[asyncio.Future] = []  # writers waiting for room (one, usually)

    def add(self, n: int) -> bool:
        """An item of `n` bytes was written; whether the writer must now wait."""
        self.sent += 1
        self.sizes.append(n)
        self.nbytes += n
        return self.full()

    def full(self) -> bool:
        return self.sent - self.acked >= self.window or self.nbytes >= self.window_bytes

    def _written(self, n: int) -> None:
        while self.acked < n and self.sizes:
            self.acked += 1
            self.nbytes -= self.sizes.popleft()
        if self.sent - n < self.window // 2 and self.nbytes < self.window_bytes // 2:
            self.wake()

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait(self) -> None:
        w = self.lh.loop.create_future()
        self.waiters.append(w)
        try:
            await w
        finally:
            if w in self.waiters:
                self.waiters.remove(w)


class _Writes(Stream):
    """A stream whose caller writes items too. Up to 64 items (or 1 MiB) may wait on their way
    to the connection; beyond that, write() waits, so a server that grants no credit holds the
    writer's memory at its window, one item and this much."""

    def __init__(self, lh: _LoopHub, token: int, method: str):
        super().__init__(lh, token, method)
        self._writer = _Writer(lh, 64, 1 << 20)
        self._closed_writes = False
        self._refused = False  # a write found the call ended

    @property
    def written(self) -> int:
        """Items handed to the connection so far (they went within the server's credit), as
        the io thread last reported them: every 16 items or 256 KiB while the stream is open
        (so it may lag by fewer), and exactly once the writing side is closed or has ended."""
        return self._writer.acked

    async def write(self, item) -> bool:
        """Writes `item` (in order); waits while too many items wait to be sent (the server's
        credit: a handler that does not read holds the writer). False when the call has
        already ended (its answer or its error came: finish() or the items say which).
        TypeError for what msgpack cannot carry; RuntimeError after close()."""
        if self._closed_writes:
            raise RuntimeError(f"ordo: write to a stream of {self.method} after close()")
        if self._refused or self._outcome is not None:
            return False
        # A big bin that ends the item is sent from its object, not copied (packb_split).
        data, back, size = _packb_split(item, _BIG)
        lh = self._lh
        if back is None and size < _BIG:
            lh.queue((5, self._token, data))
        else:
            lh.flush()  # what was written before goes first
            lh.hub.stream_write_in(self._token, data, back)
        w = self._writer
        if w.add(size):
            while w.full() and not self._refused and self._outcome is None:
                await w.wait()
        # The call's end may come before the io thread's last report (which then goes nowhere):
        # the end itself says that later writes go nowhere.
        return not self._refused and self._outcome is None

    def close(self) -> None:
        """No more items (ordo.in_end goes after those written): the handler's read ends."""
        if not self._closed_writes:
            self._closed_writes = True
            self._lh.queue((6, self._token, 0))

    def _written(self, n: int, refused: int) -> None:
        if refused:
            self._refused = True
        self._writer._written(n)
        if refused:
            self._writer.wake()

    def _ended(self, code: int, text, detail, data=None) -> None:
        super()._ended(code, text, detail, data)
        self._writer.wake()


class TwoWay(_Writes):
    """A two-way stream (Channel.two_way): `await s.write(x)` and `s.close()` on one side,
    `async for y in s` on the other, each direction in order with its own credit."""


class Upload(_Writes):
    """A client stream (Channel.upload): `await up.write(x)` for each item, then
    `await up.finish()` for the handler's answer. Dropping it without finish() cancels it."""

    def __aiter__(self):
        raise TypeError(f"ordo: an upload to {self.method} has no items to read: await finish()")

    async def finish(self):
        """Closes the writing side (if not yet) and returns the handler's answer; raises its
        error (RemoteError naming the method, Cancelled, PeerLost...)."""
        self.close()
        while self._outcome is None:
            self._waiter = self._lh.loop.create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                self.cancel()
                raise
            finally:
                self._waiter = None
        self._finished = True
        code, text, detail = self._outcome
        if code:
            raise _error(code, text, detail)
        return _unpackb(self._result)


class Reader:
    """What a handler registered with reads=True gets as its first argument (after the peer):
    the items its caller writes, in order: `async for x in items`. The iteration ends when the
    caller closes its side; it raises PeerLost when the caller's connection ended first, and
    ProtocolError when the caller broke its credit or miscounted its items."""

    def __init__(self, lh: _LoopHub, token: int, method: str, views: bool):
        self._lh = lh
        self._token = token
        self.method = method
        self._views = views
        self._items: collections.deque = collections.deque()
        self._end: tuple | None = None
        self._waiter: asyncio.Future | None = None
        self._untold = 0  # taken and not yet reported to the io thread
        self.taken = 0

    def _item(self, data) -> None:
        self._items.append(data)
        self._wake()

    def _ended(self, code: int, text) -> None:
        self._end = (code, text)
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _take_all(self) -> list:
        """The items already handed over, taken at once: what a handler that is cancelled
        (its caller's connection is gone) may still keep."""
        items = [_unpackb(d, False, self._views) for d in self._items]
        self.taken += len(items)
        self._items.clear()
        return items

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self):
        while not self._items:
            if self._untold:  # the io thread hands over more once told
                self._lh.queue((7, self._token, self._untold))
                self._untold = 0
            if self._end is not None:
                code, text = self._end
                if code:
                    raise _error(code, text, None)
                raise StopAsyncIteration
            self._waiter = self._lh.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._items.popleft()
        self.taken += 1
        self._untold += 1
        if self._untold >= 16:
            self._lh.queue((7, self._token, self._untold))
            self._untold = 0
        return _unpackb(data, False, self._views)
