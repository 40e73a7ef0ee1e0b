"""ordo for Python: ordered, batched msgpack-rpc calls on asyncio, over ordo's C++ core.

    ch = await ordo.connect("tcp://127.0.0.1:7000?resume_ms=10000")
    assert await ch.inc(1) == 2
    ch.notify("add", 5)
    async for x in ch.stream("count_to", 10): ...
    up = ch.upload("sum"); await up.write(1); total = await up.finish()

Threading: ordo's io_context runs on a thread of its own, which never takes the GIL nor touches
a Python object; calls are handed to it as msgpack bytes with the GIL released, and their
completions come back to each asyncio loop through one eventfd (loop.add_reader), one
wake-up draining every completion queued meanwhile. See docs/python.md.
"""
import atexit as _atexit

from . import _ordo
from ._api import Channel, Identity, Peer, Stream, connect
from ._errors import (BadAddress, BadArguments, BadResult, Cancelled, Closed, MethodNotFound,
                      OrdoError, Overloaded, PeerLost, PermissionDenied, ProtocolError,
                      RemoteError, SessionLost, ShuttingDown, TimedOut, Unauthenticated)
from ._batching import END
from ._context import CallContext, current_context
from ._server import Server
from ._writing import Reader, TwoWay, Upload

__version__: str = _ordo.__version__  # meson.build's project version

__all__ = ["connect", "current_context", "CallContext", "Channel", "Peer", "Identity", "Stream",
           "TwoWay", "Upload", "Reader", "Server", "END", "OrdoError", "PeerLost", "TimedOut", "Cancelled", "ProtocolError",
           "MethodNotFound", "BadArguments", "RemoteError", "Overloaded", "ShuttingDown", "Closed",
           "BadAddress", "BadResult", "SessionLost", "Unauthenticated", "PermissionDenied",
           "shutdown"]


def shutdown(wait_s: float = 2.0) -> None:
    """Closes every channel and server and ends ordo's io thread, waiting up to `wait_s` for
    queued messages to go out. Runs at exit; what is started later fails with Closed."""
    from . import _hub
    _hub._shut = True
    _ordo.shutdown(int(wait_s * 1000))


_atexit.register(shutdown)
