"""Running ``cloud-elastic run`` as a real process and synchronising on its output."""

from __future__ import annotations

import atexit
import heapq
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("probe.py")
CLI = [sys.executable, "-m", "cloud_elastic.cli"]
_EVENT = re.compile(r"^\[(?P<rank>[-\d]+)\]<(?P<slot>[^>]*)> EVENT (?P<json>\{.*\})$")


@dataclass
class Event:
    kind: str
    data: dict

    def __getitem__(self, key: str):
        return self.data[key]


_PARENTS: dict = {}  # start-up key -> (socket path or None, process, directory): this process's parents of fork servers
_PARENT_LOCK = threading.Lock()
_MAX_PARENTS = 3


def parent_of_servers(env: dict[str, str] | None = None) -> str | None:
    """The socket of this test process's parent of fork servers (``forkserver.start_parent``) for a job of
    ``env`` (default: this process's environment), started at the first call and ended at exit; None where
    drivers fork no workers (a GPU machine) or it did not start.

    Every job a test starts gets it (``CLOUD_ELASTIC_FORKSERVER_PARENT``), so its driver's fork server
    is forked from it in milliseconds instead of importing torch: the suite starts about a hundred
    jobs, and their servers' imports were a fifth of its CPU (312 of 1,300 CPU-seconds). A driver
    whose workers need other start-up settings than the parent's starts its own server, so there is one
    parent per set of start-up settings among this process's jobs (three at most), and a parent that died
    is started again. With one parent, started from this process's environment, a clean-clone run still
    started about forty servers of their own (2-3 CPU-seconds each): the jobs that set PYTHONPATH, for one.
    The jobs of tests that set the variable themselves keep theirs (``test_local_launcher.py`` tests both
    ways).
    """
    from cloud_elastic.driver.launch import forkserver
    env = dict(os.environ if env is None else env)
    try:
        if not forkserver.enabled(env):  # a GPU machine, or CLOUD_ELASTIC_LOCAL_FORKSERVER=0: drivers fork nothing
            return None
    except Exception:  # a value the driver refuses: its own one-line error, with no parent
        return None
    # Started as the jobs' workers are: the driver gives them OMP_NUM_THREADS=1 unless it is set.
    start_env = {"OMP_NUM_THREADS": "1", **env}
    key = forkserver.startup_key(start_env)
    with _PARENT_LOCK:
        known = _PARENTS.get(key)
        if known is not None and (known[0] is None or known[1].poll() is None):
            return known[0]
        if known is None and len(_PARENTS) >= _MAX_PARENTS:  # each holds torch in memory: the driver starts its own
            return None
        directory = tempfile.mkdtemp(prefix="cloud-elastic-servers-")
        path = os.path.join(directory, "servers.sock")
        # die_with_caller: a test process ended by os._exit (pytest-timeout's thread method) runs no atexit.
        proc = forkserver.start_parent(path, start_env, die_with_caller=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        atexit.register(_end_parent, proc, directory)
        _PARENTS[key] = (path if os.path.exists(path) else None, proc, directory)
        return _PARENTS[key][0]


def _end_parent(proc: subprocess.Popen, directory: str) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(directory, ignore_errors=True)


class Job:
    """A running ``cloud-elastic run``; collects output lines and EVENTs as they arrive."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO) -> None:
        full_env = {**os.environ, **(env or {})}
        if "CLOUD_ELASTIC_FORKSERVER_PARENT" not in full_env:
            parent = parent_of_servers(full_env)
            if parent:
                full_env["CLOUD_ELASTIC_FORKSERVER_PARENT"] = parent
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.cmd = CLI + args
        self.proc = subprocess.Popen(
            self.cmd, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.lines: list[str] = []
        self.times: list[float] = []  # when each line arrived (time.monotonic()), for benchmarks
        self.events: list[Event] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._cond:
                self.lines.append(line)
                self.times.append(time.monotonic())
                m = _EVENT.match(line)
                if m:
                    data = json.loads(m.group("json"))
                    self.events.append(Event(data["kind"], data))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[["Job"], object], timeout: float = 60.0, what: str = "condition"):
        """Block until ``predicate(job)`` is truthy; return its value. Fails fast if the job ends first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self)
                if value:
                    return value
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"job ended (rc={self.proc.returncode}) before {what}:\n{self.output()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{self.output()}")
                self._cond.wait(min(remaining, 0.5))

    def wait_event(self, kind: str, timeout: float = 60.0, **match: object) -> Event:
        def find(job: "Job") -> Event | None:
            for e in job.events:
                if e.kind == kind and all(e.data.get(k) == v for k, v in match.items()):
                    return e
            return None

        return self.wait_for(find, timeout, f"event {kind} {match}")

    def finish(self, timeout: float = 120.0) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            self.kill()
            raise AssertionError(f"job did not finish within {timeout}s:\n{self.output()}")
        self._reader.join(10)
        return self.proc.returncode

    def dump_stacks(self) -> None:
        """Ask every worker of the job for a stack dump (the probe registers faulthandler on SIGUSR1)."""
        for pid in processes_of_job(self.job_id()):
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(1.0)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_job_workers(self.job_id())
        self.proc.wait()

    def output(self) -> str:
        """Every line so far. Tests assert on it (``"adopted" in out``): a tail would drop early lines."""
        with self._cond:
            return "\n".join(self.lines)

    def job_id(self) -> str | None:
        for line in self.lines:
            m = re.search(r"job (\w+): driver at", line)
            if m:
                return m.group(1)
        return None

    def of(self, kind: str, **match: object) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.kind == kind and all(e.data.get(k) == v for k, v in match.items())]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it has exited and waits for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " not in f.read()
    except OSError:
        return False


