"""The serving side: Server, handlers (coroutines, plain functions, async generators) and
batch handlers. Requests arrive through the loop's hub (_hub._LoopHub) as msgpack bytes; each
handler's answer goes back the same way. ordo's C++ server keeps a serial handler's connection
waiting until the answer is back, so handlers run one at a time per connection unless they are
registered with concurrent=True."""
from __future__ import annotations

import asyncio
import contextvars
import inspect
import types

from . import _ordo
from ._api import Peer
from ._errors import BadArguments, Cancelled, Closed, OrdoError, RemoteError, ShuttingDown
from ._hub import (_BIG_ITEM, _check_running, _hub, _LoopHub, _packb, _packb_split, _tokens,
                   _unpackb)
from ._batching import _Batcher, _StreamBatcher
from ._context import CallContext, _current
from ._writing import Reader, _Writer

_handlers: dict = {}  # handler id -> _Handler (ids are unique in the process)
_SIMPLE = {int: (int,), float: (float, int), str: (str,), bytes: (bytes,), bool: (bool,),
           list: (list,), dict: (dict,)}


class _Handler:
    def __init__(self, name: str, fn, concurrent: bool, with_peer: bool, views: bool = False,
                 reads: bool = False):
        self.name = name
        self.fn = fn
        self.concurrent = concurrent
        self.with_peer = with_peer
        self.allow: list[str] | None = None  # subjects that may call it (None: everyone)
        self.views = views  # big bins as memoryviews (zero_copy)
        self.stream = inspect.isasyncgenfunction(fn)
        self.coro = inspect.iscoroutinefunction(fn)
        self.reads = reads  # its first argument (after the peer) is a Reader
        if reads and not (self.stream or self.coro):
            raise TypeError(f"ordo: {name}: a handler with reads=True is a coroutine function "
                            f"(a client stream) or an async generator (a two-way stream)")
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        params = params[int(with_peer) + int(reads):]
        self.signature = "(" + ", ".join(str(p) for p in params) + ")"
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.min_args = sum(1 for p in positional if p.default is p.empty)
        self.max_args = None if any(p.kind == p.VAR_POSITIONAL for p in params) else len(positional)
        self.types = [(i, _SIMPLE[p.annotation], p.annotation.__name__)
                      for i, p in enumerate(positional) if p.annotation in _SIMPLE]
        if any(isinstance(p.annotation, str) for p in positional):  # postponed annotations
            hints = {}
            try:
                import typing
                hints = typing.get_type_hints(fn)
            except Exception:
                pass
            self.types = [(i, _SIMPLE[hints[p.name]], hints[p.name].__name__)
                          for i, p in enumerate(positional) if hints.get(p.name) in _SIMPLE]
        if views:  # a bytes argument of 64 KiB or more arrives as a memoryview
            self.types = [(i, (bytes, memoryview) if t == (bytes,) else t, name)
                          for i, t, name in self.types]

    def check(self, params) -> None:
        n = len(params)
        if n < self.min_args or (self.max_args is not None and n > self.max_args):
            raise BadArguments(f"{self.name}{self.signature} takes "
                               f"{self._count()} arguments, got {n}", BadArguments.code)
        for i, types, tname in self.types:
            if i < n and (not isinstance(params[i], types) or
                          (tname != "bool" and isinstance(params[i], bool))):
                raise BadArguments(f"{self.name}{self.signature}: argument {i + 1} is "
                                   f"{type(params[i]).__name__}, not {tname}", BadArguments.code)

    def _count(self) -> str:
        if self.max_args is None:
            return f"at least {self.min_args}"
        if self.max_args == self.min_args:
            return str(self.min_args)
        return f"{self.min_args} to {self.max_args}"


def _describe(e: BaseException, h: _Handler) -> tuple[int, bytes]:
    if isinstance(e, OrdoError):
        return (e.code or RemoteError.code), e.detail.encode()
    return RemoteError.code, f"{h.name}: {type(e).__name__}: {e}".encode()


def _arrive(lh: _LoopHub, token: int, hid: int, peer_chan: int, data: bytes, method: str,
            stream: bool, ctx: bytes | None) -> None:
    """A request, as ordo's io thread hands it over. A serial method's requests cross many at
    a time (handler_entry::pipeline, _server.cpp), so the order of a connection is kept here:
    while one of its serial handlers runs, its later requests wait in its lane, and they run
    in order, back to back, once it ends."""
    h = _handlers.get(hid)
    if h is not None and h.reads:  # its caller's items may come before it runs
        lh.readers[token] = Reader(lh, token, h.name, h.views)
    lane = lh.lanes.get(peer_chan)
    if lane is not None:
        lane[token] = (hid, data, method, stream, ctx)
        lh.waiting[token] = peer_chan
        return
    _dispatch(lh, token, hid, peer_chan, data, method, stream, ctx)
    if _suspended_serial(lh, token, hid):
        lh.lanes[peer_chan] = {}
        lh.requests[token].add_done_callback(lambda _: _next_in_lane(lh, peer_chan))


