"""Scaffolding shared by the local fake cloud servers: a threaded HTTP server
on 127.0.0.1 (port 0) with a route table, a request log and fault injection.

A cloud fake subclasses :class:`FakeCloud`, registers routes with
:meth:`FakeCloud.route` and keeps its own state. Tests script faults
("the next 2 requests to .../memberships answer 503") with :meth:`FakeCloud.fail`
and read how many requests each call made with :meth:`FakeCloud.count`.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

__all__ = ["Request", "Reply", "FakeCloud", "page_of", "CutStream", "SERVE_POLL_S"]

#: How often a fake's serving loop looks at its stop flag (``serve_forever``'s ``poll_interval``): ``stop()`` waits
#: for that look, so the default 0.5 s was paid by every test that stopped a fake.
SERVE_POLL_S = 0.05


class CutStream(Exception):
    """Raised by a :attr:`Reply.stream` to drop the connection mid-response (no final chunk)."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    params: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body or b"{}")

    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode()).items()}


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    #: A streamed body (a long-lived watch): each item is sent as one HTTP chunk as it comes.
    #: The iterator raising :class:`CutStream` drops the connection without the final chunk.
    stream: Any = None
    #: With ``framed``, the stream's items are written as they are, after the status line and ``headers`` alone,
    #: and the connection closes at its end: the test frames the body itself (a chunk that says it is larger than
    #: what follows, a body with no chunked encoding that ends when the connection closes).
    framed: bool = False


@dataclass
class _Fault:
    pattern: re.Pattern
    remaining: int
    reply: Reply


Handler = Callable[[Request], Reply]


class FakeCloud:
    """A fake REST service. Use as a context manager or call start()/stop()."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern, Handler]] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self.log: list[tuple[str, str]] = []  # (method, what) of every request, faults included
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- configuration -------------------------------------------------------------

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        """Serve ``method`` requests whose path fully matches ``pattern`` (named groups become params)."""
        self._routes.append((method, re.compile(pattern), handler))

    def fail(self, pattern: str, times: int, status: int, body: Any = None, headers: dict | None = None) -> None:
        """Answer the next ``times`` requests whose :meth:`describe` matches ``pattern`` (search) with ``status``.

        ``body`` is JSON, or ``bytes`` sent as they are.
        """
        raw = body if isinstance(body, bytes) else None
        reply = Reply(status, None if raw is not None else body, headers or {}, raw)
        with self._lock:
            self._faults.append(_Fault(re.compile(pattern), times, reply))

    def describe(self, request: Request) -> str:
        """What the log records and faults match for a request: its path (override for RPC-style APIs)."""
        return request.path

    def authorize(self, request: Request) -> Reply | None:
        """Override: return a Reply to refuse the request (401/403), or None to let it through."""
        return None

    def reset(self) -> None:
        """Forget the request log and pending faults (state stays)."""
        with self._lock:
            self._faults.clear()
            self.log.clear()

    def count(self, pattern: str = "", method: str | None = None) -> int:
        """How many requests (faults included) had a :meth:`describe` matching ``pattern`` (search)."""
        rx = re.compile(pattern)
        with self._lock:
            return sum(1 for m, p in self.log if rx.search(p) and (method is None or m == method))

    # -- lifecycle -----------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("server not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeCloud":
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                split = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
                request = Request(self.command, split.path, query, {k.lower(): v for k, v in self.headers.items()}, body)
                reply = fake._dispatch(request)
                if reply.stream is not None:
                    self._stream(reply)
                    return
                payload = reply.raw if reply.raw is not None else (
                    b"" if reply.body is None else json.dumps(reply.body).encode()
                )
                self.send_response(reply.status)
                default_type = "application/json" if reply.raw is None else "text/xml"
                headers = {"Content-Type": default_type, **reply.headers}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _stream(self, reply: Reply) -> None:
                self.send_response(reply.status)
                framing = {} if reply.framed else {"Transfer-Encoding": "chunked"}
                for key, value in {"Content-Type": "application/json", **reply.headers, **framing}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.close_connection = self.close_connection or reply.framed
                try:
                    for chunk in reply.stream:
                        if chunk:
                            self.wfile.write(chunk if reply.framed else b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    if not reply.framed:
                        self.wfile.write(b"0\r\n\r\n")
                except CutStream:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(2)
                    except OSError:
                        pass

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        class _Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client gone mid-request (a driver that exited during a long poll) is not news.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(SERVE_POLL_S,), name=type(self).__name__,
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeCloud":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- dispatch ------------------------------------------------------------------

    def _dispatch(self, request: Request) -> Reply:
        what = self.describe(request)
        with self._lock:
            self.log.append((request.method, what))
            for fault in self._faults:
                if fault.remaining > 0 and fault.pattern.search(what):
                    fault.remaining -= 1
                    return fault.reply
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(request.path)
            if method == request.method and match:
                refused = self.authorize(request)
                if refused is not None:
                    return refused
                request.params = match.groupdict()
                try:
                    return handler(request)
                except KeyError as exc:
                    return self.not_found(f"{exc.args[0]} was not found")
        return self.not_found(f"no route for {request.method} {request.path}")

    def not_found(self, message: str) -> Reply:
        """Override to speak the cloud's 404 shape."""
        return Reply(404, {"error": message})


def page_of(items: list, token: str | None, size: int) -> tuple[list, str | None]:
    """One page of ``items`` from an integer-offset ``token``, and the next token (None at the end)."""
    start = int(token or 0)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else None)