def processes_of_job(job_id: str | None) -> list[int]:
    """PIDs of live processes whose environment names this job (by process listing)."""
    if not job_id:
        return []
    needle = f"CLOUD_ELASTIC_JOB_ID={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in environ.split(b"\0") and ") Z " not in stat:
            pids.append(int(entry.name))
    return pids


def worker_on(job_id: str | None, host: str) -> int:
    """PID of a live worker of the job on ``host`` (its launched process, by its environment)."""
    for pid in processes_of_job(job_id):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"CLOUD_ELASTIC_HOSTNAME={host}".encode() in environ and any(
                v.startswith(b"CLOUD_ELASTIC_WORKER_ID=") for v in environ):
            return pid
    raise AssertionError(f"no worker of job {job_id} on {host}")


def kill_job_workers(job_id: str | None) -> None:
    for pid in processes_of_job(job_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def probe_cmd(*args: str) -> list[str]:
    return [sys.executable, str(PROBE), *args]


class HostsFile:
    """A discovery script whose answer the test controls by rewriting a file."""

    def __init__(self, directory: Path, hosts: list[str]) -> None:
        self.file = directory / "hosts.txt"
        self.script = directory / "discover.sh"
        self.script.write_text(f"#!/bin/sh\ncat '{self.file}'\n")
        self.script.chmod(0o755)
        self.set(hosts)

    def set(self, hosts: list[str]) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text("".join(h + "\n" for h in hosts))
        tmp.replace(self.file)


class EventFiles:
    """The EVENTs that worker processes wrote to ``DIRECTORY/<pid>.jsonl``, one JSON object a line,
    merged and ordered by their time ``t``.

    For jobs whose workers outlive their driver: an adopted worker's stdout went
    to the dead driver, so what it does is read from these files rather than
    from one :class:`Job`'s output. Read incrementally; a line still being
    written (no newline yet) is left for the next read.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._offsets: dict[Path, int] = {}
        self._events: list[Event] = []
        self._by_kind: dict[str, list[Event]] = {}
        self._latest: dict[tuple[str, str], Event] = {}

    def refresh(self) -> list[Event]:
        """Read what was appended since the last call; return all events so far, ordered by time.

        Cheap when little is new (soaks read hundreds of thousands of events): the
        new ones are merged into the tail they overlap, not the whole list re-sorted."""
        fresh = []
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            for raw in chunk[:end].splitlines():
                if raw.strip():
                    data = json.loads(raw)
                    fresh.append(Event(data["kind"], data))
            self._offsets[path] = offset + end
        if fresh:
            fresh.sort(key=_event_time)  # stable: one process's own order is kept on a tie
            _merge(self._events, fresh)
            for kind in {e.kind for e in fresh}:
                _merge(self._by_kind.setdefault(kind, []), [e for e in fresh if e.kind == kind])
            for e in fresh:
                key = (e.kind, e.data.get("worker"))
                if key not in self._latest or e.data["t"] >= self._latest[key].data["t"]:
                    self._latest[key] = e
        return self._events

    @property
    def events(self) -> list[Event]:
        return list(self.refresh())

    def of(self, kind: str, **match: object) -> list[Event]:
        self.refresh()
        return [e for e in self._by_kind.get(kind, []) if all(e.data.get(k) == v for k, v in match.items())]

    def latest(self, kind: str) -> dict[str, Event]:
        """worker id -> its newest event of ``kind``."""
        self.refresh()
        return {worker: e for (k, worker), e in self._latest.items() if k == kind}

    def wait_for(self, predicate: Callable[[EventFiles], object], timeout: float = 60.0,
                 what: str = "condition", driver: Job | None = None):
        """Poll until ``predicate(self)`` is truthy; return its value. Fails fast if ``driver`` ends first."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate(self)
            if value:
                return value
            if driver is not None and driver.proc.poll() is not None:
                driver._reader.join(5)
                value = predicate(self)  # what the workers wrote before the driver ended counts
                if value:
                    return value
                raise AssertionError(f"driver ended (rc={driver.proc.returncode}) before {what}:\n{driver.output()}")
            if time.monotonic() > deadline:
                tail = driver.output() if driver is not None else ""
                raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{tail}")
            time.sleep(0.2)


def _event_time(e: Event) -> float:
    return e.data["t"]


def _merge(into: list[Event], fresh: list[Event]) -> None:
    """Merge ``fresh`` (ordered by time) into ``into`` (ordered by time), in place; on a tie the older entry first."""
    if not fresh:
        return
    pos = len(into)
    first = _event_time(fresh[0])
    while pos and _event_time(into[pos - 1]) > first:
        pos -= 1
    into[pos:] = heapq.merge(into[pos:], fresh, key=_event_time)
