"""The control-plane HTTP server the driver runs for its workers.

Workers POST signed JSON (see :mod:`cloud_elastic.control`) to ``/v1/<kind>``;
the server verifies each request and hands it to a handler function, whose
result is sent back signed. Requests that fail verification are answered
with a 4xx status, logged once per kind of refusal and then counted (never keyed on
the request's own bytes: see :class:`~.accepting.RefusalLog`), and never reach the
handler: a forged, malformed or oversized message cannot change the job.

One thread serves every connection (:class:`~.selector_server.SelectorServer`,
shared with the rendezvous store): a large group keeps two connections per
worker open, mostly holding a long-poll. A handler answers at once with a dict,
or returns :class:`Held` for a long-poll: the connection then waits, with no
thread, until someone calls :meth:`Held.finish` (from any thread) or its
deadline passes.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import socket
import threading
import time
from collections import deque
from typing import Any, Callable, Union

from cloud_elastic.control import MAX_BODY, MAX_REQUEST, SIGNATURE_HEADER, SIGNED_BEFORE_START, Codec
from cloud_elastic.driver.net.accepting import CONTROL_SHARE, RefusalLog
from cloud_elastic.driver.net.ports import listening_kept
from cloud_elastic.driver.net.selector_server import PROVEN, Connection, SelectorServer
from cloud_elastic.errors import ControlPlaneError

__all__ = ["ControlServer", "Handler", "Held"]

log = logging.getLogger(__name__)


class Held:
    """A reply that is not ready yet: the request is held until :meth:`finish` or the deadline.

    ``on_deadline()`` gives the reply when ``timeout_s`` passes first (it runs on
    the server's thread). Exactly one of the two answers the request.
    """

    def __init__(self, timeout_s: float, on_deadline: Callable[[], dict[str, Any]]) -> None:
        self.deadline = time.monotonic() + timeout_s
        self._on_deadline = on_deadline
        self._lock = threading.Lock()
        self._done = False
        self._early: dict[str, Any] | None = None
        self._deliver: Callable[[Held, dict[str, Any]], None] | None = None
        self._conn: _Conn | None = None
        self._message: dict[str, Any] = {}

    @property
    def answered(self) -> bool:
        """Whether the request has been answered (by :meth:`finish` or at the deadline)."""
        return self._done

    def finish(self, reply: dict[str, Any]) -> bool:
        """Answer the request with ``reply`` (thread-safe); False if it was already answered."""
        with self._lock:
            if self._done:
                return False
            self._done = True
            deliver = self._deliver
            if deliver is None:
                self._early = reply  # answered before the server took it over
                return True
        deliver(self, reply)
        return True

    def _adopt(self, deliver: Callable[[Held, dict[str, Any]], None]) -> dict[str, Any] | None:
        with self._lock:
            if self._done:
                return self._early
            self._deliver = deliver
            return None

    def _expire(self) -> dict[str, Any] | None:
        with self._lock:
            if self._done:
                return None
            self._done = True
        return self._on_deadline()


#: ``handler(kind, message) -> reply``; raise ControlPlaneError for a bad request.
Handler = Callable[[str, dict[str, Any]], Union[dict[str, Any], Held]]

#: Limits of the request reader, and how long a connection may sit idle. A worker's request head (DriverClient:
#: the request line, Host, Accept-Encoding, Content-Length, Content-Type and the signature) is about 250 bytes.
_MAX_HEAD = 8192
_MAX_HEADERS = 100
_IDLE_S = 60.0
#: A connection must bring a request signed with the job's secret within this long of its opening, and one address
#: may hold at most this many connections that have not yet (past them, its oldest is closed): a stranger's
#: connections, idle or trickling a byte at a time, then cannot fill the control plane's share of descriptors and
#: lock the workers out (see selector_server: a full share closes strangers' connections, never signed ones).
_FIRST_REQUEST_S = 10.0
_MAX_UNSIGNED_PER_ADDRESS = 64
#: What the inboxes of connections that have not brought a signed request may hold together (see selector_server):
#: a worker's request sits there for a read or two, a stranger's head and body (up to 8 KiB and 64 KiB) for 10 s.
_MAX_UNSIGNED_BYTES = 64 * 1024 * 1024
_SIGNATURE_KEY = SIGNATURE_HEADER.lower().encode()
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error"}


def _kind_of(reason: str) -> str:
    """The kind of a refusal from its text: the words before the first figure, quote or colon.

    The codec's and the handlers' reasons put what the request said after such a character
    ("message timestamp is +400s off", "malformed poll request: 'round' must be ..."); only a message
    signed with the job secret gets past the signature to the reasons that quote it."""
    for i, ch in enumerate(reason):
        if not (ch.isalpha() or ch in " -_"):
            return reason[:i].rstrip(" -_+") or "other"  # "is -400s off": the sign goes with the figure
    return reason.strip() or "other"


#: A parsed request head: where its body starts, the body's length, the request's kind, whether to close the
#: connection after the reply, and the signature header (None when missing).
_Head = tuple[int, int, str, bool, Union[str, None]]


class _Conn(Connection):
    def __init__(self, sock: socket.socket, address: str, peer: str) -> None:
        super().__init__(sock, address, peer)
        self.held: Held | None = None
        self.close_after = False  # close once the reply is out (a rejected request, Connection: close)
        self.opened = time.monotonic()
        self.head: _Head | None = None  # the parsed head of a request whose body is on its way
        self.scanned = 0  # how many bytes of an unfinished head were searched for its end


class ControlServer(SelectorServer):
    """HTTP/1.1 server on one thread; ``start()`` binds (port 0: :func:`~.ports.listening_kept`) and serves,
    ``close()`` stops."""

    name = "control plane"
    share = CONTROL_SHARE
    share_words = "half"
    recv_bytes = 262144
    join_s = 10.0
    peer_has_port = False
    unproven_per_address = _MAX_UNSIGNED_PER_ADDRESS
    unproven_bytes = _MAX_UNSIGNED_BYTES
    tier_words = ("it had not brought a signed request yet",)

    def __init__(self, codec: Codec, handler: Handler, *, bind: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(RefusalLog(log, "control plane", "control plane: rejected a request from %s: %s"))
        self._codec = codec
        self._handler = handler
        self._bind = bind
        self._port = port
        self._finished: deque[tuple[Held, dict[str, Any]]] = deque()
        self._timers: list[tuple[float, int, Held]] = []
        self._seq = itertools.count()
        self._sweep_at = 0.0
        self.rejected = 0

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("server not started")
        return self._listener.getsockname()[1]

    def start(self) -> None:
        # Port 0: one nothing else is handed (.ports). Every worker connects at start-up, a large group at once.
        listener = listening_kept(self._bind, self._port, 1024)
        self._sweep_at = time.monotonic() + 1.0
        self._serve_on(listener)
        log.debug("control plane listening on %s:%d", self._bind, self.port)

    # ------------------------------------------------------------------ loop
    def _connect(self, sock: socket.socket, address: str, peer: str) -> _Conn:
        return _Conn(sock, address, peer)

    def _timeout(self) -> float:
        sweep_at = self._sweep_at
        return max(0.0, min(sweep_at, self._timers[0][0] if self._timers else sweep_at) - time.monotonic())

    def _after_events(self) -> None:
        self._deliver_finished()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, held = heapq.heappop(self._timers)
            self._expire(held)
        if now >= self._sweep_at:
            self._sweep_at = now + 1.0
            self._sweep(now)

    def _received(self, conn: Connection) -> None:
        assert isinstance(conn, _Conn)
        self._parse(conn)

    def _flushed(self, conn: Connection) -> None:
        assert isinstance(conn, _Conn)
        if not conn.outbox and conn.close_after:
            self._drop(conn)

    def _sweep(self, now: float) -> None:
        """Close connections idle (no request held, none arriving) for longer than _IDLE_S, and those that brought
        no signed request within _FIRST_REQUEST_S of opening."""
        for conn in [c for c in self._connections if isinstance(c, _Conn) and c.held is None
                     and (now - c.last > _IDLE_S or not c.proven and now - c.opened > _FIRST_REQUEST_S)]:
            self._drop(conn)

    # -------------------------------------------------------------- requests
    def _parse(self, conn: _Conn) -> None:
        """Read the requests buffered on ``conn``, one at a time (the next waits for a held one).

        A lean HTTP/1.1 reader: a head of at most :data:`_MAX_HEAD` bytes (the
        request line and at most :data:`_MAX_HEADERS` header lines), then exactly
        ``Content-Length`` bytes of body, at most :data:`~cloud_elastic.control.MAX_REQUEST`. Anything else is
        refused with a 4xx status and the connection closed. A head is parsed once, and the bytes searched for
        its end are searched once: a body (or a head) trickled a byte at a time costs linear CPU, not 8 KiB a read.
        """
        while conn.held is None and not conn.close_after and conn.open and conn.inbox:
            head = conn.head if conn.head is not None else self._head(conn)
            if head is None:  # still on its way, or refused
                return
            conn.head = head
            start, length, kind, close, signature = head
            buf = conn.inbox
            if len(buf) < start + length:
                return  # the body is still on its way
            conn.head = None
            body = bytes(buf[start:start + length])
            del buf[:start + length]
            conn.close_after = close
            self._dispatch(conn, kind, body, signature)

    def _head(self, conn: _Conn) -> _Head | None:
        """The head at the start of ``conn``'s inbox: (where its body starts, the body's length, the request's kind,
        whether to close after the reply, its signature); None while it is still on its way, or once refused."""
        buf = conn.inbox
        end = buf.find(b"\r\n\r\n", max(0, conn.scanned - 3), _MAX_HEAD + 4)  # the head and the blank line after it
        if end < 0:
            conn.scanned = len(buf)
            if len(buf) >= _MAX_HEAD + 4:
                self._reject(conn, 431, f"request head over {_MAX_HEAD} bytes", kind="request head too large")
            return None
        conn.scanned = 0
        lines = bytes(buf[:end]).split(b"\r\n")
        line = lines[0]
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._reject(conn, 400, f"malformed request line {line[:64]!r}", kind="malformed request line")
            return None
        method, target, version = parts
        if len(lines) - 1 > _MAX_HEADERS:
            self._reject(conn, 431, f"more than {_MAX_HEADERS} header lines", kind="too many header lines")
            return None
        headers: dict[bytes, bytes] = {}
        for raw in lines[1:]:
            name, sep, value = raw.partition(b":")
            if not sep:
                self._reject(conn, 400, "malformed header line", kind="malformed header line")
                return None
            headers[name.strip().lower()] = value.strip()
        if method != b"POST":
            self._reject(conn, 405, f"method {method[:16].decode('latin-1')!r} not allowed", kind="method not allowed")
            return None
        path = target.decode("latin-1")
        if not path.startswith("/v1/"):
            self._reject(conn, 404, f"unknown path {path[:64]!r}", kind="unknown path")
            return None
        try:
            length = int(headers.get(b"content-length", b""))
        except ValueError:
            self._reject(conn, 411, "missing Content-Length", kind="missing Content-Length")
            return None
        if length < 0 or length > MAX_REQUEST:
            self._reject(conn, 413, f"body of {length} bytes exceeds the {MAX_REQUEST}-byte limit",
                         kind="body too large")
            return None
        connection = headers.get(b"connection", b"").lower()
        close = connection == b"close" or (version == b"HTTP/1.0" and connection != b"keep-alive")
        signature = headers.get(_SIGNATURE_KEY)
        return (end + 4, length, path.rsplit("/", 1)[-1], close,
                None if signature is None else signature.decode("latin-1"))

    def _dispatch(self, conn: _Conn, kind: str, body: bytes, signature: str | None) -> None:
        try:
            message = self._codec.decode(body, signature)
            self._promote(conn, PROVEN)
            if message["kind"] != kind:
                raise ControlPlaneError(f"message kind {message['kind']!r} does not match path {kind!r}")
            reply = self._handler(kind, message)
        except ControlPlaneError as exc:
            self._reject(conn, 401 if "signature" in str(exc) else 400, str(exc), kind=_kind_of(str(exc)))
            return
        except Exception as exc:  # a driver bug: say so loudly once, and tell the worker instead of hanging up
            self._bug(conn, kind, exc)
            return
        if isinstance(reply, Held):
            reply._conn, reply._message = conn, message
            early = reply._adopt(self._finish_from_any_thread)
            if early is None:
                conn.held = reply
                heapq.heappush(self._timers, (reply.deadline, next(self._seq), reply))
                return
            reply = early
        self._answer(conn, kind, message, reply)

    def _answer(self, conn: _Conn, kind: str, message: dict[str, Any], reply: dict[str, Any]) -> None:
        """Send ``reply`` signed; a reply that cannot be sent (past :data:`~cloud_elastic.control.MAX_BODY`, or not
        JSON) is answered 500 instead, and the server serves on."""
        try:
            # A reply names the request it answers, so it cannot be replayed to
            # another worker or for another request.
            out, signature = self._codec.encode(kind, dict(reply, re=message["nonce"], to=message.get("worker")),
                                                limit=MAX_BODY)
        except ControlPlaneError as exc:  # too large: the job's size or its host names, not a bug of the code
            self._log_failure(f"cannot send the {kind} reply to {message.get('worker')!r}; answered 500", exc,
                              trace=False, kind=kind)
            self._reject(conn, 500, f"driver error answering {kind}: {exc}", warn=False)
            return
        except Exception as exc:  # a handler's reply that is not JSON
            self._bug(conn, kind, exc)
            return
        self._respond(conn, 200, out, signature=signature)

    def _finish_from_any_thread(self, held: Held, reply: dict[str, Any]) -> None:
        self._finished.append((held, reply))
        if threading.current_thread() is not self._thread:
            self.wake()

    def _deliver_finished(self) -> None:
        while self._finished:
            held, reply = self._finished.popleft()
            self._release(held, reply)

    def _expire(self, held: Held) -> None:
        try:
            reply = held._expire()
        except Exception as exc:  # a driver bug, as in _dispatch
            conn = held._conn
            if conn is not None and conn.held is held:
                conn.held = None
                self._bug(conn, str(held._message.get("kind")), exc)
            return
        if reply is not None:
            self._release(held, reply)

    def _release(self, held: Held, reply: dict[str, Any]) -> None:
        conn = held._conn
        if conn is None or conn.held is not held:
            return
        conn.held = None
        if not conn.open:
            return
        try:
            self._answer(conn, str(held._message["kind"]), held._message, reply)
            self._parse(conn)  # a request that arrived meanwhile (clients do not pipeline, but may)
        except Exception as exc:
            self._fail(conn, exc)

    def _bug(self, conn: _Conn, kind: str, exc: Exception) -> None:
        """A handler raised ``exc`` (a driver bug): logged with its traceback once per request kind and place raised
        (two kinds failing in one shared helper are two bugs, each logged); the request is answered 500."""
        self._log_failure(f"the driver failed handling {kind!r}", exc, kind=kind)
        self._reject(conn, 500, f"driver error handling {kind}: {type(exc).__name__}: {exc}", warn=False)

    def _failed(self, conn: Connection, exc: Exception) -> None:
        """The server's own code raised ``exc`` handling ``conn`` (logged): its request is answered 500, and it is
        closed; one held or already refused is closed."""
        assert isinstance(conn, _Conn)
        if not conn.open or conn.held is not None or conn.close_after:
            self._drop(conn)
            return
        conn.head, conn.inbox = None, bytearray()
        self._reject(conn, 500, f"driver error: {type(exc).__name__}: {exc}", warn=False)

    def _reject(self, conn: _Conn, status: int, reason: str, *, kind: str = "", warn: bool = True) -> None:
        """Answer ``status`` with ``reason`` and close; warn once per ``kind`` (never text from the request:
        the reason quotes the request, so keyed on it every garbage request would be a line of its own)."""
        self.rejected += 1
        if warn:
            self._refusals.refused(kind or _kind_of(reason), conn.peer, reason)
        conn.close_after = True
        body = json.dumps({"error": reason}).encode()
        # This one refusal is signed: the worker signs from the start it names on (control.SIGNED_BEFORE_START),
        # and must not take that time from whoever answers its connection. Its text is the driver's own.
        signed = self._codec.sign(body) if reason.startswith(SIGNED_BEFORE_START) else None
        self._respond(conn, status, body, signature=signed)

    def _respond(self, conn: _Conn, status: int, body: bytes, *, signature: str | None = None) -> None:
        """The whole reply in one write (status line, headers, body)."""
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n" \
               f"Content-Length: {len(body)}\r\n"
        if signature is not None:
            head += f"{SIGNATURE_HEADER}: {signature}\r\n"
        if conn.close_after:
            head += "Connection: close\r\n"
        conn.outbox += head.encode("latin-1") + b"\r\n" + body
        self._flush(conn)
