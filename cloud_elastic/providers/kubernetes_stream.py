"""A Kubernetes watch's stream, read and parsed line by line, for ``kubernetes_watch.ResourceWatch``: bounded lines,
one error for anything that is not a watch event, and a connection shut or closed so that it is never reused
mid-stream."""

from __future__ import annotations

import json
import socket
from typing import Any, Iterator

__all__ = ["MAX_LINE", "NotAnEvent"]

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


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__
