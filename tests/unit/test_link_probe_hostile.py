"""A worker's link-probe port (worker/link/link_probe.py) against strangers, and behind a slow link, on loopback
sockets.

Before 23b042a the probe answered one connection at a time with 10 s for each read, so one connection that sent its
32-byte proof a byte every 8 s held the port for minutes, and every real measurement by a peer failed after 10 s:
the slow-link drain had no figures. 23b042a then gave the proof 1 s, round trip included, so a peer behind a link
with a round trip of 1 s or more failed every measurement instead of giving a low figure, and the drain could never
name its host (review rvG). Now strangers wait for their proof apart from the measurements, 10 s at most.
"""

from __future__ import annotations

import queue
import socket
import threading
import time

import pytest

from cloud_elastic.protocol import ProbeOrder
from cloud_elastic.worker.link.link_probe import CROWDED_PROOF_S, MAX_CONNECTIONS, MAX_UNPROVEN, PROOF_S, LinkProbe, \
    measure

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret"


@pytest.fixture
def probe():
    made = LinkProbe("127.0.0.1", SECRET)
    made.start()
    yield made
    made.close()


def _trickle(port: int, stop: threading.Event, dropped: list[float], every_s: float = 0.5) -> None:
    """A stranger: takes the nonce, then sends a byte every ``every_s`` (its 32 would take 16 s at 0.5 s, longer
    than any deadline) until the probe closes the connection: ``dropped`` gets how long it was held after its
    nonce. ``every_s`` 0: it sends nothing at all."""
    began = None
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.recv(16)
            began = time.monotonic()
            sock.settimeout(every_s or 30)
            while not stop.is_set():
                if every_s:
                    sock.sendall(b"x")
                try:
                    if sock.recv(1) == b"":
                        break  # closed by the probe
                except socket.timeout:
                    continue
            else:
                return
    except OSError:  # reset by the probe (or, unaccepted, when it closed)
        if began is None:
            return
    dropped.append(time.monotonic() - began)


def _strangers(port: int, count: int, every_s: float = 0.5):
    stop, dropped = threading.Event(), []
    threads = [threading.Thread(target=_trickle, args=(port, stop, dropped, every_s), daemon=True)
               for _ in range(count)]
    for thread in threads:
        thread.start()
    return stop, dropped, threads


def _stop(stop: threading.Event, threads: list[threading.Thread]) -> None:
    stop.set()
    for thread in threads:
        thread.join(10)


@pytest.mark.parametrize("count", [1, 2 * MAX_CONNECTIONS])
def test_strangers_trickling_their_proof_do_not_delay_a_peers_measurements(probe, count):
    """Before (23b042a): 8 strangers held the 4 places a second each, and a measurement waited 2 s behind them."""
    stop, _, threads = _strangers(probe.port, count)
    time.sleep(0.2)  # they hold their connections before the peer measures
    try:
        for _ in range(3):
            began = time.monotonic()
            assert measure(("127.0.0.1", probe.port), SECRET.encode()) > 0
            assert time.monotonic() - began < 1.5  # a measurement: a quarter of a second, and no wait
    finally:
        _stop(stop, threads)


def test_a_stranger_that_does_not_prove_the_secret_in_time_is_dropped_at_one_deadline_for_the_whole_proof(probe):
    """One sends a byte every 0.5 s (no read waits long, and 32 bytes would take 16 s), one sends nothing: both are
    closed when PROOF_S has passed since their nonce."""
    stop, dropped, threads = _strangers(probe.port, 1)
    idle_stop, idle_dropped, idle = _strangers(probe.port, 1, every_s=0)
    try:
        for thread in threads + idle:
            thread.join(PROOF_S + 5)  # each ends when the probe closes its connection
        assert len(dropped) == 1 and PROOF_S - 0.5 < dropped[0] < PROOF_S + 1.5, dropped
        assert len(idle_dropped) == 1 and PROOF_S - 0.5 < idle_dropped[0] < PROOF_S + 1.5, idle_dropped
    finally:
        _stop(stop, threads)
        _stop(idle_stop, idle)


def test_strangers_that_fill_every_place_for_a_proof_make_room_for_a_peer_within_a_second_or_so(probe):
    """MAX_UNPROVEN strangers wait for their proof and 8 more wait to be accepted: each newcomer closes the oldest
    that has waited CROWDED_PROOF_S. Before (23b042a): 72 strangers held the 4 places a second each, and the
    measurement waited behind them (4.5 s here) or failed."""
    stop, dropped, threads = _strangers(probe.port, MAX_UNPROVEN + 8)
    time.sleep(0.5)  # they hold their connections, and the backlog, before the peer measures
    try:
        began = time.monotonic()
        assert measure(("127.0.0.1", probe.port), SECRET.encode()) > 0
        assert time.monotonic() - began < CROWDED_PROOF_S + 1.5
        assert 8 <= len(dropped) < MAX_UNPROVEN, len(dropped)  # the oldest made room; the rest wait on
    finally:
        _stop(stop, threads)


class _DelayingProxy:
    """Forwards connections to ``target``, each byte ``one_way_s`` late in each direction: a link with a round
    trip of twice that, for every byte (the nonce and the proof too, not only the echoed chunks)."""

    def __init__(self, target: tuple[str, int], one_way_s: float) -> None:
        self._target, self._one_way_s = target, one_way_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                return
            self._sockets += [client, upstream]
            self._pump(client, upstream)
            self._pump(upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        late: queue.Queue = queue.Queue()

        def read() -> None:
            while True:
                try:
                    data = src.recv(1 << 16)
                except OSError:
                    data = b""
                late.put((time.monotonic() + self._one_way_s, data))
                if not data:
                    return

        def write() -> None:
            while True:
                due, data = late.get()
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()


def test_a_peer_behind_a_link_with_a_round_trip_over_a_second_is_reported_slow_not_dropped(probe):
    """The round trip is 1.2 s: the proof comes 1.2 s after the nonce went. Before (23b042a): every measurement
    failed (the proof was due within 1 s), the figure was dropped, and the slow-link drain could not name the
    host; before that, 0.03 MB/s."""
    far = _DelayingProxy(("127.0.0.1", probe.port), one_way_s=0.6)
    prober = LinkProbe("127.0.0.1", SECRET)
    prober.start()
    try:
        prober.order(ProbeOrder(1, (f"far@127.0.0.1:{far.port}",)))
        deadline = time.monotonic() + 30
        while prober.report().probed < 1:
            assert time.monotonic() < deadline, "the probe order was not carried out"
            time.sleep(0.05)
        [(peer, mb_s)] = prober.report().mb_s
        assert peer == "far" and 0 < mb_s < 0.1, mb_s  # 2 x 16 KiB in 1.2 s: 0.027 MB/s
    finally:
        prober.close()
        far.close()
