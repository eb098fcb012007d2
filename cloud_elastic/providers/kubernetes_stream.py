"""A Kubernetes watch's stream, read and parsed line by line, for ``kubernetes_watch.ResourceWatch``: bounded
pieces and lines, one error for anything that is not a watch event, a deadline on the wall clock
(:class:`_Watchdog`), and a connection shut or closed so that it is never reused mid-stream. And
:class:`BoundedErrors`, which reads at most :data:`MAX_ERROR_BODY` of an error answer's body, where the client
would read all of it. And :func:`retry_after`: the wait a throttled answer (429, 503) asks for, which the
client's urllib3 no longer sleeps (the provider asks for no retries: it slept inside, out of ``stop()``'s reach, for
as long as the server said, and reported the wait as a stalled connection)."""

from __future__ import annotations

import json
import math
import socket
import threading
from typing import Any, Iterator

__all__ = ["MAX_LINE", "MAX_ERROR_BODY", "MAX_RETRY_AFTER_S", "NotAnEvent", "BoundedErrors", "retry_after"]

#: The longest wait a ``Retry-After`` gets: a server that asks for an hour is asked again within this.
MAX_RETRY_AFTER_S = 30.0

#: The types of a watch event (``watch.EventType`` of the API machinery).
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})
#: The events that carry a pod or node: one of the wrong type is still an event, for the view to read (and warn
#: about, and leave out), not a bad answer that the watch would be sent again after each reconnect.
_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


class NotAnEvent(ValueError):
    """A watch answered with a line that is not a watch event (or one longer than :data:`MAX_LINE`): retried with
    back-off, warned once an outage."""


def _shut(resp: Any) -> None:
    """Shut a response's socket, so that a read under way on it returns now (a no-op once it is handed back)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _parse(line: bytes) -> dict[str, Any]:
    """A watch event from one line; NotAnEvent for anything else (not JSON, a List, an object without a known
    ``type`` or with no ``object``; a ``BOOKMARK`` or ``ERROR`` whose ``object`` is not an object)."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if isinstance(event, dict) and event.get("type") in _EVENT_TYPES and "object" in event and (
            event["type"] in _CHANGES or isinstance(event["object"], dict)):
        return event
    kind = event.get("kind") if isinstance(event, dict) else None
    if isinstance(kind, str):
        shown = f"a {kind[:40]}" + (": a proxy that drops ?watch=true?" if kind.endswith("List") else "")
    elif isinstance(event, dict):
        shown = f"an object of type {str(event.get('type'))[:40]!r}"
    else:
        text = " ".join(line[:60].decode("utf-8", "replace").split())
        shown = repr(text) + ("..." if len(line) > 60 else "")
    raise NotAnEvent(f"the watch was answered with something that is not a watch event ({shown})")


