"""The driver's endpoints (cloud_elastic.driver.net.endpoints): both servers and the codec, one lifecycle."""

from __future__ import annotations

import socket

import pytest

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.net.endpoints import Endpoints
from cloud_elastic.worker.link.client import DriverClient

pytestmark = pytest.mark.timeout(30)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_signed_request_is_answered_and_close_stops_both_servers_once() -> None:
    seen: list[str] = []
    endpoints = Endpoints("j1", lambda kind, msg: seen.append(kind) or {"ok": True})
    assert not endpoints.started
    secret = new_secret()
    endpoints.start("127.0.0.1", advertised="10.0.0.5", secret=secret)
    try:
        assert endpoints.started and endpoints.advertised == "10.0.0.5" and endpoints.secret == secret
        client = DriverClient(f"127.0.0.1:{endpoints.control_port}", Codec(secret, "j1"), "w1")
        assert client.call("register")["ok"] is True and seen == ["register"]
        client.close()
        with socket.create_connection(("127.0.0.1", endpoints.store_port), timeout=2):
            pass  # the rendezvous store accepts
    finally:
        control, store = endpoints.control_port, endpoints.store_port
        endpoints.close()
        endpoints.close()  # idempotent
    assert _refused(control) and _refused(store)
    assert not endpoints.started


def test_a_taken_control_port_leaves_nothing_listening() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with socket.socket() as probe:  # a free port for the store, to see it closed again
            probe.bind(("127.0.0.1", 0))
            store_port = probe.getsockname()[1]
        endpoints = Endpoints("j1", lambda kind, msg: {"ok": True})
        with pytest.raises(OSError):
            endpoints.start("127.0.0.1", advertised="127.0.0.1", control_port=port, store_port=store_port)
    assert not endpoints.started and _refused(store_port)
    assert len(endpoints.secret) >= 32  # a fresh secret when none is given
