"""The "pods" of these tests (tests/kubernetes/pods.py) find another port when another process took theirs between
the look and sshd's bind (CI of stop 56: a port free on 127.0.0.1, bound later on 127.0.0.2 by a Gloo listener;
start-sshd.sh then exited 255 and the test failed before it began)."""

from __future__ import annotations

import os
import socket

import pytest

from . import pods as pods_module
from .pods import Pod, PortTaken, free_port, need_sshd, start_on_one_port

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(90)]

A, B = "127.0.98.1", "127.0.98.2"


def taken(address: str) -> socket.socket:
    """A listener on ``address`` at a port the kernel picks: another test's process holding it."""
    sock = socket.socket()
    sock.bind((address, 0))
    sock.listen()
    return sock


def test_a_port_taken_meanwhile_is_port_taken_and_a_pod_that_picked_its_own_moves_on(tmp_path):
    need_sshd()
    with taken(A) as holder:
        port = holder.getsockname()[1]
        given = Pod(tmp_path / "given", dict(os.environ), port=port, address=A)
        with pytest.raises(PortTaken, match=f"Bind to port {port} on {A} failed"):
            given.start()
        given.stop()
        picked = Pod(tmp_path / "picked", dict(os.environ), address=A)
        picked.use_port(port)  # as if it had been free when picked, and taken before sshd bound it
        try:
            picked.start()
            assert picked.port != port
            assert picked.run("true")[0] == 0
        finally:
            picked.stop()


def test_pods_sharing_a_port_move_on_together_when_one_of_their_addresses_has_it_taken(tmp_path, monkeypatch):
    need_sshd()
    with taken(B) as holder:
        port = holder.getsockname()[1]
        pods = [Pod(tmp_path / name, dict(os.environ), address=address) for name, address in (("p0", A), ("p1", B))]
        looks = iter([port])  # the first look misses the listener on B (it came after): a later one does not
        monkeypatch.setattr(pods_module, "free_port", lambda *addresses: next(looks, None) or free_port(*addresses))
        try:
            shared = start_on_one_port(pods)
            assert shared != port and {pod.port for pod in pods} == {shared}
            assert all(pod.run("true")[0] == 0 for pod in pods)
        finally:
            for pod in pods:
                pod.stop()


def test_free_port_is_free_on_every_address():
    with taken(B):
        for _ in range(20):
            port = free_port(A, B)
            for address in (A, B):
                with socket.socket() as sock:
                    sock.bind((address, port))  # OSError if it is in use there
