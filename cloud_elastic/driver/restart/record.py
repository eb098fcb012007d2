"""What a restarted driver needs to adopt its predecessor's running workers.

A driver keeps a private **adoption record** on its own disk, beside its
status record (:mod:`cloud_elastic.records`: a 0700 directory of this user,
the job secret in its own 0600 file)::

    <job dir>/adopt.json   {"v": 1, "job", "checkpoint_dir", "advertised", "bind", "control_port",
                            "store_port", "grace_s", "seq",
                            "workers": [{"id", "host", "slot", "seq", "handle"}],
                            "exited": [{"v": 1, "round", "rank", "code", "error", "id", "said"}]}   mode 0600

``handle`` says how to stop a worker this driver did not start: ``{"kind":
"local", "pid", "start"}`` (its process group, and the start time that tells
the same process from a later one with a reused pid), or ``{"kind": "ssh",
"nonce"}`` (the remote wrapper, reached again with ``ssh_remote --attach``).
Nothing of it lands on shared checkpoint storage. Beside it, a local worker whose
training function returned leaves its exit code as it exits
(:func:`~cloud_elastic.records.exit_report_path`, ``{"v": 1, "round", "rank",
"code", "error"}``): a restarted driver reads those of the workers that did not
come back (:func:`exit_reports`). A worker on another host leaves the same report on its host, beside its remote
wrapper's socket, and the restarted driver fetches it over ssh (:mod:`.remote_reports`); both are read with
:func:`parse_exit_report`. Only the workers in ``workers`` (running ones) are asked about after a restart, so the
members of a finishing round that exited while the driver was up are in ``exited``: their exit codes as the driver
saw them, in the same shape, checked the same way (:func:`recorded_exits`; ``"said": true`` where the driver had only
the code the worker said, not being its process's parent). The members a restarted driver judged without seeing them
exit (from its predecessor's record, or from their reports) are carried there too, for a driver restarted after it.
A code the driver had from the process's real exit status is final: a report the worker wrote (before its process
ended: a crash in teardown comes after it) only fills a rank with no such code. At most the first 4096 entries are
written and read (one per rank; a rank beyond them has an unknown exit code, never 0).

A driver of the same job started again within ``--driver-grace`` reads it,
listens on the same ports with the same secret (refusing every message signed
before it started: the predecessor's memory of nonces is not in the record, see
:mod:`cloud_elastic.control`), and answers the workers'
polls with ``ReRegister`` until they have re-registered (see
:meth:`~cloud_elastic.driver.job.elastic_job.ElasticJob.adopt`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloud_elastic.driver.launch.api import ExitStatus, WorkerSpec
from cloud_elastic.driver.launch.local import kill_group, process_start_time
from cloud_elastic.driver.launch.ssh_wire import REPORT_LIMIT, parse_exit_report
from cloud_elastic.records import exit_report_path, job_dir

__all__ = [
    "RECORD_NAME",
    "AdoptedLocalProcess",
    "SuccessorRecord",
    "AdoptedWorker",
    "AdoptionRecord",
    "exit_reports",
    "find_records",
    "location",
    "parse_exit_report",
    "read_record",
    "recorded_exits",
    "remove_record",
    "write_record",
]

log = logging.getLogger(__name__)

RECORD_NAME = "adopt.json"
_VERSION = 1
#: The most exits of a record read (one per rank of a round).
_MAX_EXITED = 4096


@dataclass(frozen=True)
class AdoptedWorker:
    """One worker of the predecessor: its id, slot and how to reach its process."""

    worker_id: str
    host: str
    slot: int
    seq: int
    handle: Mapping[str, Any]
    #: The job it belongs to (where a local worker keeps its output for this driver: ``restart.relay``).
    job_id: str = ""


@dataclass(frozen=True)
class AdoptionRecord:
    """What the predecessor recorded; ``secret`` comes from the status record's own 0600 file."""

    job_id: str
    checkpoint_dir: str
    advertised: str
    bind: str
    control_port: int
    store_port: int
    grace_s: float
    seq: int
    workers: tuple[AdoptedWorker, ...]
    secret: str
    #: The exit reports of the members of the finishing round that exited while it was up, as recorded (unchecked).
    exited: tuple[Any, ...] = ()
    #: When its workers' grace ends (Unix time: its last sign of life plus ``grace_s``), set by the restart's plan;
    #: 0: unknown.
    grace_ends: float = 0.0

    def worker(self, worker_id: str) -> AdoptedWorker | None:
        return next((w for w in self.workers if w.worker_id == worker_id), None)


