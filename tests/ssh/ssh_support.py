"""Helpers for the SSH tests: process listing by marker, waiting, running a worker."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from cloud_elastic.driver.launch.api import ExitStatus, WorkerSpec
from cloud_elastic.driver.launch.ssh import SSHLauncher, SSHWorkerProcess

#: Loopback aliases the test sshd serves; 127.0.0.2 and 127.0.0.3 play remote hosts.
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
#: The test sshd listens here too, but accepts no key (a "refused key" host).
REFUSING_HOST = "127.0.0.4"
#: An sshd of its own (fixture ``recycled_address``) that restarts with new host keys: a recycled private IP.
RECYCLED_ADDRESS = "127.0.0.6"
#: Nothing listens here: connection refused.
UNREACHABLE_HOST = "127.0.0.9"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
PYTHON = os.path.basename(sys.executable)


@dataclass(frozen=True)
class Proc:
    """One live process as seen in /proc."""

    pid: int
    cmdline: str
    state: str


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _state(pid: str) -> str:
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    parts = stat.rsplit(")", 1)
    return parts[1].split()[0] if len(parts) == 2 and parts[1].split() else "?"


def processes_with(needle: str, *, cmdline_only: bool = False) -> list[Proc]:
    """Every live (non-zombie) process whose cmdline (or environ) contains ``needle``."""
    raw = needle.encode()
    found = []
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        cmdline = _read(f"/proc/{pid}/cmdline")
        hit = raw in cmdline or (not cmdline_only and raw in _read(f"/proc/{pid}/environ"))
        if hit:
            state = _state(pid)
            if state not in ("Z", "X", "?"):
                found.append(Proc(int(pid), cmdline.replace(b"\0", b" ").decode(errors="replace")[:200], state))
    return found


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll ``predicate`` every 50 ms until it is truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def wait_gone(marker: str, timeout_s: float) -> None:
    """Wait until no process carries ``marker``; fail listing the survivors."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_with(marker)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes left after {timeout_s:g}s: {left}")
        time.sleep(0.05)


@dataclass
class Output:
    """Collects forwarded lines; lets a test wait for one."""

    lines: list[str] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, line: str) -> None:
        with self._cond:
            self.lines.append(line)
            self._cond.notify_all()

    def wait_for(self, prefix: str, timeout_s: float = 30.0) -> str:
        """The first line starting with ``prefix``; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line starting with {prefix!r} within {timeout_s:g}s: {self.lines}")
                self._cond.wait(left)


def spec(host: str, marker: str, *args: str, env: dict[str, str] | None = None, secret: str = "s3cret",
         cwd: str = "/", instance: str | None = None) -> WorkerSpec:
    """A spec running ``_worker.py MARKER ARGS`` with the marker in env and cmdline.

    The test run's ``PYTHONPATH`` is forwarded, so the remote wrapper
    (``python3 -m cloud_elastic.driver.launch.ssh_remote``) is the code under test.
    """
    return WorkerSpec(worker_id=f"w-{marker[-6:]}", host=host, slot=0, command=(PYTHON, WORKER, marker, *args),
                      env={**forwarded_env(), "CETEST_MARKER": marker, **(env or {})}, secret=secret, cwd=cwd,
                      instance=instance)


def forwarded_env() -> dict[str, str]:
    """What the tests forward to remote hosts besides their own variables: the test run's PYTHONPATH."""
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}


def start(launcher: SSHLauncher, host: str, marker: str, *args: str, **kwargs: object
          ) -> tuple[SSHWorkerProcess, Output]:
    """Launch the test worker; return the process and its collected output."""
    out = Output()
    return launcher.launch(spec(host, marker, *args, **kwargs), out), out  # type: ignore[arg-type]


def wait_exit(proc: SSHWorkerProcess, timeout_s: float = 30.0) -> ExitStatus:
    """The exit status, waiting up to ``timeout_s``."""
    return wait_until(proc.poll, timeout_s, f"worker {proc.spec.worker_id} to end")  # type: ignore[return-value]
