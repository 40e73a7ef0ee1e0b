"""One asyncio loop's end of ordo (its hub), which the caller's side (_api) and the server's
(_server) both use.

Threading: ordo's io thread (C++) never takes the GIL. Every call hands bytes to it through
the loop's hub, and gets its answer back the same way: one eventfd watched with
loop.add_reader; one wake-up drains every completion queued meanwhile.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import weakref
from asyncio import events
from typing import TYPE_CHECKING

from . import _ordo
from ._errors import BadResult, Closed, _error

if TYPE_CHECKING:
    from ._api import Channel, Stream


_logger = logging.getLogger("ordo")

_tokens = itertools.count(1)
_shut = False  # set by ordo.shutdown()
# msgpack in the extension (_codec.cpp), with msgpack-python's rules: the package needs nothing
# beyond the standard library.
_packb = _ordo.packb
_unpackb = _ordo.unpackb
_packb_split = _ordo.packb_split
_BIG_ITEM = 1 << 18  # items this big are read in place by the io thread, not copied


# ---- the hub of one asyncio loop ----------------------------------------------------------

(_CALL, _CONNECTED, _ITEM, _END, _REQUEST, _GONE, _WRITTEN, _DONE, _NOTIFY_FAILED,
 _UNDELIVERED, _RELEASE, _STREAM_WRITTEN, _IN_ITEM, _IN_END) = range(14)


class _LoopHub:
    """One asyncio loop's end of ordo: its completion queue (an eventfd) and what waits."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.hub = _ordo.Hub()
        self.futures: dict[int, asyncio.Future] = {}  # calls, connects, listens, stops
        self.streams: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
        self.channels: weakref.WeakValueDictionary[int, Channel] = weakref.WeakValueDictionary()
        self.requests: dict[int, object] = {}  # request id -> task (server side)
        # A connection's requests that wait for its serial handler, or for those ahead of them
        # (_server._arrive): peer channel id -> {request id: request}, and request id -> peer.
        self.lanes: dict[int, dict] = {}
        self.waiting: dict[int, int] = {}
        self.written: dict[int, object] = {}  # request id -> its item writer
        self.readers: dict[int, object] = {}  # request id -> its Reader (reads=True handlers)
        # Calls and notifications made in one turn of the loop go to the io thread together,
        # in order, in one hand-over (flush), as BatchedSend gathers messages. Every other
        # operation flushes first, so that it comes after them.
        self.out: list = []
        self._pack_out = _ordo.packb
        loop.add_reader(self.hub.fileno(), self._ready)
        # The loop's end: asyncio.run() closes the async generators its loop tracks before it
        # closes the loop, and a request read in that last turn would start a handler task
        # that nobody runs ("Task was destroyed but it is pending"). This generator's close
        # refuses new handlers and cancels and awaits the ones still running.
        self.closing = False
        self._closer = self._close_at_loop_end()
        try:
            self._closer.asend(None).send(None)  # to its yield: the loop now tracks it
        except StopIteration:
            pass

    async def _close_at_loop_end(self):
        try:
            yield
        finally:
            self.closing = True
            running = [t for t in self.requests.values() if not t.done()]
            for t in running:
                t.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    def queue(self, entry: tuple) -> None:
        out = self.out
        out.append(entry)
        if len(out) == 1:
            self.loop.call_soon(self.flush)

    def schedule_flush(self) -> None:
        self.loop.call_soon(self.flush)

    def respond(self, token: int, code: int, data: bytes) -> None:
        # Queued with calls and notifications: what the handler sent before it answered
        # goes first, and the answers of one turn of the loop go over together.
        self.queue((2, token, code, data))

    def stream_write(self, token: int, item: bytes, back=None) -> None:
        """One item of a streaming handler: `item`, or `item` then `back`'s bytes
        (_packb_split)."""
        if back is None and len(item) < _BIG_ITEM:
            self.queue((3, token, item))
        else:  # read in place by the io thread, after what is queued
            self.flush()
            self.hub.stream_write(token, item, back)

    def flush(self) -> None:
        out = self.out  # one list for the hub's life: channels hold it
        if out and _shut:  # ordo.shutdown() has run: nothing reaches the io thread any more
            for e in out:
                fut = self.futures.pop(e[2], None) if e[0] == 1 else None
                if fut is not None and not fut.done():
                    fut.set_exception(Closed(f"ordo: call {e[3]} failed: ordo was shut down"))
            out.clear()
        if out:
            try:
                data = self._pack_out(out)
            except Exception:  # a notification's arguments that msgpack cannot carry
                data = self._pack_out(self._drop_unpackable(out))
            out.clear()
            self.hub.submit(data)

    def _drop_unpackable(self, out: list) -> list:
        """The entries that pack; a notification that does not is reported by the next
        notify() on its channel (TypeError), as one the connection did not take."""
        kept = []
        for e in out:
            try:
                self._pack_out(e)
            except Exception as err:
                ch = self.channels.get(e[1])
                if ch is not None and ch._failed is None:
                    ch._failed = TypeError(f"ordo: notify {e[2]}: arguments msgpack cannot "
                                           f"carry: {err}")
                continue
            kept.append(e)
        return kept

    def _ready(self) -> None:
        futures = self.futures
        for c in self.hub.drain():
            if len(c) == 2:  # the common case, a call's result: (token, data)
                fut = futures.pop(c[0], None)
                if fut is not None and not fut.done():
                    try:
                        fut.set_result(_unpackb(c[1]))
                    except Exception as e:  # not msgpack we can read
                        fut.set_exception(BadResult(f"ordo: result does not decode: {e}"))
                continue
            kind, token, code, a, b, data, text, detail = c
            if kind == _CALL or kind == _DONE or kind == _CONNECTED:
                fut = futures.pop(token, None)
                if fut is None or fut.done():
                    continue
                if code:
                    fut.set_exception(_error(code, text, detail))
                elif kind == _CALL:
                    try:
                        fut.set_result(_unpackb(data))
                    except Exception as e:  # not msgpack we can read
                        fut.set_exception(BadResult(f"ordo: result does not decode: {e}"))
                else:
                    fut.set_result((a, text))
            elif kind == _REQUEST:
                from ._server import _arrive
                _arrive(self, token, a, b, data, text, bool(code & 1), detail)
            elif kind == _ITEM:
                st = self.streams.get(token)
                if st is not None:
                    st._item(data, a)
            elif kind == _END:
                st = self.streams.pop(token, None)
                if st is not None:
                    st._ended(code, text, detail, data)
            elif kind == _WRITTEN:
                w = self.written.get(token)
                if w is not None:
                    w._written(a)
            elif kind == _IN_ITEM:
                r = self.readers.get(token)
                if r is not None:
                    r._item(data)
            elif kind == _IN_END:
                r = self.readers.get(token)
                if r is not None:
                    r._ended(code, text)
            elif kind == _STREAM_WRITTEN:
                st = self.streams.get(token)
                if st is not None:
                    st._written(a, b)
            elif kind == _GONE:
                self.readers.pop(token, None)
                task = self.requests.pop(token, None)
                if task is not None:
                    task.cancel()
                else:  # still waiting its turn on its connection: it never runs
                    peer = self.waiting.pop(token, None)
                    if peer is not None:
                        self.lanes[peer].pop(token, None)
            elif kind == _NOTIFY_FAILED:
                ch = self.channels.get(token)
                if ch is not None and (ch._failed is None or ch._failed_once):
                    ch._failed, ch._failed_once = _error(code, text, None), False
            elif kind == _UNDELIVERED:
                ch = self.channels.get(token)
                if ch is not None:
                    ch.undelivered += 1
                    if ch._failed is None:  # raised by the next notify only: a resumable
                        ch._failed = _error(code, text, None)  # channel goes on
                        ch._failed_once = True
                    if ch.undelivered == 1:
                        _logger.warning("%s (later ones are counted in Channel.undelivered)",
                                        text)
        self.flush()  # answers given during this drain go now, not a turn later

    def close(self) -> None:
        try:
            self.loop.remove_reader(self.hub.fileno())
        except Exception:  # the loop is closed already
            pass


_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hub() -> _LoopHub:
    loop = events.get_running_loop()
    h = _hubs.get(loop)
    if h is None or h.loop.is_closed():
        h = _LoopHub(loop)
        _hubs[loop] = h
    return h


def _check_running(what: str) -> None:
    if _shut:
        raise Closed(f"ordo: {what} failed: ordo was shut down")