def write_record(directory: Path, record: Mapping[str, Any]) -> None:
    """Write ``record`` as ``directory/adopt.json``, 0600 and atomically (the status record made ``directory``)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{RECORD_NAME}.")  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(record, v=_VERSION)) + "\n")
        os.replace(tmp, directory / RECORD_NAME)
    except BaseException:
        os.unlink(tmp)
        raise


def read_record(directory: Path) -> AdoptionRecord | None:
    """The predecessor's record, or None when there is none or it cannot be used (logged)."""
    path = directory / RECORD_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        secret = (directory / "secret").read_text(encoding="utf-8").strip()
        if raw.get("v") != _VERSION:
            raise ValueError(f"record version {raw.get('v')!r}")
        workers = tuple(AdoptedWorker(str(w["id"]), str(w["host"]), int(w["slot"]), int(w["seq"]), dict(w["handle"]),
                                       str(raw["job"])) for w in raw["workers"])
        exited = raw.get("exited")
        return AdoptionRecord(str(raw["job"]), str(raw["checkpoint_dir"]), str(raw["advertised"]), str(raw["bind"]), int(raw["control_port"]),
                              int(raw["store_port"]), float(raw["grace_s"]), int(raw["seq"]), workers, secret,
                              tuple(exited[:_MAX_EXITED]) if isinstance(exited, list) else ())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("cannot use the adoption record %s (%s); the running workers cannot be adopted", path, exc)
        return None


def location(url: str) -> str:
    """``--checkpoint-dir`` as the adoption records name it: a local path made absolute (from this process's working
    directory), a URL as given. ``--checkpoint-dir ckpt`` of drivers started in two directories names two stores:
    compared as given, one's record was taken for the other's (review h27)."""
    if "::" in url or ("://" in url and not url.startswith("file://")):
        return url
    return os.path.abspath(url[len("file://"):] if url.startswith("file://") else url)


