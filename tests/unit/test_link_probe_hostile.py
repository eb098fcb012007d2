"""A worker's link-probe port (worker/link/link_probe.py) against strangers, on loopback sockets.

Before: the probe answered one connection at a time with 10 s for each read, so one connection that sent its
32-byte proof a byte every 8 s held the port for minutes, and every real measurement by a peer failed after
10 s: the slow-link drain had no figures.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cloud_elastic.worker.link.link_probe import MAX_CONNECTIONS, PROOF_S, LinkProbe, measure

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret"


@pytest.fixture
def probe():
    made = LinkProbe("127.0.0.1", SECRET)
    made.start()
    yield made
    made.close()


def _trickle(port: int, stop: threading.Event, dropped: list[float]) -> None:
    """A stranger: takes the nonce, then sends a byte every 0.5 s (under the old 10 s a read) until dropped."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.recv(16)
        began = time.monotonic()
        try:
            while not stop.is_set():
                sock.sendall(b"x")
                if stop.wait(0.5):
                    return
            return
        except OSError:  # the probe closed it: a send then fails (a reset)
            dropped.append(time.monotonic() - began)


def _strangers(port: int, count: int) -> tuple[threading.Event, list[float], list[threading.Thread]]:
    stop, dropped = threading.Event(), []
    threads = [threading.Thread(target=_trickle, args=(port, stop, dropped), daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # they hold their connections before the peer measures
    return stop, dropped, threads


@pytest.mark.parametrize("count", [1, 2 * MAX_CONNECTIONS])
def test_strangers_trickling_their_proof_do_not_make_a_peers_measurements_fail(probe, count):
    stop, dropped, threads = _strangers(probe.port, count)
    try:
        for _ in range(3):
            began = time.monotonic()
            assert measure(("127.0.0.1", probe.port), SECRET.encode()) > 0
            # Each waits at most for strangers that are cut off after PROOF_S.
            assert time.monotonic() - began < 3 * PROOF_S + 1.0
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def test_a_stranger_that_does_not_prove_the_secret_in_time_is_dropped(probe):
    stop, dropped, threads = _strangers(probe.port, 1)
    threads[0].join(10)  # it ends when the probe closes its connection
    stop.set()
    assert len(dropped) == 1 and PROOF_S - 0.3 < dropped[0] < PROOF_S + 2.0, dropped
    with socket.create_connection(("127.0.0.1", probe.port), timeout=10) as idle:  # one that sends nothing at all
        idle.settimeout(10)
        assert len(idle.recv(16)) == 16
        began = time.monotonic()
        assert idle.recv(1) == b""  # closed by the probe
        assert time.monotonic() - began < PROOF_S + 2.0
