"""The remote wrapper, run for real, passes a SIGTERM of its own (a pod's, from start-sshd.sh) on to the
worker's process alone and keeps watching; a second one, or the driver's order, stops the whole group. So it does
for a SIGTERM that comes while it starts the worker, however slow its main thread is then."""

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


# The wrapper's main thread slowed where a loaded host may hold it: just after it started its output pump, which
# relays the worker's first lines at once (the driver may act on them, e.g. send a signal, meanwhile).
_SLOW_AFTER_PUMP = textwrap.dedent("""
    import time
    from cloud_elastic.driver.launch import ssh_output
    start = ssh_output.OutputPump.start
    ssh_output.OutputPump.start = lambda pump: (start(pump), time.sleep(1.0))[0]
""")
# A SIGTERM to the wrapper the moment its worker process exists, before the wrapper goes on.
_TERM_AT_POPEN = textwrap.dedent("""
    import os, signal, subprocess
    popen = subprocess.Popen
    def term_at_popen(*args, **kwargs):
        proc = popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return proc
    subprocess.Popen = term_at_popen
""")


def _wrapper(tmp_path, worker: list[str] | None = None, patch: str = "") -> subprocess.Popen:
    """The wrapper of ``worker`` (by default ``_WORKER``), run after ``patch`` (Python code) if any."""
    wrapper = [sys.executable, "-c", f"{patch}\nfrom {MODULE} import main\nmain()"] if patch else [sys.executable,
                                                                                                  "-m", MODULE]
    proc = subprocess.Popen([*wrapper, "n1", "5.0", "0", str(tmp_path), *(worker or [sys.executable, "-c", _WORKER])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
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


@pytest.mark.parametrize("patch", ["", _SLOW_AFTER_PUMP], ids=["plain", "slow-after-pump"])
def test_the_drivers_term_order_still_stops_the_group_after_a_sigterm(tmp_path, patch):
    """slow-after-pump: the SIGTERM comes once the worker's lines are out, while the wrapper's main thread is still
    held after starting the pump (before, the wrapper took it for one before its worker started and exited 1: no
    'worker SIGTERM 1', no status, the worker's child left running)."""
    proc = _wrapper(tmp_path, patch=patch)
    seen: list[str] = []
    child = None
    try:
        child = _ready(proc, seen)
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
        _kill_left(child)
    assert "child SIGTERM" in rest or "child SIGTERM" in seen


def test_a_sigterm_while_the_wrapper_starts_its_worker_reaches_the_worker_and_its_status_the_driver(tmp_path):
    """Before, the wrapper exited 1 at once: no status line, and the worker was KILLed by the kernel alone."""
    proc = _wrapper(tmp_path, worker=["sleep", "30"], patch=_TERM_AT_POPEN)
    try:
        proc.wait(timeout=20)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    markers = [m for m in (parse_marker(line, "n1") for line in err.splitlines()) if m is not None]
    assert markers == [(-signal.SIGTERM, "-")] and proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert "SIGTERM: passed on to the worker" in err


def _kill_left(pid: int | None) -> None:
    """A worker's child that a failing wrapper left running (it would sleep on for good)."""
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tgkill(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to thread ``tid`` of process ``pid`` (the kernel's choice of thread, made for us)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill is Linux's")
def test_a_sigterm_the_kernel_hands_to_another_thread_of_the_wrapper_is_acted_on(tmp_path):
    """A process-directed signal may go to any thread that does not block it. The wrapper's main thread waited for
    the worker in one blocking waitpid, which a signal given to its watchdog or output thread does not interrupt:
    Python ran the handler only once the worker ended, so the worker never heard the pod's SIGTERM and a second
    never stopped the group (seen as a clean clone's 60 s timeout of the test above, under load)."""
    proc = _wrapper(tmp_path)
    seen: list[str] = []
    try:
        _ready(proc, seen)
        others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert others, "the wrapper runs its watchdog and output threads by now"
        for count in (1, 2):
            _tgkill(proc.pid, others[0], signal.SIGTERM)
            _read_until(proc, f"worker SIGTERM {count}", seen)
        assert proc.wait(30) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
