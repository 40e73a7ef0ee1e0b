"""A Dask comm backend over ordo, ``LocalCluster(protocol="ordo://")`` or ``"ordo+resume://"``:
Dask finds it through the entry points group ``distributed.comm.backends`` (``ordo =
ordo.dask:OrdoBackend``, ``ordo+resume = ordo.dask:OrdoResumeBackend``).

One Dask comm is one ordered ordo connection to the listener's ordo.Server (tcp://host:port),
carrying one two-way stream (docs/protocol.md, "Streams both ways"):

    connector                                  listener (one ordo.Server)
    two-way stream dask.comm             ->    makes this connection's comm and runs Dask's
                                               handshake (Listener.on_connection), then the handler
                                         <-    first item: the connector's address as the listener
                                               sees it; then each message the listener's comm
                                               writes, in order; the stream's end is its close
    its items (tail, chunks)             ->    each message the connector's comm writes, in order;
                                               the end of these items is the connector's close

Each direction has its own credit, so a side that does not read holds the other's writes (the
listener's items: _INBOX_BYTES of credit, _RESUME_WINDOW_BYTES on ordo+resume, and its writes
wait while _INBOX_BYTES more wait for that credit; the connector's: the listener's ordo window
and what its inbox holds, _INBOX_BYTES).

A message is the list of frames distributed.protocol makes (to_frames, as Dask's tcp comm, with
frames split at the part size). It travels as one stream item when it holds up to the part size
(_PART_BYTES; _RESUME_PART_BYTES on ordo+resume, whose unacknowledged bytes are bounded), and as
several parts otherwise, each ``(tail, chunks)``: tail 0 ends the message, 1 says that more
frames follow, 2 that the last chunk's frame goes on in the next part (only a frame longer than
a part is cut): no ordo message exceeds ordo's max_message_bytes (128 MiB). Frames are written
from Dask's buffers and read as memoryviews of the ordo message that carried them (zero_copy),
as Dask's tcp comm reads them: no copies in Python but for a frame cut across parts. The tail
goes first so that a part's last frame ends its item: a big one that is bytes is written from
Dask's buffer (ordo's packb_split), without the copy the rest of the item is packed into.

Ordering and failure: messages arrive once, in the order written. A comm is closed by its own
close() or abort(), by the other side's, or when its connection is lost; then read() raises
CommClosedError once the messages already here are read, and write() raises it at once.
ordo+resume:// connects with ``?resume_ms=N`` (Dask config ``distributed.comm.ordo.resume-ms``,
30000 by default): a connection that drops is resumed within N ms and the comm goes on as if
nothing happened. A session that is not resumed in time, or that the listener lost, closes the
comm; it is never reopened silently. The price: a peer that dies without closing its comms is
noticed only once the window has passed. Every object here belongs to the loop that made it.
"""
from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import weakref

import dask
from distributed.comm.addressing import get_address_host, parse_host_port, unparse_host_port
from distributed.comm.core import Comm, CommClosedError, Connector, Listener
from distributed.comm.registry import Backend
from distributed.comm.utils import ensure_concrete_host, from_frames, to_frames
from distributed.utils import ensure_ip, get_ip, get_ipv6

from . import OrdoError
from . import Server as _OrdoServer
from . import connect as _ordo_connect
from ._dask_parts import _Inbox, _parts

logger = logging.getLogger(__name__)

_PART_BYTES = 64 << 20  # frame bytes in one ordo message at most (Dask's tcp shard size)
_RESUME_PART_BYTES = 8 << 20  # the same on ordo+resume
_INBOX_BYTES = 64 << 20  # unread bytes past which the sender is held (credit)
# The listener's credit on ordo+resume, which keeps what it sent until acknowledged
# (max_unacked_bytes, 64 MiB): it may send no more than this ahead.
_RESUME_WINDOW_BYTES = 16 << 20
RESUME_MS = 30000  # ordo+resume's window when the Dask config does not set one

_END = object()  # in a listener comm's outbox: the stream ends here (close)
_ABORT = object()  # in a listener comm's outbox: the stream fails here (abort)