class _Watchdog:
    """``with _Watchdog(resp, after_s):`` shuts ``resp``'s connection ``after_s`` after the block is entered, on
    the wall clock, if the block is still running then.

    A read timeout cannot bound a response: every byte resets it. Shutting the socket makes the read under way
    return (end of file, or an error) at once. Once the block is left it never shuts anything, so a connection
    handed back to the pool afterwards cannot be shut under the next request."""

    def __init__(self, resp: Any, after_s: float) -> None:
        self._resp = resp
        self._after_s = max(0.0, after_s)
        self._lock = threading.Lock()
        self._done = False
        self._timer: threading.Timer | None = None
        #: Whether it shut the connection: what the read then raised (or the end it saw) is the deadline's doing.
        self.fired = False

    def __enter__(self) -> "_Watchdog":
        self._timer = threading.Timer(self._after_s, self._fire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._done = True
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            _shut(self._resp)


def _close(resp: Any) -> None:
    """Close a watch's connection, then hand it back: a stream left mid-way must never be reused."""
    try:
        resp.close()
    finally:
        resp.release_conn()


#: The longest event line a watch takes (a pod's JSON is a few KiB; the API server's own limit on an object is
#: 1.5 MiB): a longer one is a bad line, and the watch starts again from its kept version.
MAX_LINE = 4 * 1024 * 1024


#: The most bytes one read of a watch takes: a chunk the server says is larger (or a body with no chunked
#: encoding) is read in pieces of this, so what is held is bounded by :data:`MAX_LINE` whatever the server sends.
_PIECE = 1 << 16


def _pieces(resp: Any) -> Iterator[bytes]:
    """The body, as it arrives, in pieces of at most :data:`_PIECE` bytes (never decoded: a compressed piece could
    grow past any bound).

    A chunked body (what the API server sends a watch) is read a chunk at a time, a chunk larger than a piece in
    pieces; any other body (a proxy's, or one that ends when the connection closes) a piece at a time as it comes
    (``read1``: what one read of the socket gives, so an event is not held back until a piece fills)."""
    if resp.chunked:
        yield from resp.stream(amt=_PIECE, decode_content=False)
        return
    while True:
        piece = resp.read1(_PIECE, decode_content=False)
        if not piece:
            return
        yield piece


def _lines(resp: Any) -> Iterator[bytes]:
    """The stream's non-empty lines (one JSON event each), as they arrive; NotAnEvent past :data:`MAX_LINE`.

    Each byte is looked at once (a line's end is searched only in what arrived since), so a long line costs
    linear time, not quadratic; and the body is read in bounded pieces, so at most :data:`MAX_LINE` + a piece is
    held."""
    buffer = bytearray()
    for chunk in _pieces(resp):
        start = len(buffer)
        buffer += chunk
        end = buffer.find(b"\n", start)
        while end >= 0:
            line = bytes(buffer[:end])
            del buffer[:end + 1]
            if line.strip():
                yield line
            end = buffer.find(b"\n")
        if len(buffer) > MAX_LINE:
            raise NotAnEvent(f"the watch was answered with a line longer than {MAX_LINE} bytes, which no watch event "
                             "is (the API server keeps an object under 1.5 MiB)")
    if buffer.strip():
        yield bytes(buffer)


def retry_after(exc: BaseException) -> tuple[float, float] | None:
    """(the seconds a 429 or 503 answer's ``Retry-After`` asks for, the wait it gets: at most
    :data:`MAX_RETRY_AFTER_S`); None for any other error or a header that is not a number of seconds (the API
    server sends seconds)."""
    if getattr(exc, "status", None) not in (429, 503):
        return None
    try:
        asked = float((getattr(exc, "headers", None) or {}).get("Retry-After"))
    except (AttributeError, TypeError, ValueError):
        return None
    return (asked, min(max(asked, 0.0), MAX_RETRY_AFTER_S)) if math.isfinite(asked) else None


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        wait = retry_after(exc)
        throttled = f" (Retry-After {wait[0]:g} s)" if wait is not None else ""
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip() + throttled
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


#: The most of an error answer's body that is read: a Status is a few hundred bytes.
MAX_ERROR_BODY = 64 * 1024


class _ErrorAnswer:
    """An error answer as the client's ``ApiException`` reads it (status, reason, ``data``, ``getheaders()``),
    with at most :data:`MAX_ERROR_BODY` bytes of its body."""

    def __init__(self, resp: Any, body: bytes) -> None:
        self.status, self.reason, self.headers, self.data = resp.status, resp.reason, resp.headers, body

    def getheaders(self) -> Any:
        return self.headers


class BoundedErrors:
    """The client's pool manager (``ApiClient.rest_client.pool_manager``), with error answers bounded.

    The client reads the whole body of an answer that is not 2xx into its ``ApiException`` (``http_resp.data``)
    before the caller sees the answer, even with ``_preload_content=False``: a server that answers a list or a
    watch 503 with 256 MiB made the driver hold all of it. Here such an answer has at most
    :data:`MAX_ERROR_BODY` bytes of its body read, in pieces, within ``timeout_s`` on the wall clock (a body that
    trickles in), and its connection is closed, never reused. Anything else is the pool manager's own."""

    def __init__(self, pool: Any, timeout_s: float) -> None:
        self._pool = pool
        self._timeout_s = timeout_s

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        resp = self._pool.request(method, url, *args, **kwargs)
        if kwargs.get("preload_content", True) or 200 <= resp.status <= 299:
            return resp
        body = bytearray()
        try:
            with _Watchdog(resp, self._timeout_s):
                for piece in _pieces(resp):
                    body += piece
                    if len(body) > MAX_ERROR_BODY:
                        break
        except Exception:  # a body cut short (or shut at the deadline): what came of it is enough to report
            pass
        finally:
            _close(resp)
        return _ErrorAnswer(resp, bytes(body[:MAX_ERROR_BODY]))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)
