"""ordo's exceptions: one class per ordo errc (include/ordo/error.hpp), and the system's errno
as OSError."""
from __future__ import annotations

import os


class OrdoError(Exception):
    """A failed ordo operation. `code` is ordo's errc value (include/ordo/error.hpp; 0 when
    not ordo's), `message` the whole text, `detail` the remote message or local reason."""

    code = 0

    def __init__(self, message: str, code: int | None = None, detail: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.detail = detail if detail is not None else message


class PeerLost(OrdoError, ConnectionError):
    code = 1


class TimedOut(OrdoError, TimeoutError):
    code = 2


class Cancelled(OrdoError):
    code = 3


class ProtocolError(OrdoError):
    code = 4


class MethodNotFound(OrdoError):
    code = 5


class BadArguments(OrdoError, TypeError):
    code = 6


class RemoteError(OrdoError):
    """The remote handler raised; `detail` is its message."""
    code = 7


class Overloaded(OrdoError):
    code = 8


class ShuttingDown(OrdoError):
    code = 9


class Closed(OrdoError, ConnectionError):
    code = 10


class BadAddress(OrdoError, ValueError):
    code = 11


class BadResult(OrdoError):
    code = 12


class SessionLost(PeerLost):
    code = 13


class Unauthenticated(OrdoError, PermissionError):
    code = 14


class PermissionDenied(OrdoError, PermissionError):
    code = 15


_by_code = {c.code: c for c in (PeerLost, TimedOut, Cancelled, ProtocolError, MethodNotFound,
                                BadArguments, RemoteError, Overloaded, ShuttingDown, Closed,
                                BadAddress, BadResult, SessionLost, Unauthenticated,
                                PermissionDenied)}


def _error(code: int, text: str | None, detail: str | None) -> Exception:
    if code < 0:  # the system's errno, negated (a listen's bind): OSError, as asyncio's
        return OSError(-code, text or os.strerror(-code))
    return _by_code.get(code, OrdoError)(text or "ordo: failed", code, detail)
