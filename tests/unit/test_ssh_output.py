"""The SSH remote wrapper's relay of its worker's output (``driver.launch.ssh_output``), with real pipes and sockets:
to the first connection while it reads, kept (bounded) once it broke, then to a restarted driver that attached."""

from __future__ import annotations

import os
import socket
import time

import pytest

from cloud_elastic.driver.launch.ssh_output import ERR, KEEP_BYTES, OUT, OutputPump, frame, unframe
from cloud_elastic.driver.launch.ssh_wire import sent_line

pytestmark = pytest.mark.timeout(30)


def _received(conn: socket.socket, until: bytes) -> bytes:
    """The worker's output a connection got (its OUT frames), up to and including ``until``."""
    buffer, out = bytearray(), b""
    conn.settimeout(10)
    while until not in out:
        data = conn.recv(65536)
        assert data, f"connection closed; got {out[-200:]!r}"
        buffer += data
        out += b"".join(payload for kind, payload in unframe(buffer) if kind == OUT)
    return out


def _wait_kept(pump: OutputPump, last: bytes) -> None:
    """Until the pump has taken in everything up to ``last`` (it is the end of what it keeps)."""
    deadline = time.monotonic() + 10
    while not pump._kept.endswith(last) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_output_goes_to_the_first_connection_then_is_kept_bounded_then_goes_to_each_driver_that_attaches():
    worker_r, worker_w = os.pipe()
    first_r, first_w = os.pipe()
    pump = OutputPump(worker_r, first_w)
    pump.start()
    os.write(worker_w, b"to the first driver\n")
    assert os.read(first_r, 100) == b"to the first driver\n"
    os.close(first_r)  # the driver that started the worker died
    line = b"x" * 99 + b"\n"
    os.write(worker_w, line)  # found the connection broken: kept
    for _ in range(3 * KEEP_BYTES // len(line)):
        os.write(worker_w, line)
    os.write(worker_w, b"last while away\n")
    _wait_kept(pump, b"last while away\n")
    ours, theirs = socket.socketpair()
    pump.attach(ours)
    got = _received(theirs, b"last while away\n")
    head, _, rest = got.partition(b"\n")
    assert head.startswith(b"cloud-elastic remote: ") and b"were dropped" in head, head
    dropped = int(head.split(b": ")[1].split()[0])
    assert len(rest) <= KEEP_BYTES and dropped + len(rest) == (3 * KEEP_BYTES // len(line) + 1) * len(line) + 16
    assert rest.endswith(b"last while away\n") and rest.startswith(b"x")  # from a line start, the newest
    os.write(worker_w, b"live\n")
    assert _received(theirs, b"live\n") == b"live\n"
    pump.lost(ours)  # that driver died too: kept again, for the next one
    theirs.close()
    os.write(worker_w, b"while away again\n")
    _wait_kept(pump, b"while away again\n")
    ours2, theirs2 = socket.socketpair()
    pump.attach(ours2)
    os.write(worker_w, b"the end\n")
    os.close(worker_w)
    pump.join(10)
    pump.close_conns([ours2], b"CLOUD_ELASTIC_EXIT n 0 none\n", _sent)
    buffer, frames = bytearray(), []
    theirs2.settimeout(10)
    while data := theirs2.recv(65536):
        buffer += data
    frames = unframe(buffer)
    # The marker comes after the count of the output sent on that connection (ssh_wire.SENT): the kept bytes and
    # the live ones, 17 + 8, so the restarted driver tells the exit once it has read them all.
    assert frames == [(OUT, b"while away again\n"), (OUT, b"the end\n"), (ERR, b"CLOUD_ELASTIC_SENT n 25\n"),
                      (ERR, b"CLOUD_ELASTIC_EXIT n 0 none\n")]


def _sent(count: int) -> bytes:
    return (sent_line("n", count) + "\n").encode()


def test_frames_cut_anywhere_come_out_whole_and_in_order():
    stream = frame(OUT, b"a" * 10) + frame(ERR, b"marker\n") + frame(OUT, b"")
    buffer, got = bytearray(), []
    for i in range(len(stream)):
        buffer += stream[i:i + 1]
        got += unframe(buffer)
    assert got == [(OUT, b"a" * 10), (ERR, b"marker\n"), (OUT, b"")] and not buffer


def test_the_workers_output_is_forwarded_while_a_child_it_left_still_holds_the_pipe():
    """fixS: the wrapper sent the worker's status only at its output pipe's end (or 5 s on), which a child the
    worker left holds off for as long as it lives. ``forwarded`` says when the bytes in the pipe have gone out and
    sshd has read them from the first connection, the pipe's end or not; the test holds the pipe's write end open
    as that child would, and a wait for its end would run into the test's timeout (600 s bound here)."""
    worker_r, worker_w = os.pipe()
    first_r, first_w = os.pipe()
    pump = OutputPump(worker_r, first_w)
    pump.start()
    try:
        os.write(worker_w, b"x" * 1000 + b"\nthe worker's last words\n")
        assert not pump.forwarded(0.3)  # sshd has not read them yet: the worker's status would overtake them
        got = b""
        while not got.endswith(b"the worker's last words\n"):
            got += os.read(first_r, 65536)
        assert pump.forwarded(600.0) and pump.sent_first == len(got) == 1025  # the count the marker follows
        ours, theirs = socket.socketpair()  # a driver that attached: its frames are not waited for
        pump.attach(ours)
        os.write(worker_w, b"a child's line\n")
        assert _received(theirs, b"a child's line\n") == b"a child's line\n"
        assert pump.forwarded(600.0)
        pump.close_conns([ours], b"CLOUD_ELASTIC_EXIT n -9 -\n", _sent)
        buffer = bytearray()
        theirs.settimeout(10)
        while data := theirs.recv(65536):
            buffer += data
        assert unframe(buffer) == [(ERR, b"CLOUD_ELASTIC_SENT n 15\n"), (ERR, b"CLOUD_ELASTIC_EXIT n -9 -\n")]
    finally:
        os.close(worker_w)
        pump.join(10)
