"""Call context (docs/protocol.md, "Call context"): what a handler reads of its call
(ordo.current_context(), a contextvar), and what a call made inside a handler takes from it."""
from __future__ import annotations

import contextvars
import math
import time

from . import _ordo


class CallContext:
    """What a call carries besides its arguments, as its handler reads it with
    ordo.current_context(): its deadline and metadata, and its W3C trace context."""

    __slots__ = ("deadline", "pairs", "metadata", "trace_id", "parent_id", "span_id",
                 "trace_flags")

    def __init__(self, packed: bytes):
        # A C++ caller's str may be any bytes: what is not UTF-8 is kept as surrogates.
        deadline_ns, pairs, self.trace_id, self.parent_id, self.span_id, self.trace_flags = \
            _ordo.unpackb(packed, True)
        #: time.monotonic() when the caller stops waiting (the server's steady clock, the same
        #: one on Linux); None: no deadline.
        self.deadline = None if deadline_ns < 0 else deadline_ns / 1e9
        #: The metadata in the order sent, repeated keys kept: [(key, str or bytes), ...].
        self.pairs = [tuple(kv) for kv in pairs]
        #: The same as a dict (the last of repeated keys).
        self.metadata = dict(self.pairs)

    def time_left(self) -> float | None:
        """Seconds left until the deadline (0 once passed); None without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def child_traceparent(self) -> str | None:
        """The traceparent of a call made inside this handler: this trace, this handler's span
        as the parent. None when the call is not traced."""
        if not self.trace_id:
            return None
        return f"00-{self.trace_id}-{self.span_id}-{self.trace_flags:02x}"

    def __repr__(self) -> str:
        return (f"CallContext(time_left={self.time_left()}, metadata={self.metadata!r}, "
                f"trace_id={self.trace_id!r})")


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "ordo_call_context", default=None)


def current_context() -> CallContext | None:
    """The context of the call whose handler is running, in this task (a contextvar: tasks the
    handler starts inherit it); None outside a handler, and for a call with no context. A call
    made while it is set takes what is left of its deadline unless it has a timeout, and a
    traceparent naming this handler's span, unless it has one."""
    return _current.get()


def _outgoing(method: str, metadata, ctx: CallContext | None,
              timeout_ms: int) -> tuple[list, int]:
    """A call's metadata as [(key, value), ...] and its timeout, with what it inherits from
    `ctx`; the timeout is -1 when that deadline has passed."""
    pairs = []
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, bytes if k.endswith("-bin") else str):
                raise TypeError(f"ordo: the metadata of a call to {method} maps str to str (bytes "
                                f"for a key ending in -bin), not {type(k).__name__} to "
                                f"{type(v).__name__} for {k!r}")
            pairs.append((k, v))
    if ctx is not None:
        if ctx.trace_id and "traceparent" not in (metadata or ()):
            pairs.append(("traceparent", ctx.child_traceparent()))
            state = ctx.metadata.get("tracestate")
            if state is not None:
                pairs.append(("tracestate", state))
        if timeout_ms == 0 and ctx.deadline is not None:
            left = ctx.deadline - time.monotonic()
            timeout_ms = max(1, math.ceil(left * 1000)) if left > 0 else -1
    return pairs, timeout_ms