def find_records(root: Path, checkpoint_dir: str) -> list[tuple[AdoptionRecord, int, float, float]]:
    """Records under ``root`` of drivers that checkpointed to ``checkpoint_dir``: (record, driver pid, last sign
    of life as Unix time, when the driver wrote its status record: its process had started by then), newest
    first. Found without reading the checkpoint storage (which is slow to open)."""
    found, wanted = [], location(checkpoint_dir)
    try:
        directories = [p for p in root.iterdir() if (p / RECORD_NAME).is_file()]
    except OSError:
        return []
    for directory in directories:
        record = read_record(directory)
        if record is None or record.checkpoint_dir != wanted or record.job_id != directory.name:
            continue
        try:
            status = directory / "driver.json"
            raw = json.loads(status.read_text(encoding="utf-8"))
            last_alive = status.stat().st_mtime
            found.append((record, int(raw["pid"]), last_alive, float(raw.get("started", last_alive))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda item: -item[2])


def remove_record(directory: Path) -> None:
    """Remove the adoption record and the workers' exit reports (every worker is stopped)."""
    for path in [directory / RECORD_NAME, *directory.glob(".exit-*.json")]:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def exit_reports(job_id: str, round_: int, limit: int = 4096) -> dict[int, tuple[str, int | None]]:
    """The exit reports of round ``round_`` in the job's directory (see module docstring; the first ``limit`` found):
    rank -> (worker id, exit code, None where the worker did not know it). The workers that left them are no longer
    in the adoption record (it lists running workers). An unreadable or malformed report is left out (logged)."""
    found: dict[int, tuple[str, int | None]] = {}
    try:
        names = [p.name for _, p in zip(range(limit), job_dir(job_id).glob(".exit-*.json"))]
    except OSError:
        return found
    for worker_id in (name[len(".exit-"):-len(".json")] for name in names):
        path = exit_report_path(job_id, worker_id)
        if path is None:
            continue
        try:
            with open(path, "rb") as fh:
                report_round, rank, code = parse_exit_report(fh.read(REPORT_LIMIT + 1))
        except (OSError, ValueError) as exc:
            log.warning("cannot read the exit report %s (%s)", path, exc)
            continue
        if report_round == round_:
            found[rank] = (worker_id, code)
    return found


def recorded_exits(record: AdoptionRecord, round_: int, *, final: bool = False) -> dict[int, tuple[str, int | None]]:
    """The exits of round ``round_`` the predecessor kept in its record (``exited``): rank -> (worker id, exit code,
    None where it did not learn it), each checked as an exit report is (:func:`parse_exit_report`); one that is not
    of that shape is left out (logged). ``final``: only the codes it had from the process's real exit status (an
    entry without ``"said": true``), which no report a worker wrote overrides."""
    found: dict[int, tuple[str, int | None]] = {}
    for entry in record.exited:
        try:
            worker_id = entry.get("id") if isinstance(entry, dict) else None
            said = entry.get("said", False) if isinstance(entry, dict) else None
            if not isinstance(worker_id, str) or not isinstance(said, bool):
                raise ValueError("malformed")
            report_round, rank, code = parse_exit_report(json.dumps(entry).encode())
        except ValueError as exc:
            log.warning("cannot use an exit the previous driver recorded (%s): %.200s", exc, entry)
            continue
        if report_round == round_ and not (final and (said or code is None)):
            found[rank] = (worker_id, code)
    return found


class AdoptedLocalProcess:
    """A local worker this driver did not start: known by its pid and start time, never our child.

    ``poll`` sees the end of the process (its status cannot be known: the
    worker's ``completed`` message and heartbeats tell the driver how it
    ended), once its ``relay`` (:class:`~cloud_elastic.driver.restart.relay.OutputRelay`,
    its output to this driver's) has read the output it wrote before its end, or
    for :data:`~cloud_elastic.driver.restart.relay.DRAIN_S` at most;
    ``kill``/``terminate`` signal its whole process group, and only while the
    pid is still the same process.
    """

    def __init__(self, spec: WorkerSpec, pid: int, start: int | None, relay: Any = None) -> None:
        self.spec = spec
        self.pid = pid
        self._start = start
        self._status: ExitStatus | None = None
        self._lock = threading.Lock()
        self._relay = relay
        self._ended_at: float | None = None

    def handle(self) -> dict[str, Any]:
        return {"kind": "local", "pid": self.pid, "start": self._start}

    def _running(self) -> bool:
        started = process_start_time(self.pid)
        return started is not None and (self._start is None or started == self._start)

    def poll(self) -> ExitStatus | None:
        if self._relay is not None and not self._relay.started:
            self._relay.start()  # once adopted (polled): not for a worker of the predecessor only being stopped
        if self._status is None and not self._running():
            if self._relay is not None:
                if self._ended_at is None:
                    self._ended_at = time.monotonic()
                if not self._relay.drained(self._ended_at):
                    return None  # its last lines come before the job hears of its end
            # Not our child: its exit code went to whoever reaped it.
            self._status = ExitStatus(1, known=False)
        return self._status

    def terminate(self, grace_s: float = 5.0) -> None:
        with self._lock:
            if not self._running():
                return
            kill_group(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self._running() and time.monotonic() < deadline:
                time.sleep(0.05)
            # Whatever it left in its group goes too (the kernel keeps a live group's id from being reused).
            kill_group(self.pid, signal.SIGKILL)
        if self._relay is not None:
            self._relay.close()

    def kill(self) -> None:
        if self._running():
            kill_group(self.pid, signal.SIGKILL)


class SuccessorRecord:
    """Keeps this driver's own adoption record up to date, for a driver of the job restarted after it.

    Written again only when what it says changed (the workers' sequence numbers or who runs);
    a record that cannot be written is logged and tried again at the next change.
    """

    def __init__(self, job_id: str, checkpoint_dir: str, grace_s: float) -> None:
        self.job_id = job_id
        self._checkpoint_dir = location(checkpoint_dir)
        self._grace_s = grace_s
        self._saved: Any = None

    def update(self, *, advertised: str, bind: str, control_port: int, store_port: int, seq: int,
               workers: list[tuple[str, str, int, int, Any]], exited: Sequence[Mapping[str, Any]] = ()) -> None:
        """Record the endpoints, the live ``workers``: (id, host, slot, seq, ``handle()`` of its process), and the
        exit reports of the members of the finishing round that ``exited`` (``Adoption.exits``): the first
        :data:`_MAX_EXITED`, as many as :func:`read_record` reads (a rank beyond them has an unknown exit code)."""
        exited = list(exited)[:_MAX_EXITED]
        key = (seq, tuple(w[0] for w in workers), json.dumps(exited, sort_keys=True))
        if key == self._saved:
            return
        from cloud_elastic.errors import ConfigError
        from cloud_elastic.records import job_dir

        record = {"job": self.job_id, "checkpoint_dir": self._checkpoint_dir, "advertised": advertised, "bind": bind,
                  "control_port": control_port, "store_port": store_port, "grace_s": self._grace_s, "seq": seq,
                  "workers": [{"id": wid, "host": host, "slot": slot, "seq": wseq, "handle": handle()}
                              for wid, host, slot, wseq, handle in workers], "exited": exited}
        try:
            write_record(job_dir(self.job_id), record)
        except (OSError, ConfigError) as exc:
            log.warning("job %s: cannot keep the adoption record: %s", self.job_id, exc)
        self._saved = key
