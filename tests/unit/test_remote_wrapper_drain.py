"""The remote wrapper, run for real, relays all its worker wrote before it sends the worker's status, and a process
that left the worker's group and still holds its output pipe delays that status by its bound only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cloud_elastic.driver.launch.ssh_remote import MODULE, parse_marker

pytestmark = pytest.mark.timeout(60)

_LINES = 3000
# More than two pipes' buffers (about 150 KB), written as the worker ends; a process of a session of its own (which
# the stop of the worker's group misses) holds the pipe on.
_WORKER = textwrap.dedent(r"""
    import os, subprocess
    holder = subprocess.Popen(["sleep", "50"], start_new_session=True)
    os.write(1, f"holder {holder.pid}\n".encode())
    for i in range(%d):
        os.write(1, b"line %%d %%s\n" %% (i, b"x" * 40))
    os.write(1, b"last line\n")
    os._exit(3)
""" % _LINES)


def _read_slowly(fd: int) -> list[str]:
    """All a slow connection reads (about 400 KB/s) until its end: the worker ends before its last lines are out."""
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
        time.sleep(0.01)
    return data.decode().splitlines()


def test_the_workers_last_lines_come_before_its_status_and_a_holder_of_its_pipe_delays_it_by_the_bound_only(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "n1", "5.0", "0", str(tmp_path), sys.executable, "-c",
                             _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    holder = None
    try:
        proc.stdin.write(b"the-secret\n")
        proc.stdin.flush()
        started = time.monotonic()
        out = _read_slowly(proc.stdout.fileno())  # to the wrapper's end: the holder has not this pipe
        took = time.monotonic() - started
        holder = int(out[0].split()[1])
        assert proc.wait(10) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if holder is not None:
            os.kill(holder, signal.SIGKILL)
    assert out[1:] == [f"line {i} {'x' * 40}" for i in range(_LINES)] + ["last line"], out[-3:]
    err = proc.stderr.read().decode()
    assert [m for m in (parse_marker(line, "n1") for line in err.splitlines()) if m is not None] == [(3, "-")], err
    assert took < 30, took  # the wrapper's drain bound (5 s), not the holder's 50 s
