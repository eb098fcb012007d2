"""Two process groups that formed at the same time each count the other's connections opened meanwhile
(``reclaim.GroupSockets``: what appeared while it formed). Shutting one down must leave alone a connection that a
group still in use counts too: shut down, that group's next collective failed (review s59 rvP finding 2)."""

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


def test_a_group_shut_down_leaves_the_connections_a_live_group_counts_too() -> None:
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
            assert dead.shutdown() == 2
            assert not _works(*own)
            assert _works(*shared)
            assert live.shutdown() == 2  # its own turn: nothing keeps them now
            assert not _works(*shared)
        finally:
            for s in (*own, *shared):
                s.close()


def test_a_group_let_go_of_no_longer_keeps_its_connections_from_a_shutdown() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        before = socket_inodes()
        pair = _pair(listener)
        after = socket_inodes()
        try:
            released = GroupSockets(before, after, ())
            del released  # its group was released and destroyed
            assert GroupSockets(before, after, ()).shutdown() == 2
            assert not _works(*pair)
        finally:
            for s in pair:
                s.close()