class OrdoComm(Comm):
    """A Dask comm over one ordo connection; `_link` is its side's transport (_ClientLink or
    _ServerLink). One reader and one writer at a time, as Dask's Comm contract says."""

    def __init__(self, link, local_addr: str, peer_addr: str, deserialize: bool = True):
        super().__init__(deserialize=deserialize)
        self._link = link
        self._local_addr = local_addr  # core.connect reads these two names
        self._peer_addr = peer_addr
        self._closed = False
        # A comm that Dask drops unclosed is aborted, so that its connection does not linger.
        self._finalizer = weakref.finalize(self, _abandon, link, repr(self))
        self._finalizer.atexit = False

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    def closed(self) -> bool:
        """True once closed here, or the other side has gone and its messages are read."""
        return self._closed or self._link.inbox.drained()

    async def read(self, deserializers=None):
        """The next message. Raises CommClosedError once the comm is closed (here: at once;
        by the other side or a lost connection: after the messages already here). Cancelling a
        read loses no message."""
        if self._closed:
            raise CommClosedError(f"in {self!r}: closed")
        try:
            frames = await self._link.inbox.get()
        except CommClosedError as e:
            raise CommClosedError(f"in {self!r}: {e}") from None
        try:
            return await from_frames(frames, deserialize=self.deserialize,
                                     deserializers=deserializers,
                                     allow_offload=self.allow_offload)
        except EOFError:  # frames that do not decode: what follows cannot be trusted
            self.abort()
            raise CommClosedError(f"in {self!r}: aborted on truncated data") from None

    async def write(self, msg, serializers=None, on_error="message") -> int:
        """Sends `msg`, serialised as Dask's tcp comm does; returns its bytes. Raises
        CommClosedError if the comm is closed or its connection gone. Waits while the other
        side holds too much unread (see the module's docstring)."""
        self._check_open()
        frames = await to_frames(
            msg, allow_offload=self.allow_offload, serializers=serializers, on_error=on_error,
            context={"sender": self.local_info, "recipient": self.remote_info,
                     **self.handshake_options},
            frame_split_size=self._link.part_bytes)
        self._check_open()  # again: to_frames may have waited (offload)
        try:
            return await self._link.send(frames)
        except CommClosedError as e:
            raise CommClosedError(f"in {self!r}: {e}") from None

    def _check_open(self) -> None:
        if self._closed or self._link.gone is not None:
            raise CommClosedError(f"in {self!r}: closed")

    async def close(self) -> None:
        """Closes the comm; what was written before is delivered first."""
        if not self._closed:
            self._closed = True
            self._finalizer.detach()
            await self._link.close()

    def abort(self) -> None:
        """Closes the comm at once; what was written may not all be delivered."""
        if not self._closed:
            self._closed = True
            self._finalizer.detach()
            self._link.abort("aborted")


def _abandon(link, name: str) -> None:
    """A comm was dropped unclosed: aborts its link, unless it has ended (the other side
    closed it: Dask does not close such comms) or its loop has."""
    if link.gone is None and not link.loop.is_closed():
        logger.warning("closing the dangling %s", name)
        link.abort("the comm was dropped unclosed")


# ---- the connector's side -----------------------------------------------------------------

class _ClientLink:
    """A connector's transport: the ordo channel and its dask.comm stream, and the pump, a task
    that moves the stream's items into the inbox (so that closed() sees the other side's close
    without a read, and a cancelled read loses nothing) and that closes the channel."""

    def __init__(self, ch, stream, part_bytes: int):
        self.loop = asyncio.get_running_loop()
        self.ch = ch
        self.stream = stream
        self.part_bytes = part_bytes
        self.inbox = _Inbox(self.loop, _INBOX_BYTES)
        self.gone: str | None = None  # why nothing more is sent
        self.lock = asyncio.Lock()  # keeps the parts of one message together
        self.pump = self.loop.create_task(self._pump())

    async def _pump(self) -> None:
        reason = "the listener closed the comm"
        try:
            async for item in self.stream:
                self.inbox.put(item[1], item[0])
                if self.inbox.nbytes >= self.inbox.limit:  # hold the listener (stream credit)
                    await self.inbox.below()
        except OrdoError as e:  # PeerLost, SessionLost, the listener aborting, ...
            reason = f"the comm ended: {e}"
        except asyncio.CancelledError:  # by abort(), which cancelled the stream
            pass
        except Exception as e:  # an item that is not (tail, chunks): nothing after it is trusted
            reason = f"the listener sent what is not a message: {e!r}"
            self.stream.cancel()
        finally:
            self.gone = self.gone or reason
            self.inbox.end(self.gone)
            self.ch.close()  # after what was sent (a resumable session's ordo.bye too)

    async def send(self, frames: list) -> int:
        total = 0
        async with self.lock:
            for chunks, tail, n in _parts(frames, self.part_bytes):
                if self.gone is not None:
                    raise CommClosedError(self.gone)
                try:
                    # Waits while the listener's credit is used up (it is not reading).
                    sent = await self.stream.write((tail, chunks))
                except (OrdoError, TypeError) as e:
                    self.abort(f"write failed: {e}")
                    raise CommClosedError(f"write failed: {e}") from e
                except asyncio.CancelledError:
                    # The part went (write() hands it over before it waits): one that does not
                    # end its message leaves the listener a torn one, and nothing may follow.
                    if tail:
                        self.abort("a write was cancelled in the middle of a message")
                    raise
                if not sent:  # the stream has ended (the pump will say why)
                    raise CommClosedError(self.gone or "the listener ended the comm")
                total += n
        return total

    async def close(self) -> None:
        """Ends the connector's items after those written; returns once the listener has ended
        its side too (it read them: Dask's tcp comm waits for its writes to flush)."""
        if self.gone is None:
            self.gone = "closed"
            self.inbox.end("closed")
            self.stream.close()
        await asyncio.wait([self.pump])

    def abort(self, reason: str) -> None:
        """Nothing more is sent or received: the stream is cancelled (the listener's comm
        ends), and the pump closes the channel."""
        if self.gone is None:
            self.gone = reason
            self.inbox.end(reason)
        self.stream.cancel()
        if not self.pump.done():
            self.pump.cancel()


