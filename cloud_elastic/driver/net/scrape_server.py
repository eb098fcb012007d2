"""The driver's metrics listener (``--metrics-port``): what Prometheus scrapes, served with the bounds of the driver's
other listeners.

prometheus_client's own server (``start_http_server``) takes a thread and a descriptor per connection, with no
timeout and no cap: four local processes holding idle connections took a driver to 1,013 threads and its 1,024
descriptors in 60 s; the control plane could then accept nothing, and a replacement worker failed to start (review
rvH, s61). :class:`ScrapeServer` serves the same text from one :class:`~.selector_server.SelectorServer` thread:

* at most :data:`MAX_CONNECTIONS` connections, and no more than :data:`~.accepting.METRICS_SHARE` of the
  descriptor limit; a new connection always gets in, the oldest that has not sent a whole request closed to make
  room for it (then the oldest that has not read its answer);
* each connection has :data:`DEADLINE_S` (``deadline_s``) from its opening to send its request and read the answer,
  then it is closed;
* one request a connection (``Connection: close``), ``GET`` or ``HEAD`` of ``/metrics`` (or ``/``), a head of at most
  8 KiB; anything else is answered 4xx and closed, the refusals logged once per kind and then counted.

What it serves comes from ``render(accept)`` (the request's ``Accept`` header), which returns the body and its
content type: :class:`~cloud_elastic.metrics.MetricsServer` passes prometheus_client's encoder of its registry, so
this module does not import prometheus_client. A render that raises is answered 500 and logged once.
"""

from __future__ import annotations

import collections
import logging
import socket
import time
from typing import Callable

from cloud_elastic.driver.net.accepting import METRICS_SHARE, RefusalLog
from cloud_elastic.driver.net.selector_server import Connection, SelectorServer, listening

__all__ = ["DEADLINE_S", "MAX_CONNECTIONS", "Render", "ScrapeServer"]

log = logging.getLogger(__name__)

#: ``render(accept_header) -> (body, content type)``.
Render = Callable[[str], "tuple[bytes, str]"]

#: The most connections at once: a scraper or two, and room for strangers to be turned away by.
MAX_CONNECTIONS = 64
#: From a connection's opening to its answer read (Prometheus's own scrape timeout is 10 s by default).
DEADLINE_S = 10.0
_MAX_HEAD = 8192
_PATHS = (b"/metrics", b"/")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}
#: Tiers of the connections (none proves anything: the port is unauthenticated): 0, no whole request yet; 1, answered.
_ANSWERED = 1


class _Scrape(Connection):
    def __init__(self, sock: socket.socket, address: str, peer: str, deadline_s: float) -> None:
        super().__init__(sock, address, peer)
        self.deadline = time.monotonic() + deadline_s
        self.answered = False


class ScrapeServer(SelectorServer):
    """Serves ``render``'s text over HTTP at ``bind:port`` (see the module docstring); :meth:`start` binds and serves
    from a daemon thread (OSError when the port is taken), :meth:`close` stops. The constructor does no I/O."""

    name = "metrics port"
    share = METRICS_SHARE
    share_words = "a sixteenth of"
    recv_bytes = 16384
    tiers = 2
    tier_words = ("it had not sent a whole request", "it had not read its answer")
    unproven_per_address = MAX_CONNECTIONS // 2
    max_connections = MAX_CONNECTIONS
    peer_has_port = False

    def __init__(self, render: Render, *, bind: str = "127.0.0.1", port: int = 0,
                 deadline_s: float = DEADLINE_S) -> None:
        super().__init__(RefusalLog(log, "metrics port", "metrics port: refused a connection from %s: %s"))
        self._render = render
        self._bind, self._port = bind, port
        self._deadline_s = deadline_s
        self._deadlines: collections.deque[_Scrape] = collections.deque()  # in the order opened: by deadline

    @property
    def address(self) -> tuple[str, int]:
        """The address and port it listens on (RuntimeError before :meth:`start`)."""
        if self._listener is None:
            raise RuntimeError("metrics server not started")
        host, port = self._listener.getsockname()[:2]
        return host, port

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> None:
        # --metrics-addr may name an IPv6 address (the driver's own ports are IPv4).
        family = socket.getaddrinfo(self._bind, self._port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0][0]
        self._serve_on(listening(self._bind, self._port, MAX_CONNECTIONS, family=family))

    # ------------------------------------------------------------------ loop
    def _connect(self, sock: socket.socket, address: str, peer: str) -> _Scrape:
        conn = _Scrape(sock, address, peer, self._deadline_s)
        self._deadlines.append(conn)
        return conn

    def _timeout(self) -> float | None:
        return max(0.0, self._deadlines[0].deadline - time.monotonic()) if self._deadlines else None

    def _after_events(self) -> None:
        now = time.monotonic()
        while self._deadlines and (self._deadlines[0].deadline <= now or not self._deadlines[0].open):
            conn = self._deadlines.popleft()
            if conn.open:
                self._refusals.refused("past its deadline", conn.peer, f"closed {self._deadline_s:g} s after it "
                                       f"opened: {self.tier_words[conn.tier]}")
                self._drop(conn)

    def _flushed(self, conn: Connection) -> None:
        assert isinstance(conn, _Scrape)
        if conn.answered and not conn.outbox:
            self._drop(conn)

    def _failed(self, conn: Connection, exc: Exception) -> None:
        assert isinstance(conn, _Scrape)
        if conn.open and not conn.answered:
            self._answer(conn, 500, f"metrics: {type(exc).__name__}\n".encode(), "text/plain; charset=utf-8")
        else:
            self._drop(conn)

    # -------------------------------------------------------------- requests
    def _received(self, conn: Connection) -> None:
        assert isinstance(conn, _Scrape)
        if conn.answered:  # one request a connection: what follows it is not read into memory
            conn.inbox.clear()
            return
        end = conn.inbox.find(b"\r\n\r\n", 0, _MAX_HEAD + 4)
        if end < 0:
            if len(conn.inbox) >= _MAX_HEAD + 4:
                self._refuse(conn, 431, "request head too large", f"a request head over {_MAX_HEAD} bytes")
            return
        line = bytes(conn.inbox[:conn.inbox.find(b"\r\n")])
        headers = bytes(conn.inbox[:end]).split(b"\r\n")[1:]
        conn.inbox.clear()
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._refuse(conn, 400, "malformed request line", f"a malformed request line {line[:64]!r}")
            return
        method, target, _ = parts
        if method not in (b"GET", b"HEAD"):
            self._refuse(conn, 405, "method not allowed", f"method {method[:16]!r}")
            return
        if target.split(b"?", 1)[0] not in _PATHS:
            self._refuse(conn, 404, "unknown path", f"path {target[:64]!r}")
            return
        accept = next((v.strip() for k, _, v in (h.partition(b":") for h in headers) if k.strip().lower() == b"accept"),
                      b"")
        body, content_type = self._render(accept.decode("latin-1"))
        self._answer(conn, 200, body, content_type, head_only=method == b"HEAD")

    def _refuse(self, conn: _Scrape, status: int, kind: str, detail: str) -> None:
        self._refusals.refused(kind, conn.peer, detail)
        self._answer(conn, status, f"{_REASONS[status]}\n".encode(), "text/plain; charset=utf-8")

    def _answer(self, conn: _Scrape, status: int, body: bytes, content_type: str, *, head_only: bool = False) -> None:
        """The whole answer in one write, then the connection closes once it is read."""
        conn.answered = True
        self._promote(conn, _ANSWERED)
        head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        conn.outbox += head.encode("latin-1") + (b"" if head_only else body)
        self._flush(conn)
