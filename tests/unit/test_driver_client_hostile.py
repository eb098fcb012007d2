"""A worker's control-plane client reads no more of a reply than a message may hold (``control.MAX_BODY``).

Whoever answers at the driver's address (a port taken over after the driver died, say) could stream a body
without end: the worker read it all (1.4 GB in about a second, then MemoryError).
"""

from __future__ import annotations

import socket
import threading

import pytest

from cloud_elastic.control import MAX_BODY, Codec
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.worker.link.client import DriverClient

pytestmark = pytest.mark.timeout(30)


def _answer(head: bytes, chunks: bool) -> tuple[socket.socket, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(head)
            try:
                for _ in range(200):  # 200 MiB at most, far past the bound, should the client read on
                    conn.sendall(b"100000\r\n" + b"x" * (1 << 20) + b"\r\n" if chunks else b"x" * (1 << 20))
            except OSError:
                pass  # the client closed: what it should do

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: 209715200\r\n\r\n"])
def test_a_reply_longer_than_a_message_may_be_is_refused_in_one_line_without_reading_it(head: bytes) -> None:
    server, thread = _answer(head, chunks=b"chunked" in head)
    client = DriverClient(f"127.0.0.1:{server.getsockname()[1]}", Codec("k" * 64, "job"), "w1")
    with pytest.raises(ControlPlaneError, match=f"^the heartbeat reply .*exceeds the {MAX_BODY}-byte limit$"):
        client.call("heartbeat", {}, timeout_s=10)
    client.close()
    thread.join(20)
    server.close()


def test_a_refusal_naming_a_driver_start_that_the_driver_did_not_sign_moves_no_clock() -> None:
    """Review of ee919d7: whoever answered the worker's connection could name any start time in an unsigned
    refusal; the worker then signed 300 s ahead of its clock (refused by the real driver as too far off) and
    resent in a tight loop (1,551 requests in one call)."""
    import json
    import time

    from cloud_elastic.control import SIGNED_BEFORE_START

    server, requests = socket.create_server(("127.0.0.1", 0)), []
    body = json.dumps({"error": f"{SIGNED_BEFORE_START} at 1e12"}).encode()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                requests.append(1)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (len(body), body))

    threading.Thread(target=serve, daemon=True).start()
    codec = Codec("s" * 32, "j1")
    client = DriverClient(f"127.0.0.1:{server.getsockname()[1]}", codec, "w1")
    with pytest.raises(ControlPlaneError, match="driver refused completed: HTTP 400"):
        client.call("completed", timeout_s=1.0)
    server.close()
    assert len(requests) <= 10, len(requests)  # every 0.2 s, not as fast as the forger answers
    assert abs(json.loads(codec.encode("poll", {})[0])["ts"] - time.time()) < 5  # signs at its own clock


def test_a_reply_that_is_not_http_leaves_the_client_usable_for_the_real_driver() -> None:
    """Review h2 (2026-12-01): an answer that is not HTTP (an impostor at the port, an ssh banner) raised
    BadStatusLine, not an OSError, so the connection stayed mid-request: every later call failed unsent
    (CannotSendRequest), the heartbeats with them, even once the real driver served the port again."""
    import time

    from cloud_elastic.control import new_secret
    from cloud_elastic.driver.net.control_server import ControlServer

    impostor = socket.create_server(("127.0.0.1", 0))
    port = impostor.getsockname()[1]

    def serve() -> None:
        conn, _ = impostor.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
            time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    secret = new_secret()
    client = DriverClient(f"127.0.0.1:{port}", Codec(secret, "job"), "w1")
    with pytest.raises(ConnectionError, match=f"^the poll reply from 127.0.0.1:{port} is not HTTP: BadStatusLine"):
        client.call("poll", {}, timeout_s=3)
    thread.join(5)
    impostor.close()
    real = ControlServer(Codec(secret, "job"), lambda kind, message: {"ok": True}, port=port)
    real.start()
    try:
        assert client.call("poll", {}, timeout_s=5)["ok"] is True  # the same client: the one the heartbeats use
    finally:
        real.close()


def test_a_reply_trickled_a_byte_a_second_ends_the_call_within_its_time() -> None:
    """Review h2 (2026-12-01): the call's time bounded each read, not the call; a reply trickled a byte a second
    held it without end, and the heartbeat thread, which counts the driver's silence after a call returns, with it
    (so --driver-grace never came)."""
    import time

    server, stop = socket.create_server(("127.0.0.1", 0)), threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000:
                if stop.wait(0.3):
                    return
                try:
                    conn.send(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    client = DriverClient(f"127.0.0.1:{server.getsockname()[1]}", Codec("k" * 64, "job"), "w1")
    began = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            client.call("poll", {}, timeout_s=1.5)
        assert time.monotonic() - began < 6, "bounded by the call's time, not by each read's"
    finally:
        stop.set()
        client.close()
        server.close()
