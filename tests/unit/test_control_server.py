"""The control-plane server and client over a real loopback HTTP connection."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cloud_elastic.control import SIGNATURE_HEADER, Codec, new_secret
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.worker.link.client import DriverClient

pytestmark = pytest.mark.timeout(20)

SECRET = new_secret()


@pytest.fixture
def server():
    seen = []

    def handler(kind, message):
        seen.append((kind, message["worker"]))
        return {"ok": True}

    srv = ControlServer(Codec(SECRET, "job"), handler)
    srv.start()
    yield srv, seen
    srv.close()


def test_a_signed_request_gets_a_reply_bound_to_it(server):
    srv, seen = server
    client = DriverClient(f"127.0.0.1:{srv.port}", Codec(SECRET, "job"), "w1")
    reply = client.call("register")
    assert reply["ok"] is True and reply["to"] == "w1"
    assert seen == [("register", "w1")]


def test_a_client_with_another_secret_is_refused_and_nothing_reaches_the_driver(server):
    srv, seen = server
    client = DriverClient(f"127.0.0.1:{srv.port}", Codec(new_secret(), "job"), "w1")
    with pytest.raises(ControlPlaneError, match="HTTP 401"):
        client.call("completed")
    assert seen == [] and srv.rejected == 1


def test_a_non_ascii_signature_header_is_rejected_not_crashed(server):
    srv, seen = server
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/poll HTTP/1.1\r\nContent-Length: 2\r\n" + SIGNATURE_HEADER.encode()
                  + b": \xff\xfe\r\n\r\n{}")
        assert s.recv(100).startswith(b"HTTP/1.1 401")
    assert seen == []


def test_a_reply_recorded_for_another_worker_is_rejected_by_the_client():
    # A fake "driver" that answers every request with a genuine reply it captured
    # for someone else (validly signed, but not an answer to this request).
    codec = Codec(SECRET, "job")
    captured, signature = codec.encode("rendezvous", {"status": "exit", "reason": "x", "re": "other", "to": "w9"})

    class Replay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(captured)))
            self.send_header(SIGNATURE_HEADER, signature)
            self.end_headers()
            self.wfile.write(captured)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = DriverClient(f"127.0.0.1:{httpd.server_address[1]}", Codec(SECRET, "job"), "w1")
        with pytest.raises(ControlPlaneError, match="does not answer this request"):
            client.call("rendezvous", {"last_round": 0, "reason": "start"})
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert json.loads(captured)["to"] == "w9"


def test_a_driver_bug_in_a_handler_is_logged_once_at_error_and_reported_to_the_worker(caplog):
    def handler(kind, message):
        raise KeyError("round")

    srv = ControlServer(Codec(SECRET, "job"), handler)
    srv.start()
    try:
        client = DriverClient(f"127.0.0.1:{srv.port}", Codec(SECRET, "job"), "w1")
        for _ in range(2):
            with pytest.raises(ControlPlaneError, match="HTTP 500.*driver error handling poll: KeyError"):
                client.call("poll")
    finally:
        srv.close()
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info is not None


_SERVE = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from cloud_elastic.control import Codec
from cloud_elastic.driver.net.control_server import ControlServer
srv = ControlServer(Codec(sys.argv[1], "job"), lambda kind, message: {"ok": True})
srv.start()
print(srv.port, flush=True)
sys.stdin.read()
"""


def test_out_of_descriptors_the_control_plane_waits_says_so_once_and_answers_once_they_are_free():
    """As the rendezvous store does (test_store_server.py): connections it cannot accept wait, the listener
    is paused rather than retried at once, one warning, and a worker's call is answered once descriptors
    are free again."""
    import time

    from tests.unit.test_store_server import logged_soon, short_of_descriptors

    proc, port, logged = short_of_descriptors(_SERVE, SECRET)
    try:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]  # more than it can accept
        assert logged_soon(logged, "control plane: cannot accept connections"), logged
        time.sleep(1.0)  # four pauses' worth: a loop retrying at once would have said so again by now
        shortage = [line for line in logged if "cannot accept connections" in line]
        assert len(shortage) == 1 and "Too many open files" in shortage[0], logged
        for s in held:
            s.close()
        reply = DriverClient(f"127.0.0.1:{port}", Codec(SECRET, "job"), "w1").call("register")
        assert reply["ok"] is True
        assert logged_soon(logged, "control plane: accepting connections again"), logged
    finally:
        proc.stdin.close()
        proc.wait(10)
