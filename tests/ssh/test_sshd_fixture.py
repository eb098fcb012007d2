"""The test sshd listens on every address it names, or moves to another port.

CI of stop 56: another test's process held the session sshd's port on 127.0.0.2 only. sshd still started and served
127.0.0.1 and 127.0.0.3, so every later test of that worker saw "connection refused" from the host 127.0.0.2.
"""

from __future__ import annotations

import socket

import pytest

from conftest import PortTaken, free_port, start_sshd, start_sshd_on_free_port, stop_sshd

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(60)]

HOSTS = ("127.0.0.1", "127.0.0.8")


def _greets(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=5) as sock:
        return sock.recv(64).startswith(b"SSH-")


def test_a_port_taken_on_one_address_is_refused_and_another_port_is_used(sshd):
    port = free_port(*HOSTS)
    with socket.socket() as taken:  # as a Gloo pair's listener at an ephemeral port
        taken.bind((HOSTS[1], port))
        taken.listen()
        with pytest.raises(PortTaken, match=f"Bind to port {port} on {HOSTS[1]}"):
            start_sshd(sshd.root, port, sshd.root / "host_ed25519", HOSTS, name=f"taken-{port}")
        proc, moved = start_sshd_on_free_port(sshd.root, sshd.root / "host_ed25519", HOSTS, name="moved")
    try:
        assert moved != port
        assert all(_greets(host, moved) for host in HOSTS)
    finally:
        stop_sshd(proc)
