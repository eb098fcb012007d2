"""The remote wrapper, run for real, passes a SIGTERM of its own (a pod's, from start-sshd.sh) on to the
worker's process alone and keeps watching; a second one, or the driver's order, stops the whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from cloud_elastic.driver.launch.ssh_remote import MODULE, parse_marker

pytestmark = pytest.mark.timeout(60)

# The worker: a child of its own in its group; each reports every SIGTERM it gets. The worker stays after
# its first SIGTERM (as one inside elastic.run does) and exits 7 at its second.
_WORKER = textwrap.dedent(r"""
    import os, signal, sys, time
    def say(line):  # one write a line: two processes share the pipe
        os.write(1, (line + "\n").encode())
    count = 0
    def on_term(*_):
        global count
        count += 1
        say(f"worker SIGTERM {count}")
        if count == 2:
            os._exit(7)
    child = os.fork()
    if child == 0:  # counts its SIGTERMs, and says how many it got when asked (SIGUSR1)
        signal.signal(signal.SIGTERM, lambda *_: (say("child SIGTERM"), os._exit(0)))
        signal.signal(signal.SIGUSR1, lambda *_: say("child alive"))
        say(f"child ready {os.getpid()}")
        while True:
            time.sleep(1)
    signal.signal(signal.SIGTERM, on_term)
    say("worker ready")
    while True:
        time.sleep(1)
""")


def _wrapper(tmp_path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "n1", "5.0", "0", str(tmp_path), sys.executable, "-c",
                             _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    proc.stdin.write("the-secret\n")
    proc.stdin.flush()
    return proc


def _read_until(proc: subprocess.Popen, line: str, seen: list[str]) -> None:
    for got in proc.stdout:
        seen.append(got.rstrip("\n"))
        if seen[-1].startswith(line):
            return
    raise AssertionError(f"no {line!r}: {seen}; stderr: {proc.stderr.read()}")


def _ready(proc: subprocess.Popen, seen: list[str]) -> int:
    """Wait until the worker and its child run; return the child's pid."""
    for line in ("child ready", "worker ready"):  # in either order
        if not any(s.startswith(line) for s in seen):
            _read_until(proc, line, seen)
    return int(next(s for s in seen if s.startswith("child ready")).split()[-1])


def test_a_sigterm_to_the_wrapper_reaches_the_worker_alone_and_a_second_stops_the_group(tmp_path):
    proc = _wrapper(tmp_path)
    seen: list[str] = []
    try:
        child = _ready(proc, seen)
        proc.send_signal(signal.SIGTERM)
        _read_until(proc, "worker SIGTERM 1", seen)
        os.kill(child, signal.SIGUSR1)
        _read_until(proc, "child alive", seen)  # the first SIGTERM did not reach the worker's child
        assert "child SIGTERM" not in seen and proc.poll() is None, seen
        proc.send_signal(signal.SIGTERM)  # the old meaning: TERM to the whole group, KILL after the grace
        _read_until(proc, "worker SIGTERM 2", seen)
        assert proc.wait(30) == 7
        rest = proc.stdout.read().splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    markers = [m for m in (parse_marker(line, "n1") for line in err.splitlines()) if m is not None]
    assert markers == [(7, "-")], err
    assert "SIGTERM: passed on to the worker" in err
    assert (seen + rest).count("child SIGTERM") == 1, seen + rest  # the group's TERM, at the second


def test_the_drivers_term_order_still_stops_the_group_after_a_sigterm(tmp_path):
    proc = _wrapper(tmp_path)
    seen: list[str] = []
    try:
        _ready(proc, seen)
        proc.send_signal(signal.SIGTERM)
        _read_until(proc, "worker SIGTERM 1", seen)
        proc.stdin.write("TERM 5\n")  # the driver's stop (host removed, job over): the group, as before
        proc.stdin.flush()
        assert proc.wait(30) == 7
        rest = proc.stdout.read().splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "child SIGTERM" in rest or "child SIGTERM" in seen
