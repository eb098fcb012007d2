"""The control-plane HTTP server the driver runs for its workers.

Workers POST signed JSON (see :mod:`cloud_elastic.control`) to ``/v1/<kind>``;
the server verifies each request and hands it to a handler function, whose
result is sent back signed. Requests that fail verification are answered
with a 4xx status, logged once per peer and reason, and never reach the
handler: a forged, malformed or oversized message cannot change the job.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from cloud_elastic.control import MAX_BODY, SIGNATURE_HEADER, Codec
from cloud_elastic.errors import ControlPlaneError

__all__ = ["ControlServer", "Handler"]

log = logging.getLogger(__name__)

#: ``handler(kind, message) -> reply``; raise ControlPlaneError for a bad request.
Handler = Callable[[str, dict[str, Any]], dict[str, Any]]


class ControlServer:
    """Threaded HTTP server; ``start()`` binds and serves, ``close()`` stops."""

    def __init__(self, codec: Codec, handler: Handler, *, bind: str = "127.0.0.1", port: int = 0) -> None:
        self._codec = codec
        self._handler = handler
        self._bind = bind
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._warned: set[tuple[str, str]] = set()
        self._errors: set[tuple[str, str, str]] = set()
        self.rejected = 0

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return self._httpd.server_address[1]

    def start(self) -> None:
        server = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # A peer that connects and never sends its body must not hold a thread forever.
            timeout = 60

            def setup(self) -> None:
                super().setup()
                # A reply is one write, so Nagle's algorithm could only delay it.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("control plane: " + fmt, *args)

            def handle_one_request(self) -> None:
                server._handle_one(self)

        class _Server(ThreadingHTTPServer):
            # Every worker keeps connections open (a heartbeat and a rendezvous one); a large
            # group connects all at once at start-up.
            request_queue_size = 1024

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A worker killed mid-request resets its connection; that is not news.
                log.debug("control plane: connection from %s ended abruptly", client_address, exc_info=True)

        self._httpd = _Server((self._bind, self._port), _Request)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="control-plane", daemon=True)
        self._thread.start()
        log.debug("control plane listening on %s:%d", self._bind, self.port)

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def _handle_one(self, req: BaseHTTPRequestHandler) -> None:
        """Read one request from a kept-alive connection and answer it.

        A lean HTTP/1.1 reader in place of ``http.server``'s (whose header parser
        is the email package, most of a heartbeat's cost): the request line,
        at most :data:`_MAX_HEADERS` header lines of at most :data:`_MAX_LINE`
        bytes, then exactly ``Content-Length`` bytes of body. Anything else is
        refused with a 4xx/5xx status and the connection closed.
        """
        try:
            line = req.rfile.readline(_MAX_LINE + 1)
        except (TimeoutError, ConnectionError):
            req.close_connection = True
            return
        if not line:
            req.close_connection = True
            return
        if len(line) > _MAX_LINE:
            self._reject(req, 414, "request line too long")
            return
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._reject(req, 400, f"malformed request line {line[:64]!r}")
            return
        method, target, version = parts
        headers: dict[bytes, bytes] = {}
        for _ in range(_MAX_HEADERS + 1):
            raw = req.rfile.readline(_MAX_LINE + 1)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = raw.partition(b":")
            if len(raw) > _MAX_LINE or not sep:
                self._reject(req, 400, "malformed header line")
                return
            headers[name.strip().lower()] = value.strip()
        else:
            self._reject(req, 431, f"more than {_MAX_HEADERS} header lines")
            return
        connection = headers.get(b"connection", b"").lower()
        req.close_connection = connection == b"close" or (version == b"HTTP/1.0" and connection != b"keep-alive")
        if method != b"POST":
            self._reject(req, 405, f"method {method[:16].decode('latin-1')!r} not allowed")
            return
        self._serve(req, target.decode("latin-1"), headers)

    def _respond(self, req: BaseHTTPRequestHandler, status: int, body: bytes, *, signature: str | None = None,
                 close: bool = False) -> None:
        """The whole reply in one write (status line, headers, body)."""
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", "Content-Type: application/json",
                f"Content-Length: {len(body)}"]
        if signature is not None:
            head.append(f"{SIGNATURE_HEADER}: {signature}")
        if close:
            head.append("Connection: close")
            req.close_connection = True
        try:
            req.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        except OSError:  # the worker went away; its next request (if any) comes on a new connection
            req.close_connection = True

    def _reject(self, req: BaseHTTPRequestHandler, status: int, reason: str, *, warn: bool = True) -> None:
        self.rejected += 1
        peer = req.client_address[0]
        key = (peer, reason.split(":")[0])
        if warn and key not in self._warned:
            self._warned.add(key)
            log.warning("control plane: rejected a request from %s: %s", peer, reason)
        self._respond(req, status, json.dumps({"error": reason}).encode(), close=True)

    def _serve(self, req: BaseHTTPRequestHandler, path: str, headers: dict[bytes, bytes]) -> None:
        kind = path.rsplit("/", 1)[-1]
        if not path.startswith("/v1/"):
            self._reject(req, 404, f"unknown path {path[:64]!r}")
            return
        try:
            length = int(headers.get(b"content-length", b""))
        except ValueError:
            self._reject(req, 411, "missing Content-Length")
            return
        if length < 0 or length > MAX_BODY:
            self._reject(req, 413, f"body of {length} bytes exceeds the {MAX_BODY}-byte limit")
            return
        body = req.rfile.read(length)
        if len(body) < length:
            req.close_connection = True  # the peer hung up mid-body
            return
        signature = headers.get(_SIGNATURE_KEY)
        try:
            message = self._codec.decode(body, None if signature is None else signature.decode("latin-1"))
            if message["kind"] != kind:
                raise ControlPlaneError(f"message kind {message['kind']!r} does not match path {kind!r}")
            # A reply names the request it answers, so it cannot be replayed to
            # another worker or for another request.
            reply = dict(self._handler(kind, message), re=message["nonce"], to=message.get("worker"))
        except ControlPlaneError as exc:
            self._reject(req, 401 if "signature" in str(exc) else 400, str(exc))
            return
        except Exception as exc:  # a driver bug: say so loudly once, and tell the worker instead of hanging up
            key = (kind, type(exc).__name__, str(exc))
            if key not in self._errors:
                self._errors.add(key)
                log.error("control plane: the driver failed handling %r (a bug; please report it)", kind, exc_info=True)
            self._reject(req, 500, f"driver error handling {kind}: {type(exc).__name__}: {exc}", warn=False)
            return
        out, signature_out = self._codec.encode(kind, reply)
        self._respond(req, 200, out, signature=signature_out)


#: Limits of the request reader (http.server's own).
_MAX_LINE = 65536
_MAX_HEADERS = 100
_SIGNATURE_KEY = SIGNATURE_HEADER.lower().encode()
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Payload Too Large", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}
