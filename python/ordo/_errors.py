"""ordo's exceptions: one class per ordo errc (include/ordo/error.hpp), and the system's errno
as OSError."""
from __future__ import annotations

import os

from ._ordo import errc as _errc  # ordo::errc by name, from the C++ half


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
    code = _errc["peer_lost"]


class TimedOut(OrdoError, TimeoutError):
    code = _errc["timed_out"]


class Cancelled(OrdoError):
    code = _errc["cancelled"]


class ProtocolError(OrdoError):
    code = _errc["protocol_error"]


class MethodNotFound(OrdoError):
    code = _errc["method_not_found"]


class BadArguments(OrdoError, TypeError):
    code = _errc["bad_arguments"]


class RemoteError(OrdoError):
    """The remote handler raised; `detail` is its message."""
    code = _errc["remote_error"]


class Overloaded(OrdoError):
    code = _errc["overloaded"]


class ShuttingDown(OrdoError):
    code = _errc["shutting_down"]


class Closed(OrdoError, ConnectionError):
    code = _errc["closed"]


class BadAddress(OrdoError, ValueError):
    code = _errc["bad_address"]


class BadResult(OrdoError):
    code = _errc["bad_result"]


class SessionLost(PeerLost):
    code = _errc["session_lost"]


class Unauthenticated(OrdoError, PermissionError):
    code = _errc["unauthenticated"]


class PermissionDenied(OrdoError, PermissionError):
    code = _errc["permission_denied"]


_by_code = {c.code: c for c in (PeerLost, TimedOut, Cancelled, ProtocolError, MethodNotFound,
                                BadArguments, RemoteError, Overloaded, ShuttingDown, Closed,
                                BadAddress, BadResult, SessionLost, Unauthenticated,
                                PermissionDenied)}


def _error(code: int, text: str | None, detail: str | None) -> Exception:
    if code < 0:  # the system's errno, negated (a listen's bind): OSError, as asyncio's
        return OSError(-code, text or os.strerror(-code))
    return _by_code.get(code, OrdoError)(text or "ordo: failed", code, detail)
