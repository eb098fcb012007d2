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

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("control plane: " + fmt, *args)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                server._serve(self)

        class _Server(ThreadingHTTPServer):
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

    def _reject(self, req: BaseHTTPRequestHandler, status: int, reason: str, *, warn: bool = True) -> None:
        self.rejected += 1
        peer = req.client_address[0]
        key = (peer, reason.split(":")[0])
        if warn and key not in self._warned:
            self._warned.add(key)
            log.warning("control plane: rejected a request from %s: %s", peer, reason)
        body = json.dumps({"error": reason}).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.send_header("Connection", "close")
        req.end_headers()
        req.wfile.write(body)

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        kind = req.path.rsplit("/", 1)[-1]
        if not req.path.startswith("/v1/"):
            self._reject(req, 404, f"unknown path {req.path[:64]!r}")
            return
        try:
            length = int(req.headers.get("Content-Length", ""))
        except ValueError:
            self._reject(req, 411, "missing Content-Length")
            return
        if length < 0 or length > MAX_BODY:
            self._reject(req, 413, f"body of {length} bytes exceeds the {MAX_BODY}-byte limit")
            return
        body = req.rfile.read(length)
        try:
            message = self._codec.decode(body, req.headers.get(SIGNATURE_HEADER))
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
        out, signature = self._codec.encode(kind, reply)
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(out)))
        req.send_header(SIGNATURE_HEADER, signature)
        req.end_headers()
        req.wfile.write(out)
