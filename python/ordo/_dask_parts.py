"""The framing of ordo.dask's messages (see ordo/dask.py's docstring): the parts a message's
frames travel in, and the inbox that puts them together again."""
from __future__ import annotations

import asyncio
import collections

from distributed.comm.core import CommClosedError
from distributed.utils import ensure_memoryview


def _parts(frames: list, limit: int):
    """Yields ``(chunks, tail, nbytes)``: the frames cut into parts of at most `limit` bytes
    (tail as in the module's docstring), between frames unless a frame alone is longer. Frames
    are not copied: chunks are bytes or views."""
    part, size = [], 0
    for f in frames:
        if not isinstance(f, bytes):
            f = ensure_memoryview(f)  # also what ordo cannot pack as is (PickleBuffer, ...)
        n, start = len(f) if isinstance(f, bytes) else f.nbytes, 0
        if size and size + n > limit >= n:  # it fits a part of its own
            yield part, 1, size
            part, size = [], 0
        while True:
            room = limit - size
            if n - start <= room:
                part.append(f if start == 0 else memoryview(f)[start:])
                size += n - start
                break
            if room > 0:  # this frame fills the part and goes on in the next one
                part.append(memoryview(f)[start:start + room])
                start += room
                yield part, 2, limit
            else:
                yield part, 1, size
            part, size = [], 0
    yield part, 0, size


class _Inbox:
    """The messages that arrived and are not read yet, in order, then why no more will come.
    Parts are joined here. `nbytes` counts whole messages only: the reader cannot take a part,
    so holding the sender back for one would never end."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int):
        self.loop = loop
        self.limit = limit  # unread bytes past which the sender is held (below())
        self.messages: collections.deque = collections.deque()  # (frames, nbytes)
        self.nbytes = 0
        self.ended: str | None = None  # the reason, once nothing more will come
        self._partial: list | None = None
        self._partial_bytes = 0
        self._joining = False  # the next part's first chunk belongs to the last frame
        self._reader: asyncio.Future | None = None
        self._space: list[asyncio.Future] = []

    def put(self, chunks: list, tail: int) -> None:
        if self.ended is not None:
            return
        n = sum(map(len, chunks))
        if self._partial is None and tail == 0:  # the common case: a whole message
            self.messages.append((chunks, n))
            self.nbytes += n
        else:
            partial = self._partial if self._partial is not None else []
            if self._joining:
                last = partial[-1]
                if not isinstance(last, bytearray):
                    partial[-1] = last = bytearray(last)
                last += chunks[0]
                chunks = chunks[1:]
            partial.extend(chunks)
            self._partial_bytes += n
            self._joining = tail == 2
            if tail:
                self._partial = partial
                return
            self.messages.append((partial, self._partial_bytes))
            self.nbytes += self._partial_bytes
            self._partial, self._partial_bytes = None, 0
        self._wake([self._reader])

    def end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
            self._partial, self._partial_bytes = None, 0  # a message cut short is dropped
            self._wake([self._reader, *self._space])
            self._space = []

    def drained(self) -> bool:  # ended, and every message read
        return self.ended is not None and not self.messages

    async def get(self) -> list:
        """The next message's frames; CommClosedError(reason) once none is left. Cancelling
        it loses nothing."""
        while not self.messages:
            if self.ended is not None:
                raise CommClosedError(self.ended)
            self._reader = self.loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        frames, n = self.messages.popleft()
        self.nbytes -= n
        if self._space and self.nbytes < self.limit:
            self._wake(self._space)
            self._space = []
        return frames

    async def below(self) -> None:
        """Returns once fewer than `limit` bytes are held, or the inbox has ended."""
        while self.nbytes >= self.limit and self.ended is None:
            fut = self.loop.create_future()
            self._space.append(fut)
            await fut

    @staticmethod
    def _wake(futures: list) -> None:
        for f in futures:
            if f is not None and not f.done():
                f.set_result(None)
