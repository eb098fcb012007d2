"""Many workers on one host: sshd drops unauthenticated connections past its MaxStartups, and the launcher
neither provokes that nor takes a dropped set-up for a lost host.

An sshd of its own on 127.0.0.7 with ``MaxStartups 3:100:3``: a fourth connection that has not
authenticated yet is dropped before key exchange. The retry is tested through a stand-in in front of
that sshd that refuses the first connection as sshd does (``_DropsFirst``): connections held open to fill
sshd were not always counted before ssh connected, so the drop came one run in a few.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from typing import Iterator

import pytest

from cloud_elastic.config import SSHConfig
from cloud_elastic.driver.launch.ssh import SSHLauncher
from conftest import start_sshd_on_free_port, stop_sshd
from ssh_support import start, wait_exit, wait_until

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(60)]

CROWDED = "127.0.0.7"
MAX_STARTUPS = 3


@pytest.fixture
def crowded(sshd, tmp_path) -> Iterator[tuple[SSHConfig, int]]:
    """The session's keys behind an sshd that admits 3 connections in set-up at once; (config, port)."""
    proc, port = start_sshd_on_free_port(sshd.root, sshd.root / "host_ed25519", (CROWDED,), name="crowded",
                                         max_startups=f"{MAX_STARTUPS}:100:{MAX_STARTUPS}")
    known_hosts = tmp_path / "known_hosts"
    host_key = (sshd.root / "host_ed25519.pub").read_text().split()[:2]
    known_hosts.write_text(f"[{CROWDED}]:{port} {' '.join(host_key)}\n")
    try:
        yield dataclasses.replace(sshd.with_known_hosts(str(known_hosts)), port=port), port
    finally:
        stop_sshd(proc)


def test_launches_beyond_the_hosts_set_up_limit_wait_their_turn(crowded, marker):
    config, _ = crowded
    with SSHLauncher(config, max_setups_per_host=MAX_STARTUPS) as launcher:
        started = [start(launcher, CROWDED, f"{marker}-{i}", "exit", "0") for i in range(8)]
        statuses = [wait_exit(proc, 40) for proc, _ in started]
    assert [(s.code, s.transport_error) for s in statuses] == [(0, None)] * 8


class _DropsFirst:
    """sshd as seen through its MaxStartups: the first ``drops`` connections get its refusal ("Exceeded
    MaxStartups", then closed, before any key exchange); the others are passed to the real sshd on
    ``port``. Deterministic: holding raw connections open did not always fill sshd before ssh connected."""

    def __init__(self, port: int, drops: int = 1) -> None:
        self._port, self.drops = port, drops
        self._server = socket.create_server((CROWDED, 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if self.drops > 0:
                self.drops -= 1
                conn.sendall(b"Exceeded MaxStartups\r\n")
                conn.close()
                continue
            upstream = socket.create_connection((CROWDED, self._port), timeout=5)
            upstream.settimeout(None)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


def test_a_connection_dropped_before_key_exchange_is_tried_again(sshd, crowded, marker, caplog, tmp_path):
    _, port = crowded
    proxy = _DropsFirst(port)
    host_key = (tmp_path / "known_hosts").read_text().split()[1:]
    known_hosts = tmp_path / "known_hosts_proxy"
    known_hosts.write_text(f"[{CROWDED}]:{proxy.port} {' '.join(host_key)}\n")
    config = dataclasses.replace(sshd.with_known_hosts(str(known_hosts)), port=proxy.port)
    try:
        with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver.launch.ssh"), SSHLauncher(config) as launcher:
            proc, out = start(launcher, CROWDED, marker, "exit", "0")
            status = wait_exit(proc, 30)
    finally:
        proxy.close()
    assert "dropped before key exchange" in caplog.text and proxy.drops == 0
    assert (status.code, status.transport_error) == (0, None), out.lines
