"""``Reaper.release(..., cut_at_exit=True)`` and ``Reaper.drain`` (review s60 rvR).

A plan's group whose check failed is released, never retired: its connections cannot be told from those of a round
formed meanwhile, and shut down they failed that round. Its destructor waits for the check's collective, which
waits on a silent peer until Gloo's timeout. So its connections stay open while the process trains, and are shut
down only by ``drain`` at exit (every round is let go of then); ``drain`` waits for destructors only until its
deadline. Stand-ins here: a group whose destructor joins a thread blocked reading one of its connections, as Gloo's
joins its worker thread blocked in a collective."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cloud_elastic.worker.rounds.reclaim import GroupSockets, Reaper, socket_inodes

pytestmark = pytest.mark.timeout(30)


class _WaitingGroup:
    """A group whose pending collective reads from a peer that never answers; its destructor waits for it."""

    backend = "gloo"

    def __init__(self, conn: socket.socket, sockets: GroupSockets, ended: threading.Event) -> None:
        self.sockets = sockets
        self._reader = threading.Thread(target=self._read, args=(conn, ended), daemon=True)
        self._reader.start()

    @staticmethod
    def _read(conn: socket.socket, ended: threading.Event) -> None:
        try:
            while conn.recv(1024):
                pass
        except OSError:
            pass
        ended.set()

    def __del__(self) -> None:
        self._reader.join(20)  # Gloo's destructor joins its worker thread, here until the read ends


@pytest.fixture
def pair():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        before = socket_inodes()
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        sockets = GroupSockets(before, socket_inodes(), ())
        try:
            yield client, server, sockets
        finally:
            client.close()
            server.close()


def test_a_failed_plans_group_keeps_its_connections_open_until_the_exit_then_drain_cuts_them(pair) -> None:
    client, server, sockets = pair
    assert len(sockets) == 2  # both ends are this process's here
    reaper, ended = Reaper(), threading.Event()
    reaper.release(_WaitingGroup(server, sockets, ended), after_s=0.1, cut_at_exit=True)
    time.sleep(0.5)  # the timer fired: its destructor waits for the read
    client.sendall(b"still open")  # the connections it counts are left alone while the process trains
    assert reaper.busy() and not ended.is_set()
    started = time.monotonic()
    assert reaper.drain(5.0)
    assert ended.is_set() and not reaper.busy()
    assert time.monotonic() - started < 2.0


def test_drain_waits_for_a_pending_release_only_until_its_deadline() -> None:
    """A destructor that does not return (no connection known to cut) leaves drain at its deadline, still seen as
    running (the exit hook then ends the process rather than finalize under it)."""
    reaper, free = Reaper(), threading.Event()

    class Slow:
        backend = "gloo"

        def __del__(self) -> None:
            free.wait(10)

    reaper.release(Slow(), after_s=60)  # its timer has not fired: drain runs it
    started = time.monotonic()
    assert not reaper.drain(0.5)
    assert time.monotonic() - started < 2.0
    assert reaper.busy()
    free.set()
    deadline = time.monotonic() + 5
    while reaper.busy() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not reaper.busy()