def _suspended_serial(lh: _LoopHub, token: int, hid: int) -> bool:
    """Whether the request just dispatched is a serial handler that did not end at once."""
    h = _handlers.get(hid)
    if h is None or h.concurrent:
        return False
    task = lh.requests.get(token)
    return task is not None and not task.done()


def _next_in_lane(lh: _LoopHub, peer_chan: int) -> None:
    lane = lh.lanes.get(peer_chan)
    while lane:
        token = next(iter(lane))
        hid, data, method, stream, ctx = lane.pop(token)
        lh.waiting.pop(token, None)
        _dispatch(lh, token, hid, peer_chan, data, method, stream, ctx)
        if _suspended_serial(lh, token, hid):
            lh.requests[token].add_done_callback(lambda _: _next_in_lane(lh, peer_chan))
            return
    lh.lanes.pop(peer_chan, None)


def _dispatch(lh: _LoopHub, token: int, hid: int, peer_chan: int, data: bytes, method: str,
              stream: bool, ctx: bytes | None = None) -> None:
    if ctx is not None:
        # The handler, and every task it starts, runs in a copy of the loop's context with
        # current_context() set: a contextvar, so that it follows the handler's task.
        contextvars.copy_context().run(_dispatch_in_context, ctx, lh, token, hid, peer_chan,
                                       data, method, stream)
        return
    h = _handlers.get(hid)
    reader = lh.readers.get(token)
    try:
        _start(lh, token, h, peer_chan, data, reader)
    finally:
        if reader is not None:  # dropped with its task (or now, if it ended at once)
            task = lh.requests.get(token)
            if task is None or task.done():
                lh.readers.pop(token, None)
            else:
                task.add_done_callback(lambda _: lh.readers.pop(token, None))


def _start(lh: _LoopHub, token: int, h: _Handler | None, peer_chan: int, data: bytes,
           reader: Reader | None) -> None:
    hub = lh
    if h is None:
        hub.respond(token, ShuttingDown.code, b"ordo: the handler's server has stopped")
        return
    if lh.closing:  # the loop is ending (_LoopHub._close_at_loop_end): no new handler task
        hub.respond(token, ShuttingDown.code,
                    f"ordo: {h.name}: the server's event loop is closing".encode())
        return
    try:
        args = _unpackb(data, False, h.views)
        h.check(args)
    except BadArguments as e:
        hub.respond(token, BadArguments.code, e.detail.encode())
        return
    except Exception as e:
        hub.respond(token, BadArguments.code, f"{h.name}: params do not decode: {e}".encode())
        return
    if reader is not None:
        args = [reader] + args
    if h.with_peer:
        args = [Peer(lh, peer_chan, "(the caller of " + h.name + ")")] + args
    if h.stream:
        lh.requests[token] = lh.loop.create_task(_run_stream(lh, token, h, args))
    elif h.coro:
        # The coroutine's first step runs here: one that does not suspend (most handlers that
        # compute) is answered without a task; one that does goes on in a task from there.
        coro = h.fn(*args)
        try:
            yielded = coro.send(None)
        except StopIteration as done:
            try:
                data = _packb(done.value)
            except Exception as e:
                hub.respond(token, *_describe(e, h))
            else:
                hub.respond(token, 0, data)
            return
        except (Exception, asyncio.CancelledError) as e:
            hub.respond(token, *_describe(e, h))
            return
        lh.requests[token] = lh.loop.create_task(_run(lh, token, h, _resume(coro, yielded)))
    else:  # a plain function runs here, in the loop's drain
        try:
            data = _packb(h.fn(*args))
        except Exception as e:
            hub.respond(token, *_describe(e, h))
        else:
            hub.respond(token, 0, data)


def _dispatch_in_context(ctx: bytes, lh: _LoopHub, token: int, *rest) -> None:
    try:
        c = CallContext(ctx)
    except Exception as e:  # not what _server.cpp packs: answered, the loop goes on
        lh.readers.pop(token, None)
        lh.respond(token, BadArguments.code,
                   f"ordo: the call's context does not decode: {e}".encode())
        return
    _current.set(c)
    _dispatch(lh, token, *rest)