class OrdoConnector(Connector):
    def __init__(self, scheme: str, resume: bool):
        self.scheme, self.resume = scheme, resume

    async def connect(self, address, deserialize=True, **connection_args):
        """A comm to the listener at `address` (host:port). Raises CommClosedError (an
        OSError, which Dask retries) when it cannot be reached or refuses the comm."""
        host, port = parse_host_port(address)
        url = "tcp://" + unparse_host_port(host, port)
        if self.resume:
            ms = dask.config.get("distributed.comm.ordo.resume-ms", RESUME_MS)
            url += f"?resume_ms={int(ms)}"
        try:
            ch = await _ordo_connect(url)
        except OrdoError as e:
            if isinstance(e, ValueError):  # BadAddress
                raise
            raise CommClosedError(f"{self.scheme}://{address}: {e}") from e
        try:
            window = _RESUME_WINDOW_BYTES if self.resume else _INBOX_BYTES
            stream = ch.two_way("dask.comm", window_bytes=window, zero_copy=True)
            seen_as = await anext(stream)  # the listener has made its comm
            link = _ClientLink(ch, stream, _RESUME_PART_BYTES if self.resume else _PART_BYTES)
        except (OrdoError, StopAsyncIteration) as e:
            ch.close()
            raise CommClosedError(f"{self.scheme}://{address} refused the comm: "
                                  f"{e or 'stream ended'}") from e
        except BaseException:  # cancelled: Dask's connect timeout
            ch.close()
            raise
        return OrdoComm(link, f"{self.scheme}://{seen_as.removeprefix('tcp://')}",
                        f"{self.scheme}://{unparse_host_port(host, port)}", deserialize)


# ---- the listener's side ------------------------------------------------------------------

class _ServerLink:
    """A listener comm's transport: what its dask.comm stream is to send (the outbox), and its
    inbox, which the connector's items fill."""

    def __init__(self, listener: OrdoListener, key: int, seen_as: str):
        self.loop = asyncio.get_running_loop()
        self.listener = listener
        self.key = key  # the connection's peer id
        self.seen_as = seen_as  # the connector's address, as this side sees it
        self.part_bytes = listener.part_bytes
        self.inbox = _Inbox(self.loop, _INBOX_BYTES)
        self.outbox: collections.deque = collections.deque()  # ((tail, chunks), nbytes)
        self.outbox_bytes = 0
        self.out_waiter: asyncio.Future | None = None  # the stream, waiting for the outbox
        self.space: list[asyncio.Future] = []  # send(), waiting for the outbox to drain
        self.streaming = False  # dask.comm is running
        self.gone: str | None = None  # why nothing more is sent
        self.forgotten = self.loop.create_future()  # done: the listener has let it go

    async def send(self, frames: list) -> int:
        total = 0
        for chunks, tail, n in _parts(frames, self.part_bytes):
            self.outbox.append(((tail, chunks), n))
            total += n
        self.outbox_bytes += total
        self.wake()
        # Held while the connector does not read (its credit holds the stream), as tcp's
        # write waits for room: what waits here stays under _INBOX_BYTES and one message.
        while self.outbox_bytes > _INBOX_BYTES and self.gone is None:
            fut = self.loop.create_future()
            self.space.append(fut)
            await fut
        return total

    def took(self, n: int) -> None:
        """The stream took a part of `n` bytes from the outbox."""
        self.outbox_bytes -= n
        if self.space and self.outbox_bytes <= _INBOX_BYTES:
            self.wake_senders()

    def wake_senders(self) -> None:
        space, self.space = self.space, []
        for f in space:
            if not f.done():
                f.set_result(None)

    async def close(self) -> None:
        """Returns once what was written is with ordo (dask.comm has ended), as Dask's tcp
        comm waits for its writes to flush, and, for the last comm of a stopped listener, once
        its ordo server has stopped."""
        self.end(_END, "closed", drop=False)
        await asyncio.shield(self.forgotten)
        await self.listener.stopped()

    def abort(self, reason: str) -> None:
        self.end(_ABORT, reason, drop=True)

    def end(self, last, reason: str, drop: bool) -> None:
        """Nothing more is sent after `last` (_END or _ABORT), nor received; `drop`: what is
        queued and unsent is dropped."""
        self.inbox.end(reason)
        if self.gone is None:
            self.gone = reason
            if drop:
                self.outbox.clear()
                self.outbox_bytes = 0
            self.outbox.append((last, 0))
            self.wake()
            self.wake_senders()
        if not self.streaming:  # no stream to end: the listener lets it go now
            self.listener.forget(self)

    def wake(self) -> None:
        if self.out_waiter is not None and not self.out_waiter.done():
            self.out_waiter.set_result(None)


