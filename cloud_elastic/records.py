"""Records of the jobs running on this machine: where they live, and how a driver writes and removes its own.

Each running driver leaves a record in a per-user runtime directory::

    $XDG_RUNTIME_DIR/cloud-elastic/        (else ~/.cloud-elastic/jobs/)   mode 0700
        <job>/                                                              mode 0700
            driver.json   {"v": 1, "job", "address", "pid", "started", "command"}   mode 0600
            secret        the job's control-plane secret                            mode 0600

The driver calls :func:`write_driver_record` once its control server listens and
:func:`remove_driver_record` when it ends; a restarted driver reads the directory to find its
predecessor (:mod:`cloud_elastic.driver.restart`). ``cloud-elastic status`` (:mod:`cloud_elastic.status`)
lists the records and asks their drivers. The directories keep every other user out, so only the
user who started a job can read its secret and sign messages to its driver.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cloud_elastic.errors import ConfigError

__all__ = [
    "RECORD_VERSION",
    "JobRecord",
    "job_dir",
    "list_jobs",
    "pid_alive",
    "read_record",
    "remove_driver_record",
    "runtime_root",
    "write_driver_record",
]

RECORD_VERSION = 1


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
    """Whether a process ``pid`` exists (one of another user's counts). A pid read from storage may be
    anything: 0 and negative numbers name process groups or every process, never one process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_record(directory: Path) -> JobRecord:
    """The driver record in ``directory``; ConfigError (one line) when it is missing or unreadable."""
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
            jobs.append(read_record(entry))
        except ConfigError:
            continue
    return sorted(jobs, key=lambda j: j.started)