@types.coroutine
def _resume(coro, yielded):
    """Goes on with a coroutine whose first step has run (it yielded `yielded`, the future it
    waits for), inside the task that awaits this: what the task sends or throws goes to it."""
    while True:
        try:
            sent = yield yielded
        except BaseException as e:  # the task's cancellation, or the future's failure
            try:
                yielded = coro.throw(e)
            except StopIteration as done:
                return done.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as done:
                return done.value


def _cancelled(lh: _LoopHub, token: int, h: _Handler) -> None:
    if lh.requests.pop(token, None) is not None:  # not ordo's cancel: say so to the caller
        lh.respond(token, Cancelled.code, f"ordo: handler {h.name} cancelled".encode())


def _answer(lh: _LoopHub, token: int, h: _Handler, e: Exception | None, data: bytes) -> None:
    lh.requests.pop(token, None)
    if e is None:
        lh.respond(token, 0, data)
    else:
        lh.respond(token, *_describe(e, h))


async def _run(lh: _LoopHub, token: int, h: _Handler, rest) -> None:
    try:
        r = await rest
        data = _packb(r)
    except asyncio.CancelledError:
        _cancelled(lh, token, h)
        raise
    except Exception as e:
        _answer(lh, token, h, e, b"")
    else:
        _answer(lh, token, h, None, data)


async def _run_stream(lh: _LoopHub, token: int, h: _Handler, args) -> None:
    w = _Writer(lh)  # 64 items, 64 MiB
    lh.written[token] = w
    agen = h.fn(*args)
    try:
        async for item in agen:
            # A big bin that ends the item is written from its object, not copied.
            front, back, size = _packb_split(item, _BIG_ITEM)
            lh.stream_write(token, front, back)
            if w.add(size):
                await w.wait()
    except asyncio.CancelledError:
        _cancelled(lh, token, h)
        raise
    except Exception as e:
        _answer(lh, token, h, e, b"")
    else:
        _answer(lh, token, h, None, b"")
    finally:
        lh.written.pop(token, None)
        await agen.aclose()  # a cancelled or failed stream's generator runs its finally now


