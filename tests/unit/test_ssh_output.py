"""The SSH remote wrapper's relay of its worker's output (``driver.launch.ssh_output``), with real pipes and sockets:
to the first connection while it reads, kept (bounded) once it broke, then to a restarted driver that attached."""

from __future__ import annotations

import os
import socket
import time

import pytest

from cloud_elastic.driver.launch.ssh_output import ERR, KEEP_BYTES, OUT, OutputPump, frame, unframe

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
    pump.close_conns([ours2], b"CLOUD_ELASTIC_EXIT n 0 none\n")
    buffer, frames = bytearray(), []
    theirs2.settimeout(10)
    while data := theirs2.recv(65536):
        buffer += data
    frames = unframe(buffer)
    assert frames == [(OUT, b"while away again\n"), (OUT, b"the end\n"), (ERR, b"CLOUD_ELASTIC_EXIT n 0 none\n")]


def test_frames_cut_anywhere_come_out_whole_and_in_order():
    stream = frame(OUT, b"a" * 10) + frame(ERR, b"marker\n") + frame(OUT, b"")
    buffer, got = bytearray(), []
    for i in range(len(stream)):
        buffer += stream[i:i + 1]
        got += unframe(buffer)
    assert got == [(OUT, b"a" * 10), (ERR, b"marker\n"), (OUT, b"")] and not buffer
