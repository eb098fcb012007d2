"""``cloud-elastic status``: find the jobs running on this machine and ask a driver how its job is doing.

Each running driver leaves a record in a per-user runtime directory::

    $XDG_RUNTIME_DIR/cloud-elastic/        (else ~/.cloud-elastic/jobs/)   mode 0700
        <job>/                                                              mode 0700
            driver.json   {"v": 1, "job", "address", "pid", "started", "command"}   mode 0600
            secret        the job's control-plane secret                            mode 0600

The status request is a signed control-plane message (kind ``status``, see
:mod:`cloud_elastic.control`) sent to ``address``; the driver answers with a
signed :class:`StatusReply`. Only a user who can read ``secret`` can sign
the request, and the directories keep everyone else out, so no other user of
the machine can read a job's status (nor forge messages to its driver).

The driver side: call :func:`write_driver_record` once its control server
listens, :func:`remove_driver_record` when it ends, and answer ``status`` with
``StatusReply(...).to_json()``.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from cloud_elastic.errors import CloudElasticError, ConfigError, ControlPlaneError

__all__ = [
    "RECORD_VERSION",
    "runtime_root",
    "job_dir",
    "write_driver_record",
    "remove_driver_record",
    "JobRecord",
    "list_jobs",
    "WorkerStatus",
    "HostStatus",
    "BlacklistedSlot",
    "PendingNotice",
    "StatusReply",
    "query_status",
    "render_status",
    "render_job_list",
]

RECORD_VERSION = 1
#: The worker id the status client signs its requests with (the driver's reply is addressed to it).
CLIENT_ID = "cli:status"


def runtime_root() -> Path:
    """This user's directory of job records: ``$XDG_RUNTIME_DIR/cloud-elastic`` when that
    variable names a directory, else ``~/.cloud-elastic/jobs``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "cloud-elastic"
    return Path.home() / ".cloud-elastic" / "jobs"


def job_dir(job_id: str, root: Path | None = None) -> Path:
    """Where the record of ``job_id`` lives (not created). ConfigError for an id that is not a plain name."""
    if not job_id or job_id in (".", "..") or "/" in job_id or "\0" in job_id:
        raise ConfigError(f"invalid job id {job_id!r}")
    return (root or runtime_root()) / job_id


