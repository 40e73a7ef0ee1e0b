"""Batch handlers (Server.batch, as Ray Serve's @serve.batch): single calls from every
connection gathered into lists for one function, and the streaming kind, whose steps give each
caller its next item."""
from __future__ import annotations

import asyncio
import collections
import inspect

from ._errors import OrdoError, RemoteError


class _End:
    """ordo.END: in a step of a streaming batch handler, ends that caller's stream."""

    def __repr__(self) -> str:
        return "ordo.END"


END = _End()


class _Batcher:
    """Single calls gathered into lists for `fn` (Ray Serve's @serve.batch)."""

    def __init__(self, name: str, fn, max_batch_size: int, batch_wait_timeout_s: float):
        if max_batch_size < 1:
            raise ValueError("ordo: max_batch_size must be at least 1")
        if batch_wait_timeout_s < 0:
            raise ValueError("ordo: batch_wait_timeout_s must not be negative")
        self.name = name
        self.fn = fn
        self.max = max_batch_size
        self.wait = batch_wait_timeout_s
        self.queue: list = []
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: set = set()

    def _add(self, entry) -> None:
        loop = asyncio.get_running_loop()
        self.queue.append(entry)
        if len(self.queue) >= self.max:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.wait, self._flush)

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        entries = [e for e in self.queue if not e[1].done()]  # cancelled callers leave
        self.queue = []
        if entries:
            task = asyncio.get_running_loop().create_task(self._run(entries))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def call(self, arg):
        fut = asyncio.get_running_loop().create_future()
        self._add((arg, fut))
        return await fut

    async def _run(self, entries) -> None:
        futs = [f for _, f in entries]
        try:
            results = self.fn([a for a, _ in entries])
            if inspect.isawaitable(results):
                results = await results
            results = list(results)
            if len(results) != len(entries):
                raise ValueError(f"returned {len(results)} results for {len(entries)} calls")
        except Exception as e:
            err = OrdoError(f"batch handler {self.name} failed: {type(e).__name__}: {e}",
                            RemoteError.code)
            for f in futs:
                if not f.done():
                    f.set_exception(err)
            return
        for f, r in zip(futs, results):
            if f.done():
                continue
            if isinstance(r, BaseException):
                f.set_exception(r)
            else:
                f.set_result(r)


class _StreamCaller:
    def __init__(self, arg):
        self.arg = arg
        self.items: collections.deque = collections.deque()
        self.done = False  # ended, failed, or its caller left
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.space: asyncio.Future | None = None
        self.left: asyncio.Future | None = None

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def put(self, x) -> None:
        self.items.append(x)
        self._wake()

    def finish(self, error: BaseException | None) -> None:
        if not self.done:
            self.done = True
            self.error = error
            self.items.append(END)
            self._wake()


class _StreamBatcher(_Batcher):
    """Streaming batches: `fn(args)` is an async generator yielding, per step, a list with one
    entry per caller of the batch: an item, ordo.END (that caller's stream ends) or an
    exception (that caller's stream fails). A step waits while a caller holds 16 unread items."""

    async def stream(self, arg):
        c = _StreamCaller(arg)
        fut = asyncio.get_running_loop().create_future()  # done: the caller has left
        c.left = fut
        self._add((c, fut))
        try:
            while True:
                while not c.items:
                    c.waiter = asyncio.get_running_loop().create_future()
                    await c.waiter
                x = c.items.popleft()
                if c.space is not None and not c.space.done() and len(c.items) < 8:
                    c.space.set_result(None)
                if x is END:
                    if c.error is not None:
                        raise c.error
                    return
                yield x
        finally:
            c.done = True
            if not fut.done():
                fut.set_result(None)
            if c.space is not None and not c.space.done():
                c.space.set_result(None)

    async def _run(self, entries) -> None:
        callers = [c for c, _ in entries]
        try:
            agen = self.fn([c.arg for c in callers])
            async for step in agen:
                step = list(step)
                if len(step) != len(callers):
                    raise ValueError(f"a step gave {len(step)} entries for {len(callers)} "
                                     "callers")
                for c, x in zip(callers, step):
                    if c.done:
                        continue
                    if x is END:
                        c.finish(None)
                    elif isinstance(x, BaseException):
                        c.finish(x)
                    else:
                        c.put(x)
                if all(c.done for c in callers):
                    break
                for c in callers:  # bounded: a caller that does not read holds the batch
                    while not c.done and len(c.items) >= 16:
                        c.space = asyncio.get_running_loop().create_future()
                        await c.space
            await agen.aclose()
        except Exception as e:
            err = OrdoError(f"batch handler {self.name} failed: {type(e).__name__}: {e}",
                            RemoteError.code)
            for c in callers:
                c.finish(err)
        for c in callers:
            c.finish(None)
