"""LocalLauncher with real child processes: stopping never blocks the caller and leaves no process behind."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid

import pytest

from cloud_elastic.driver.launch import WorkerSpec
from cloud_elastic.driver.local import LocalLauncher, LocalProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# Ignores TERM, starts a grandchild in its own group that ignores TERM too, says "ready", sleeps.
_STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]])
print("ready", child.pid, flush=True)
time.sleep(600)
"""


def _live_with(marker: str) -> set[int]:
    found = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.add(int(pid))
    return found


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)
    return value


def _start(launcher: LocalLauncher, marker: str, n: int) -> list[tuple[LocalProcess, int]]:
    started = []
    for i in range(n):
        ready = threading.Event()
        lines: list[str] = []

        def on_output(line: str, lines=lines, ready=ready) -> None:
            lines.append(line)
            if line.startswith("ready "):
                ready.set()

        spec = WorkerSpec(worker_id=f"w{i}", host="127.0.0.1", slot=i, env={}, secret="s", cwd=os.getcwd(),
                          command=(sys.executable, "-c", _STUBBORN, marker))
        proc = launcher.launch(spec, on_output)
        assert ready.wait(30), lines
        started.append((proc, int(lines[-1].split()[1])))
    return started


@pytest.fixture
def marker():
    marker = f"cetest-{uuid.uuid4().hex}"
    yield marker
    for pid in _live_with(marker):  # a failed test must not leave stubborn sleepers behind
        os.kill(pid, signal.SIGKILL)


def test_kill_returns_at_once_and_the_whole_group_dies(marker):
    started = _start(LocalLauncher(), marker, 3)
    for proc, _ in started:
        proc.kill()
    # kill() only sent the signal: no worker has been reaped by it (each pid still exists, alive or zombie).
    assert all(os.path.exists(f"/proc/{proc.pid}") for proc, _ in started)
    statuses = [_wait(proc.poll, 10, f"worker {proc.spec.worker_id} to end") for proc, _ in started]
    assert [s.code for s in statuses] == [-signal.SIGKILL] * 3
    _wait(lambda: not _live_with(marker), 10, "the grandchildren (same process group) to die")
    for proc, _ in started:
        proc.kill()  # idempotent


def test_terminate_escalates_to_kill_for_a_worker_that_ignores_term(marker):
    (proc, _), = _start(LocalLauncher(), marker, 1)
    proc.terminate(0.5)
    assert proc.poll().code == -signal.SIGKILL
    _wait(lambda: not _live_with(marker), 10, "the worker's group to die")
    proc.terminate(0.5)  # idempotent
