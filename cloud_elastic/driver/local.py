"""Starting workers on this machine (``localhost`` and every loopback address)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

from cloud_elastic.driver.launch import ExitStatus, OutputSink, WorkerSpec
from cloud_elastic.errors import LaunchError

__all__ = ["LocalLauncher", "LocalProcess", "forward_lines", "kill_group", "process_start_time"]

log = logging.getLogger(__name__)


def forward_lines(stream, on_output: OutputSink) -> None:
    """Read ``stream`` line by line into ``on_output`` until EOF (runs on its own thread)."""
    try:
        for raw in iter(stream.readline, b""):
            on_output(raw.decode(errors="replace").rstrip("\n"))
    except (OSError, ValueError):
        pass
    finally:
        stream.close()


def kill_group(pid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pid``; a group that is gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (None if it is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class LocalProcess:
    """A worker running as a child process in its own session (process group).

    ``poll`` and ``kill`` never block; ``terminate`` blocks up to its grace.
    The child stays unreaped (a zombie) until ``poll`` or ``terminate`` sees it end.
    """

    def __init__(self, spec: WorkerSpec, popen: subprocess.Popen) -> None:
        self.spec = spec
        self._popen = popen
        self._lock = threading.Lock()
        self._start = process_start_time(popen.pid)

    def handle(self) -> dict[str, object]:
        """How a restarted driver finds this process again (see :mod:`.adoption`)."""
        return {"kind": "local", "pid": self._popen.pid, "start": self._start}

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> ExitStatus | None:
        """The exit status once the child has ended (reaping it), else ``None``. Never blocks."""
        code = self._popen.poll()
        return None if code is None else ExitStatus(code)

    def terminate(self, grace_s: float = 5.0) -> None:
        """TERM the group, KILL it after ``grace_s``, reap the child. Blocks up to ``grace_s``; idempotent."""
        with self._lock:
            if self._popen.poll() is None:
                kill_group(self._popen.pid, signal.SIGTERM)
                deadline = time.monotonic() + grace_s
                while self._popen.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            # Children the worker left behind in its group go too.
            kill_group(self._popen.pid, signal.SIGKILL)
            self._popen.wait()

    def kill(self) -> None:
        """SIGKILL the whole group and return at once; ``poll`` reaps the child. Idempotent."""
        kill_group(self._popen.pid, signal.SIGKILL)

    def dump_stacks(self) -> bool:
        """Ask the worker process (not its children) to print its Python stacks (SIGUSR1, which the worker
        library hands to ``faulthandler``: it answers even with its interpreter stuck); False if it is gone."""
        try:
            os.kill(self._popen.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return self._popen.poll() is None


class LocalLauncher:
    """Starts each worker as a child process with its own process group.

    The secret is put in the child's environment only (never its command line).
    """

    def launch(self, spec: WorkerSpec, on_output: OutputSink) -> LocalProcess:
        env = dict(os.environ)
        env.update(spec.env)
        env["CLOUD_ELASTIC_SECRET"] = spec.secret
        # `python` in the command means the driver's interpreter (its virtualenv), as over SSH.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        try:
            popen = subprocess.Popen(
                list(spec.command),
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {spec.command[0]!r} for {spec.worker_id}: {exc.strerror or exc}") from exc
        threading.Thread(
            target=forward_lines, args=(popen.stdout, on_output), name=f"out-{spec.worker_id}", daemon=True
        ).start()
        log.debug("started %s as pid %d", spec.worker_id, popen.pid)
        return LocalProcess(spec, popen)

    def close(self) -> None:
        pass
