"""The remote wrapper, run for real with a driver grace, keeps what its worker prints once the first connection's
stdin ends (the driver died), although that connection still takes writes, as sshd's does until the dead driver's
ssh fails to deliver a line; a driver that attaches then shows those lines."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import time

import pytest

from cloud_elastic.driver.launch.ssh_remote import MODULE

pytestmark = pytest.mark.timeout(30)

_WORKER = textwrap.dedent(r"""
    import os, sys, time
    def wait_for(path):
        while not os.path.exists(path):
            time.sleep(0.01)
    os.write(1, b"before\n")
    wait_for(sys.argv[1])
    os.write(1, b"printed while the driver was away\n")
    wait_for(sys.argv[2])
    os.write(1, b"printed after the attach\n")
    time.sleep(60)
""")


def _read_until(fd: int, end: bytes, timeout_s: float = 10.0) -> bytes:
    """What ``fd`` gives until ``end`` is in it; fails after ``timeout_s`` with what came."""
    data, deadline = b"", time.monotonic() + timeout_s
    while end not in data:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"no {end!r} in {timeout_s}s; got {data!r}"
        chunk = os.read(fd, 4096)
        assert chunk, f"ended before {end!r}; got {data!r}"
        data += chunk
    return data


def test_lines_printed_once_the_drivers_stdin_ended_go_to_the_driver_that_attaches(tmp_path):
    away, attached = tmp_path / "away", tmp_path / "attached"
    env = {**os.environ, "TMPDIR": str(tmp_path), "CLOUD_ELASTIC_DRIVER_GRACE_S": "30"}
    wrapper = subprocess.Popen([sys.executable, "-m", MODULE, "ab12", "5.0", "0", str(tmp_path), sys.executable, "-c",
                                _WORKER, str(away), str(attached)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    attach = None
    try:
        wrapper.stdin.write(b"the-secret\n")
        wrapper.stdin.flush()
        assert _read_until(wrapper.stdout.fileno(), b"\n") == b"before\n"
        wrapper.stdin.close()  # the driver died: its ssh passed the end of its stdin on; stdout still takes writes
        _read_until(wrapper.stderr.fileno(), b"lost the driver")
        away.touch()
        attach = subprocess.Popen([sys.executable, "-m", MODULE, "--attach", "ab12"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        _read_until(wrapper.stderr.fileno(), b"a restarted driver attached")
        attached.touch()
        out = _read_until(attach.stdout.fileno(), b"printed after the attach\n")
        assert out == b"printed while the driver was away\nprinted after the attach\n", out
        attach.stdin.write(b"KILL\n")
        attach.stdin.flush()
        assert wrapper.wait(10) != 0
        assert wrapper.stdout.read() == b"", "a line went to the dead driver's connection"
    finally:
        for proc in (wrapper, attach):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
