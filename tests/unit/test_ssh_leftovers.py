"""What killed SSH wrappers and old exit reports leave on a host is removed by a later launch (driver.launch.
ssh_leftovers): before, every launch left its exit report for good and every killed wrapper its socket (1,123 files
on the test machine after a day of runs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from cloud_elastic.driver.launch.ssh_leftovers import REPORT_KEEP_S, SOCKET_SETTLE_S, SWEEP_EVERY_S, sweep
from cloud_elastic.driver.launch.ssh_remote import MODULE

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(not os.path.exists("/proc/net/unix"), reason="sockets are swept on Linux only")]

DAY = 24 * 3600.0


def _socket(path: str, *, listening: bool) -> socket.socket | None:
    """A Unix socket file at ``path``: still bound and listening (a live wrapper's), or left by a killed one."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    if listening:
        sock.listen(1)
        return sock
    sock.close()  # the file stays, bound by no one: what SIGKILL leaves
    return None


def _age(path: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def leftovers(tmp_path):
    """A private directory as a wrapper makes it (``$TMPDIR`` with a space, as /proc/net/unix shows it), seeded."""
    directory = tmp_path / "tmp dir" / f"cloud-elastic-{os.getuid()}"
    directory.mkdir(parents=True, mode=0o700)
    d = str(directory)
    live = _socket(os.path.join(d, "aa.sock"), listening=True)
    _socket(os.path.join(d, "bb.sock"), listening=False)
    _socket(os.path.join(d, "cc.sock"), listening=False)
    for name, days in (("dd.exit.json", 8), ("ee.exit.json", 1), ("ff.exit.json.status", 8), ("gg.exit.json.tmp", 8),
                       ("notes.txt", 30)):
        (directory / name).write_text("{}")
        _age(os.path.join(d, name), days * DAY)
    for name in ("aa.sock", "bb.sock"):
        _age(os.path.join(d, name), 2 * SOCKET_SETTLE_S)  # cc.sock: just made, spared
    yield directory
    live.close()


def test_a_sweep_removes_only_dead_sockets_and_week_old_reports(leftovers) -> None:
    assert sweep(str(leftovers)) == 4
    assert sorted(p.name for p in leftovers.iterdir()) == [
        ".swept", "aa.sock", "cc.sock", "ee.exit.json", "notes.txt"]


def test_a_directory_is_swept_at_most_once_an_hour(leftovers) -> None:
    assert sweep(str(leftovers)) == 4
    (leftovers / "hh.exit.json").write_text("{}")
    _age(str(leftovers / "hh.exit.json"), REPORT_KEEP_S + DAY)
    assert sweep(str(leftovers)) == 0 and (leftovers / "hh.exit.json").exists()
    assert sweep(str(leftovers), now=time.time() + SWEEP_EVERY_S + 1) == 2  # cc.sock is no longer young either
    assert sorted(p.name for p in leftovers.iterdir()) == [".swept", "aa.sock", "ee.exit.json", "notes.txt"]


def test_a_real_wrapper_launch_sweeps_its_directory(leftovers) -> None:
    tmpdir = str(leftovers.parent)
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "abcd", "5.0", "0", tmpdir, sys.executable, "-c", "pass"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": tmpdir})
    try:
        proc.stdin.write(b"the-secret\n")
        proc.stdin.flush()  # and kept open: its end would be the driver's
        assert proc.wait(20) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
    assert sorted(p.name for p in leftovers.iterdir()) == [".swept", "aa.sock", "cc.sock", "ee.exit.json", "notes.txt"]