class OrdoListener(Listener):
    """Serves Dask comms on an ordo.Server listening on tcp://host:port. stop() stops taking
    new comms at once (the port is free when it returns, as tcp://'s); the ordo server itself
    stops, with no task on the loop, once the comms it holds have ended."""

    def __init__(self, scheme: str, address: str, comm_handler, deserialize: bool = True,
                 allow_offload: bool = True, default_host: str | None = None,
                 default_port: int = 0, **connection_args):
        if connection_args.get("require_encryption"):
            raise RuntimeError(f"encryption required by Dask configuration, refusing to listen "
                               f"on {scheme}://{address}: ordo's Dask comms are not encrypted")
        self.scheme, self.prefix = scheme, scheme + "://"  # Worker.start_unsafe reads prefix
        self.part_bytes = _RESUME_PART_BYTES if scheme.endswith("+resume") else _PART_BYTES
        self.ip, self.port = parse_host_port(address, default_port)
        self.default_host, self.comm_handler = default_host, comm_handler
        self.deserialize, self.allow_offload = deserialize, allow_offload
        self._srv: _OrdoServer | None = None
        self._bound: tuple[str, int] = ("", 0)  # the bound address, once started
        self._links: dict[int, _ServerLink] = {}  # by the connection's peer id
        self._tasks: set[asyncio.Task] = set()  # comm handlers
        self._stopping = False
        self._stop_future: asyncio.Future[None] | None = None  # the ordo server's stop

    async def start(self) -> None:
        srv = _OrdoServer()
        # concurrent=True: each connection's stream runs as its request is read.
        srv.method(name="dask.comm", concurrent=True, with_peer=True, zero_copy=True,
                   reads=True)(self._comm)
        # Set before listen() returns: a caller that knows the port may be served before.
        self._srv, self._loop = srv, asyncio.get_running_loop()
        self._bound = (self.ip or "0.0.0.0", self.port)
        bound = await srv.listen("tcp://" + unparse_host_port(*self._bound))
        self._bound = parse_host_port(bound.removeprefix("tcp://"))

    def stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            if self._srv is not None:
                self._srv.stop_listening()
            self._stop_if_idle()

    @property
    def listen_address(self) -> str:
        return f"{self.prefix}{unparse_host_port(*self._bound)}"

    @property
    def contact_address(self) -> str:
        host = ensure_concrete_host(self._bound[0], default_host=self.default_host)
        return f"{self.prefix}{unparse_host_port(host, self._bound[1])}"

    # -- the ordo method: one dask.comm per connection, keyed by it (peer._id is the same
    # across resumes too) --

    async def _comm(self, peer, items):
        key = peer._id
        if key in self._links:
            raise CommClosedError("a second Dask comm on one connection")
        if self._stopping:
            raise CommClosedError(f"{self.listen_address} has stopped listening")
        seen_as = peer.identity.address
        link = _ServerLink(self, key, seen_as)
        comm = OrdoComm(link, self.contact_address,
                        f"{self.prefix}{seen_as.removeprefix('tcp://')}", self.deserialize)
        comm.allow_offload = self.allow_offload
        self._links[key] = link
        link.streaming = True
        taking = self._spawn(self._take(link, items))
        cancelled = False
        try:
            self._spawn(self._serve(comm))
            yield seen_as
            out = link.outbox
            while True:
                while not out:
                    link.out_waiter = link.loop.create_future()
                    await link.out_waiter
                item, n = out.popleft()
                if item is _END:
                    return
                if item is _ABORT:
                    raise CommClosedError(f"{self.listen_address} aborted the comm")
                link.took(n)
                yield item
        except (asyncio.CancelledError, GeneratorExit):  # by ordo: the connection is gone
            cancelled = True  # (a resume aside), or the connector cancelled the stream
            raise
        finally:
            link.streaming = False
            taking.cancel()
            if cancelled and link.gone is None:
                # The connector's messages that had come are still read, before the close.
                for tail, chunks in items._take_all():
                    link.inbox.put(chunks, tail)
            link.end(_END, "connection lost" if cancelled else "the comm's stream ended",
                     drop=True)

    @staticmethod
    async def _take(link: _ServerLink, items) -> None:
        """Moves the connector's messages into the comm's inbox; holds the connector (its
        credit) while the inbox is full."""
        reason = "the connector closed the comm"
        try:
            async for tail, chunks in items:
                link.inbox.put(chunks, tail)
                if link.inbox.nbytes >= link.inbox.limit:
                    await link.inbox.below()
        except OrdoError as e:  # PeerLost, Cancelled; ProtocolError: it broke its credit
            reason = f"connection lost: {e}"
        except (TypeError, ValueError) as e:  # an item that is not (tail, chunks)
            reason = f"the connector sent what is not a message: {e!r}"
        # After its messages: they stay readable.
        link.end(_END if reason.startswith("the connector closed") else _ABORT, reason,
                 drop=True)

    # -- comm handlers and the server's end --

    async def _serve(self, comm: OrdoComm) -> None:
        try:
            await self.on_connection(comm)
        except CommClosedError:
            logger.info("comm from %s closed before its handshake completed", comm.peer_address)
            return
        r = self.comm_handler(comm)
        if inspect.isawaitable(r):
            await r

    def _spawn(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: a comm handler failed", self.listen_address,
                         exc_info=task.exception())

    def forget(self, link: _ServerLink) -> None:
        if self._links.get(link.key) is link:
            del self._links[link.key]
            self._stop_if_idle()
        if not link.forgotten.done():
            link.forgotten.set_result(None)

    def _stop_if_idle(self) -> None:
        if self._stopping and not self._links and self._stop_future is None and self._srv:
            self._stop_future = self._srv.stop_soon()

    async def stopped(self) -> None:
        """Waits for the ordo server's stop, if it has begun."""
        if self._stop_future is not None and not self._stop_future.done():
            await asyncio.shield(self._stop_future)


