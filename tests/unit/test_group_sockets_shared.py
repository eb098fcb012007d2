"""Two process groups that formed at the same time each count the other's connections opened meanwhile
(``reclaim.GroupSockets``: what appeared while it formed). A dropped plan's group whose check failed is shut down
sparing the round in use (``GroupSockets.spare``): shut down, that round's next collective failed (review s59 rvP
finding 2). Any other group shut down cuts all it counts, whoever else counts them: an abandoned round's collective
must fail at once (tests/integration/test_abandoned_groups.py)."""

from __future__ import annotations

import socket

import pytest

from cloud_elastic.worker.rounds.reclaim import GroupSockets, socket_inodes

pytestmark = pytest.mark.timeout(10)


def _pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return client, server


def _works(a: socket.socket, b: socket.socket) -> bool:
    try:
        a.sendall(b"x")
        b.settimeout(2)
        return b.recv(1) == b"x"
    except OSError:
        return False


def test_a_group_told_to_spare_another_leaves_the_connections_both_count() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        before = socket_inodes()
        own = _pair(listener)  # the shut down group's own connection, opened before the other group formed
        other_before = socket_inodes()
        shared = _pair(listener)  # the other group's, opened while both formed
        after = socket_inodes()
        try:
            dead = GroupSockets(before, after, ())  # counts both
            live = GroupSockets(other_before, after, ())  # counts the shared one
            assert len(dead) == 4 and len(live) == 2  # both ends of each pair are this process's here
            dead.spare(live)
            assert dead.shutdown() == 2
            assert not _works(*own)
            assert _works(*shared)
            assert live.shutdown() == 2
            assert not _works(*shared)
        finally:
            for s in (*own, *shared):
                s.close()


def test_a_group_not_told_to_spare_cuts_all_it_counts_though_another_counts_them_too() -> None:
    """An abandoned round's connections are cut though a group formed at the same time counts some of them."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        before = socket_inodes()
        pair = _pair(listener)
        after = socket_inodes()
        try:
            other = GroupSockets(before, after, ())  # alive, counting the same connection
            assert GroupSockets(before, after, ()).shutdown() == 2
            assert not _works(*pair)
            assert len(other) == 2
        finally:
            for s in pair:
                s.close()
