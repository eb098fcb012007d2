"""The worker's side of the control plane: signed requests to the driver."""

from __future__ import annotations

import http.client
import json
from typing import Any

from cloud_elastic.control import MAX_BODY, SIGNATURE_HEADER, Codec
from cloud_elastic.errors import ControlPlaneError

__all__ = ["DriverClient"]


class DriverClient:
    """Sends signed messages to the driver and verifies its signed replies.

    One instance per thread (it keeps one HTTP connection alive). Network
    trouble raises OSError; a reply that fails verification raises
    ControlPlaneError.
    """

    def __init__(self, address: str, codec: Codec, worker_id: str) -> None:
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._codec = codec
        self._worker_id = worker_id
        self._conn: http.client.HTTPConnection | None = None

    def call(self, kind: str, payload: dict[str, Any] | None = None, *, timeout_s: float = 30.0) -> dict[str, Any]:
        body, signature = self._codec.encode(kind, dict(payload or {}, worker=self._worker_id))
        nonce = json.loads(body)["nonce"]
        for attempt in (1, 2):  # one retry for a keep-alive connection the server closed
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            self._conn.timeout = timeout_s
            try:
                self._conn.request(
                    "POST", f"/v1/{kind}", body,
                    {"Content-Type": "application/json", SIGNATURE_HEADER: signature},
                )
                resp = self._conn.getresponse()
                data = _bounded_body(resp, kind)
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
                body, signature = self._codec.encode(kind, dict(payload or {}, worker=self._worker_id))
                nonce = json.loads(body)["nonce"]
            except (OSError, ControlPlaneError):  # a reply too long leaves the connection unread: not reused
                self.close()
                raise
        if resp.status != 200:
            raise ControlPlaneError(f"driver refused {kind}: HTTP {resp.status} {data[:200].decode(errors='replace')}")
        reply = self._codec.decode(data, resp.getheader(SIGNATURE_HEADER))
        if reply.get("kind") != kind or reply.get("re") != nonce or reply.get("to") != self._worker_id:
            raise ControlPlaneError(f"the driver's {kind} reply does not answer this request")
        return reply

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _bounded_body(resp: http.client.HTTPResponse, kind: str) -> bytes:
    """The reply's body, read no further than :data:`~cloud_elastic.control.MAX_BODY` bytes: whoever answers at the
    driver's address (a port taken over after the driver died) cannot make the worker read without end."""
    length = resp.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > MAX_BODY:
        raise ControlPlaneError(f"the {kind} reply of {int(length)} bytes exceeds the {MAX_BODY}-byte limit")
    data = resp.read(MAX_BODY + 1)
    if len(data) > MAX_BODY:
        raise ControlPlaneError(f"the {kind} reply exceeds the {MAX_BODY}-byte limit")
    return data