def _host_facing_scheduler(handle_comm) -> str | None:
    """The host a listener bound to all interfaces advertises when it serves a Worker: the
    local address that faces the worker's scheduler, as Dask's Worker.start_unsafe passes to
    tcp:// and tls:// listeners only (as default_host). None when it has no scheduler."""
    address = getattr(getattr(getattr(handle_comm, "__self__", None), "scheduler", None),
                      "address", None)
    if not isinstance(address, str) or address.startswith("inproc://"):
        return None
    try:
        return get_ip(get_address_host(address))
    except (OSError, ValueError):  # no route to it: Dask's default (get_ip()) then
        return None


# ---- backends -----------------------------------------------------------------------------

class OrdoBackend(Backend):
    """``ordo://host:port``: one ordo connection per comm. Addresses are handled as Dask's
    tcp:// ones are (IPv4 and IPv6 hosts, resolved to IPs)."""

    scheme = "ordo"
    resume = False

    def get_connector(self) -> OrdoConnector:
        return OrdoConnector(self.scheme, self.resume)

    def get_listener(self, loc, handle_comm, deserialize, **connection_args) -> OrdoListener:
        if connection_args.get("default_host") is None:
            connection_args["default_host"] = _host_facing_scheduler(handle_comm)
        return OrdoListener(self.scheme, loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc):
        return parse_host_port(loc)[0]

    def get_address_host_port(self, loc):
        return parse_host_port(loc)

    def resolve_address(self, loc):
        host, port = parse_host_port(loc)
        return unparse_host_port(ensure_ip(host), port)

    def get_local_address_for(self, loc):
        host = ensure_ip(parse_host_port(loc)[0])
        return unparse_host_port(get_ipv6(host) if ":" in host else get_ip(host), None)


class OrdoResumeBackend(OrdoBackend):
    """``ordo+resume://host:port``: the same over resumable sessions (see the module's
    docstring): a connection that drops and comes back within the window closes no comm."""

    scheme = "ordo+resume"
    resume = True