def _private_dir(path: Path) -> None:
    """Create ``path`` (and parents) as 0700 and make sure it is ours, a real directory and private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{path} is not a directory owned by this user; refusing to keep job secrets there")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _write_private(path: Path, data: str) -> None:
    """Write ``data`` to ``path`` as 0600, atomically (a reader never sees half a file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_driver_record(job_id: str, address: str, secret: str, *, pid: int | None = None,
                        command: Sequence[str] = (), root: Path | None = None) -> Path:
    """Record a running driver so ``cloud-elastic status`` can find it; return the job's directory.

    ``address`` is the control plane's ``host:port`` as reachable from this
    machine. The secret goes to its own 0600 file, never into driver.json.
    """
    root = root or runtime_root()
    directory = job_dir(job_id, root)
    _private_dir(root)
    _private_dir(directory)
    _write_private(directory / "secret", secret)
    record = {"v": RECORD_VERSION, "job": job_id, "address": address, "pid": pid or os.getpid(),
              "started": time.time(), "command": list(command)}
    _write_private(directory / "driver.json", json.dumps(record) + "\n")
    return directory


def remove_driver_record(job_id: str, root: Path | None = None) -> None:
    """Remove a job's record (the driver calls this when it ends). Missing files are fine."""
    directory = job_dir(job_id, root)
    for name in ("driver.json", "secret"):
        try:
            (directory / name).unlink()
        except FileNotFoundError:
            pass
    try:
        directory.rmdir()
    except OSError:
        pass


@dataclass(frozen=True)
class JobRecord:
    """A driver record found on this machine."""

    job_id: str
    address: str
    pid: int
    started: float
    command: tuple[str, ...]
    #: False when the driver's process is gone (it was killed before it could remove its record).
    alive: bool


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_record(directory: Path) -> JobRecord:
    path = directory / "driver.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("v") != RECORD_VERSION:
            raise ValueError(f"record version {raw.get('v')!r}")
        return JobRecord(str(raw["job"]), str(raw["address"]), int(raw["pid"]), float(raw["started"]),
                         tuple(str(c) for c in raw.get("command", ())), pid_alive(int(raw["pid"])))
    except FileNotFoundError:
        raise ConfigError(f"no job {directory.name} on this machine (see 'cloud-elastic status')") from None
    except PermissionError:
        raise ConfigError(f"cannot read {path}: permission denied (the job belongs to another user)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"unreadable job record {path}: {exc}") from None


def list_jobs(root: Path | None = None) -> list[JobRecord]:
    """Every job record of this user, oldest first; unreadable entries are skipped."""
    root = root or runtime_root()
    try:
        entries = sorted(p for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
    except PermissionError:
        raise ConfigError(f"cannot read {root}: permission denied") from None
    jobs = []
    for entry in entries:
        try:
            jobs.append(_read_record(entry))
        except ConfigError:
            continue
    return sorted(jobs, key=lambda j: j.started)


# ---------------------------------------------------------------------------- the reply


@dataclass(frozen=True)
class WorkerStatus:
    """One worker on a host slot."""

    slot: int
    worker: str
    #: e.g. "starting", "ready", "training", "leaving".
    state: str
    rank: int | None = None
    #: Its compute time per optimizer step (the time outside waiting on peers), when known.
    compute_s: float | None = None


@dataclass(frozen=True)
class HostStatus:
    """One discovered host and its workers."""

    host: str
    slots: int
    #: "ready", "draining" or "missing" (gone from discovery, within --host-missing-grace).
    state: str
    workers: tuple[WorkerStatus, ...] = ()


@dataclass(frozen=True)
class BlacklistedSlot:
    """A slot (or a whole host, ``slot`` None) blocked after failures."""

    host: str
    slot: int | None
    seconds_left: float
    failures: int


@dataclass(frozen=True)
class PendingNotice:
    """A termination or maintenance notice not yet acted on to the end."""

    host: str
    source: str
    deadline: float | None


@dataclass(frozen=True)
class StatusReply:
    """What a driver answers to a ``status`` request (its fields go on the wire as JSON)."""

    job: str
    #: e.g. "starting", "waiting for slots", "training", "below --min-np", "finishing".
    phase: str
    round: int
    world_size: int
    num_proc: int
    min_np: int
    max_np: int
    uptime_s: float
    resets: int
    commit_step: int | None = None
    steps_per_s: float | None = None
    hosts: tuple[HostStatus, ...] = ()
    blacklisted: tuple[BlacklistedSlot, ...] = ()
    notices: tuple[PendingNotice, ...] = ()
    provider: str = ""
    #: The median of the round's members' compute times per step (what a straggler is measured against).
    median_compute_s: float | None = None
    #: ``--whole-hosts``: the slots a host joins and leaves with (0: off).
    whole_host_slots: int = 0

    def to_json(self) -> dict[str, Any]:
        """The reply's JSON form (what the driver returns from its handler)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StatusReply":
        """Parse a reply; ControlPlaneError naming what is wrong with a malformed one."""
        try:
            hosts = tuple(
                HostStatus(str(h["host"]), int(h["slots"]), str(h["state"]), tuple(
                    WorkerStatus(int(w["slot"]), str(w["worker"]), str(w["state"]),
                                 None if w.get("rank") is None else int(w["rank"]),
                                 None if w.get("compute_s") is None else float(w["compute_s"]))
                    for w in h.get("workers", ())))
                for h in data.get("hosts", ()))
            blacklisted = tuple(
                BlacklistedSlot(str(b["host"]), None if b.get("slot") is None else int(b["slot"]),
                                float(b["seconds_left"]), int(b["failures"]))
                for b in data.get("blacklisted", ()))
            notices = tuple(
                PendingNotice(str(n["host"]), str(n["source"]),
                              None if n.get("deadline") is None else float(n["deadline"]))
                for n in data.get("notices", ()))
            return cls(
                job=str(data["job"]), phase=str(data["phase"]), round=int(data["round"]),
                world_size=int(data["world_size"]), num_proc=int(data["num_proc"]), min_np=int(data["min_np"]),
                max_np=int(data["max_np"]), uptime_s=float(data["uptime_s"]), resets=int(data["resets"]),
                commit_step=None if data.get("commit_step") is None else int(data["commit_step"]),
                steps_per_s=None if data.get("steps_per_s") is None else float(data["steps_per_s"]),
                hosts=hosts, blacklisted=blacklisted, notices=notices, provider=str(data.get("provider", "")),
                median_compute_s=None if data.get("median_compute_s") is None else float(data["median_compute_s"]),
                whole_host_slots=int(data.get("whole_host_slots", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlPlaneError(f"malformed status reply: {type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------------------- the client


def _call_driver(job_id: str, kind: str, payload: dict[str, Any] | None, *, root: Path | None,
                 timeout_s: float) -> dict[str, Any]:
    """One signed request to ``job_id``'s driver (with the job's secret, readable by its user alone)."""
    from cloud_elastic.control import Codec
    from cloud_elastic.worker.link.client import DriverClient

    directory = job_dir(job_id, root)
    record = _read_record(directory)
    try:
        secret = (directory / "secret").read_text(encoding="utf-8").strip()
    except PermissionError:
        raise ConfigError(f"cannot read {directory / 'secret'}: permission denied") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the secret of job {job_id}: {exc.strerror or exc}") from None
    client = DriverClient(record.address, Codec(secret, job_id), CLIENT_ID)
    try:
        reply = client.call(kind, payload, timeout_s=timeout_s)
    except ControlPlaneError as exc:
        raise ControlPlaneError(f"job {job_id}: {exc}") from None
    except OSError as exc:
        gone = "" if record.alive else f" (its process {record.pid} is gone)"
        raise CloudElasticError(
            f"job {job_id}: the driver at {record.address} does not answer: {exc.strerror or exc}{gone}"
        ) from None
    finally:
        client.close()
    return {k: v for k, v in reply.items() if k not in ("v", "kind", "ts", "nonce", "re", "to")}


def query_status(job_id: str, *, root: Path | None = None, timeout_s: float = 5.0) -> StatusReply:
    """Ask ``job_id``'s driver for its status over the signed control plane.

    ConfigError when there is no such job or its record cannot be read;
    CloudElasticError (one line) when the driver is gone, refuses the
    request or answers something that fails verification.
    """
    status = StatusReply.from_json(_call_driver(job_id, "status", None, root=root, timeout_s=timeout_s))
    if status.job != job_id:
        raise ControlPlaneError(f"job {job_id}: the driver answered for job {status.job}")
    return status


def request_drain(job_id: str, host: str, slot: int | None = None, *, root: Path | None = None,
                  timeout_s: float = 5.0) -> str:
    """Ask ``job_id``'s driver to drain ``host`` (or one of its slots): its workers leave at their next commit.

    Returns the driver's one-line answer. Errors as for :func:`query_status`;
    CloudElasticError with the driver's reason when it refuses (no such host, say).
    """
    reply = _call_driver(job_id, "drain", {"host": host, "slot": slot}, root=root, timeout_s=timeout_s)
    message = str(reply.get("message") or "")[:500]
    if reply.get("ok") is not True:
        raise CloudElasticError(f"job {job_id}: the driver refused to drain {host}"
                                f"{'' if slot is None else f'[{slot}]'}: {message or 'no reason given'}")
    return message


# ---------------------------------------------------------------------------- rendering


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def render_job_list(jobs: Sequence[JobRecord], *, now: float | None = None) -> str:
    """The job table ``cloud-elastic status`` prints without a job id."""
    if not jobs:
        return "no cloud-elastic jobs running for this user on this machine\n"
    now = time.time() if now is None else now
    rows = [("JOB", "DRIVER", "PID", "UP", "COMMAND")]
    for job in jobs:
        pid = str(job.pid) if job.alive else f"{job.pid} (gone)"
        rows.append((job.job_id, job.address, pid, _duration(now - job.started), " ".join(job.command)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_status(reply: StatusReply, *, now: float | None = None) -> str:
    """The text ``cloud-elastic status JOB`` prints."""
    now = time.time() if now is None else now
    rate = f"{reply.steps_per_s:.2f}" if reply.steps_per_s is not None else "-"
    commit = str(reply.commit_step) if reply.commit_step is not None else "-"
    out = [
        f"job {reply.job}: {reply.phase}, up {_duration(reply.uptime_s)}"
        + (f", provider {reply.provider}" if reply.provider else ""),
        f"round {reply.round}, world size {reply.world_size} "
        f"(-np {reply.num_proc}, --min-np {reply.min_np}, --max-np {reply.max_np}"
        + (f", whole hosts of {reply.whole_host_slots} slot(s)" if reply.whole_host_slots else "") + ")",
        f"steps/s {rate}, last commit step {commit}, resets {reply.resets}"
        + (f", median compute {reply.median_compute_s * 1e3:.1f} ms/step" if reply.median_compute_s is not None
           else ""),
        "",
    ]
    rows = [("HOST", "SLOTS", "STATE", "WORKERS")]
    for host in reply.hosts:
        workers = ", ".join(
            f"[{w.slot}] " + (f"rank {w.rank} " if w.rank is not None else "") + w.state
            + (f" {w.compute_s * 1e3:.1f} ms/step" if w.compute_s is not None else "") for w in host.workers
        ) or "-"
        rows.append((host.host, str(host.slots), host.state, workers))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    out += ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3] for row in rows]
    if reply.blacklisted:
        out.append("")
        out.append("blacklisted:")
        for b in reply.blacklisted:
            where = f"{b.host}[{b.slot}]" if b.slot is not None else f"{b.host} (whole host)"
            failures = f"{b.failures} failure" + ("s" if b.failures != 1 else "")
            out.append(f"  {where} for {_duration(b.seconds_left)} more ({failures})")
    if reply.notices:
        out.append("")
        out.append("pending notices:")
        for n in reply.notices:
            when = f"deadline in {_duration(n.deadline - now)}" if n.deadline is not None else "no deadline given"
            out.append(f"  {n.host}: {n.source}, {when}")
    return "\n".join(out) + "\n"