class Server:
    """Serves the registered handlers on every URL it listens on, from the loop that listens.

        srv = ordo.Server()

        @srv.method
        async def inc(x: int) -> int:
            return x + 1

        await srv.listen("tcp://127.0.0.1:7000")

    Handlers are coroutine functions, plain functions (run at once on the loop) or async
    generators (streaming methods). Arguments are checked against the handler's signature
    (count, and the annotations int, float, str, bytes, bool, list, dict): a mismatch answers
    BadArguments naming the method; an exception answers RemoteError with its message (an
    ordo.OrdoError keeps its code). Handlers run serially per connection (a handler's next
    message waits for it) unless registered with concurrent=True; with_peer=True passes the
    caller as an ordo.Peer first, to call it back over the same connection (a serial handler
    that awaits a call back to a serial handler of its caller deadlocks until a deadline).
    """

    def __init__(self, *, auth_tokens: str | None = None, allow_introspection=()):
        """auth_tokens: a token file (lines `TOKEN SUBJECT`): only callers that present one
        of its tokens (the URL parameter token_file=, or ordo.auth), or a client certificate
        signed by the listener's CA, are served; the others get Unauthenticated and their
        connection closes. allow_introspection: the subjects that may then call ordo.stats
        and ordo.methods. Raises ValueError naming the file and line it cannot read."""
        self._tokens: dict[str, str] = {}
        self._introspectors = [str(s) for s in allow_introspection]
        if auth_tokens is not None:
            self._tokens = _ordo.read_token_file(str(auth_tokens))
        self._id = next(_tokens)
        self._lh: _LoopHub | None = None
        self._registered: dict[str, _Handler] = {}
        self._batchers: list = []
        self._stopped = False
        self._stop_future: asyncio.Future[None] | None = None

    def method(self, fn=None, *, name: str | None = None, concurrent: bool = False,
               with_peer: bool = False, allow=None, zero_copy: bool = False,
               reads: bool = False):
        """Registers `fn` under its name (or `name`); usable as @srv.method or
        @srv.method(concurrent=True). allow: the subjects (Peer.identity.subject) that may
        call it; others get PermissionDenied and nothing runs. None: everyone. zero_copy:
        bytes arguments of 64 KiB or more arrive as writable memoryviews of the message.
        reads: `fn` takes an ordo.Reader of the items its caller writes first (after the peer):
        a coroutine function answers a client stream (Channel.upload), an async generator a
        two-way stream (Channel.two_way)."""
        def register(f):
            h = _Handler(name or f.__name__, f, concurrent, with_peer, zero_copy, reads)
            h.allow = None if allow is None else [str(s) for s in allow]
            self._register(h)
            return f
        return register(fn) if fn is not None else register

    def batch(self, fn=None, *, max_batch_size: int = 32, batch_wait_timeout_s: float = 0.005,
              name: str | None = None, allow=None):
        """Registers a batch handler (Ray Serve's @serve.batch): callers make single calls
        with one argument (several: a tuple); `fn` takes the list of arguments of up to
        max_batch_size calls (gathered from every connection for at most batch_wait_timeout_s
        after the first) and returns a list of the same length; an element that is an
        exception fails its call alone; a raise or a wrong length fails the whole batch. An
        async generator function makes a streaming batch handler (see _StreamBatcher).
        allow: as for method(): the subjects that may call it (None: everyone); a caller
        refused gets PermissionDenied and never joins a batch."""
        def register(f):
            n = name or f.__name__
            if inspect.isasyncgenfunction(f):
                b = _StreamBatcher(n, f, max_batch_size, batch_wait_timeout_s)

                async def one_stream(*args):
                    async for x in b.stream(args[0] if len(args) == 1 else tuple(args)):
                        yield x
                one = one_stream
            else:
                b = _Batcher(n, f, max_batch_size, batch_wait_timeout_s)

                async def one_call(*args):
                    return await b.call(args[0] if len(args) == 1 else tuple(args))
                one = one_call
            self._batchers.append(b)
            h = _Handler(n, one, True, False)
            h.signature = "(*args) [batch]"
            h.allow = None if allow is None else [str(s) for s in allow]
            self._register(h)
            return f
        return register(fn) if fn is not None else register

    def _register(self, h: _Handler) -> None:
        old = self._registered.get(h.name)
        hid = next(_tokens)
        if old is not None:
            _handlers.pop(old.hid, None)
        h.hid = hid
        _handlers[hid] = h
        self._registered[h.name] = h
        if self._lh is not None:
            self._add(h)

    def _add(self, h: _Handler) -> None:
        flags = ((1 if h.concurrent else 0) | (2 if h.stream else 0) |
                 (4 if h.allow is not None else 0) | (8 if h.reads else 0))
        self._lh.hub.server_add(self._id, h.name, h.hid, flags, h.signature, h.allow or [])

    def _attach(self, lh: _LoopHub) -> None:
        if self._stopped:
            raise OrdoError("ordo: the server has stopped", Closed.code)
        if self._lh is None:
            self._lh = lh
            lh.hub.server_create(self._id, self._tokens, self._introspectors)
            for h in self._registered.values():
                self._add(h)
        elif self._lh is not lh:
            raise RuntimeError("ordo: a server serves one loop only")

    async def listen(self, url: str) -> str:
        """Binds `url` (tcp://host:port, port 0 for any; unix:///path; tls://...) and serves
        it; returns the bound address. Requests are handled on this loop."""
        _check_running(f"listen on {url}")
        if self._stopped:
            raise OrdoError(f"ordo: listen on {url}: the server has stopped", Closed.code)
        lh = _hub()
        self._attach(lh)
        token = next(_tokens)
        fut = lh.loop.create_future()
        lh.futures[token] = fut
        lh.hub.listen(self._id, token, url)
        _, address = await fut
        return address

    def stop_listening(self) -> None:
        """Stops accepting now: when it returns the listening addresses are free to bind again
        and new callers are refused; the connections already accepted go on being served until
        they end or stop() closes them."""
        if self._lh is not None and not self._stopped:
            self._lh.hub.server_stop_listening(self._id)

    async def stop(self) -> None:
        """Stops accepting, closes every connection (queued answers are sent first; running
        handlers are cancelled) and waits until they have ended. Cancelling the wait leaves the
        stop going on."""
        await asyncio.shield(self.stop_soon())

    def stop_soon(self) -> "asyncio.Future[None]":
        """stop() begun without a task on this loop: returns a future that is done once every
        connection has ended (awaiting it is optional)."""
        if self._stop_future is not None:
            return self._stop_future
        self._stopped = True
        loop = self._lh.loop if self._lh is not None else asyncio.get_running_loop()
        fut = self._stop_future = loop.create_future()

        def unregister(_f) -> None:
            for h in self._registered.values():
                _handlers.pop(h.hid, None)

        fut.add_done_callback(unregister)
        if self._lh is None:
            fut.set_result(None)
            return fut
        token = next(_tokens)
        self._lh.futures[token] = fut
        self._lh.hub.server_stop(self._id, token)
        return fut

    async def __aenter__(self) -> "Server":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
