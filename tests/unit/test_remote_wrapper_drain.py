"""The remote wrapper, run for real, relays all its worker wrote before it sends the worker's status, and a process
that left the worker's group and still holds its output pipe delays that status by its bound only."""

from __future__ import annotations

import os
import select
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


def _wrapper(tmp_path, grace_s: str, worker: str) -> subprocess.Popen[bytes]:
    """The remote wrapper (launch ``n1``, no keepalive) running ``python -c WORKER``, given its secret."""
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "n1", grace_s, "0", str(tmp_path), sys.executable, "-c",
                             worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    proc.stdin.write(b"the-secret\n")
    proc.stdin.flush()
    return proc


def test_the_workers_last_lines_come_before_its_status_and_a_holder_of_its_pipe_delays_it_by_the_bound_only(tmp_path):
    proc = _wrapper(tmp_path, "5.0", _WORKER)
    holder = None
    try:
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


# A child left in the worker's group that ignores the wrapper's TERM (so it lives the whole grace) and holds the pipe.
_LEAVER = textwrap.dedent(r"""
    import os, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited through exec: ignored from the child's start
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    os.write(1, f"child {child.pid}\n".encode())
    for i in range(%d):
        os.write(1, b"line %%d %%s\n" %% (i, b"x" * 40))
    os.write(1, b"RuntimeError: the worker's last words\n")
    os.kill(os.getpid(), signal.SIGKILL)
""" % _LINES)


def test_the_workers_status_follows_its_last_lines_without_waiting_for_the_child_it_left(tmp_path):
    """fixS: the status went only after the stop of what the worker left in its group (TERM, KILL after the
    grace: 600 s here) and its pipe's end (which that child held): a kill -9 was told 4.8 s late over SSH. It now goes
    once the worker's own output is out, the child still alive; the wrapper stops that child after."""
    proc = _wrapper(tmp_path, "600", _LEAVER)
    child = None
    try:
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + 30
        while b"CLOUD_ELASTIC_EXIT" not in err and time.monotonic() < deadline:
            for fd in select.select([proc.stdout, proc.stderr], [], [], 1.0)[0]:
                (out if fd is proc.stdout else err).extend(os.read(fd.fileno(), 65536))
        lines = out.decode().splitlines()
        child = int(lines[0].split()[1])
        markers = [m for m in (parse_marker(line, "n1") for line in err.decode().splitlines()) if m is not None]
        assert markers == [(-9, "-")], err
        assert lines[1:] == [f"line {i} {'x' * 40}" for i in range(_LINES)] + ["RuntimeError: the worker's last words"]
        assert proc.poll() is None and os.path.exists(f"/proc/{child}"), "nothing held the output"
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)  # the wrapper, waiting to KILL it after the grace, then ends
        proc.stdout.close()  # (the pipe's end: nothing reads the child's words any more)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
