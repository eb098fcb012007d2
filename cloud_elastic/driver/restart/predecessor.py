"""A driver restarted for a job that has a durable record: who the job is, and whether to wait.

With ``--checkpoint-dir`` the driver is a :class:`RestartMixin`: it opens the
checkpoint store and adopts or writes its ``job.json`` (job id and command,
never the secret), so that running the same command again after a driver
crash keeps the job id and resumes from the latest checkpoint
(``ElasticJob(resumed=True)``). It decides:

* whether this is a restart (the store holds a record of the job) and whether
  its first round loads a checkpoint (the store holds one of this job);
* that the same job is not already running (a live driver pid on this
  machine, or a sign of life beside the checkpoints refreshed after ours was
  read): ConfigError before anything starts, or a stop with exit code 2;
* how long to wait before starting new workers when a dead predecessor's
  workers may still train for its ``--driver-grace`` (and write a last
  checkpoint), so that two generations never train the same job;
* to keep this driver's own sign of life fresh beside the checkpoints.

A mixin, not a piece of its own: it reads and writes the driver's job, lock,
codec and adoption state, which the driver's other parts share (see
``docs/architecture.md``, "The driver").
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from cloud_elastic.control import Codec
from cloud_elastic.errors import CheckpointError, ConfigError
from cloud_elastic.records import pid_alive

__all__ = ["RestartMixin", "RECORD_TOUCH_S", "driver_alive"]

log = logging.getLogger(__name__)

#: How often the loop refreshes the status record's mtime (a restarted driver's measure of when we died).
RECORD_TOUCH_S = 2.0
#: What a worker stopping at the end of the grace may spend finishing rank 0's last checkpoint, and margin.
_LAST_CHECKPOINT_S = 12.0


class RestartMixin:
    """The durable record of a job and the wait for a dead predecessor's workers (see module docstring)."""

    def _open_durable(self) -> None:
        """With ``--checkpoint-dir``: open the store, adopt the job identity recorded there, or record ours.

        A store that already holds a checkpoint of this job makes this a
        restarted driver: the job keeps its id and its first round loads the
        latest checkpoint. Raises ConfigError (a missing fsspec backend, the
        same job already running here) or CheckpointError (unreadable storage)
        before anything starts.
        """
        if self.config.checkpoint_dir is None:
            return
        from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, read_job_record, write_job_record

        store = CheckpointStore(self.config.checkpoint_dir, keep=self.config.checkpoint_keep)
        self._durable_store = store
        record = read_job_record(store)
        if record is None:
            write_job_record(store, DurableJobRecord(self.job_id, tuple(self.config.command), time.time(),
                                                     extra={"driver_grace_s": self.config.driver_grace_s}))
            log.info("job %s: checkpoints go to %s", self.job_id, store.url)
            return
        if record.command != tuple(self.config.command):
            log.warning("job %s was started with the command %s; resuming it with %s",
                        record.job_id, " ".join(record.command), " ".join(self.config.command))
        if self._adoption is not None and self._adoption.job_id != record.job_id:
            log.warning("job %s: %s belongs to job %s; not adopting the workers of job %s", self.job_id, store.url,
                        record.job_id, self._adoption.job_id)
            self._abandon_adoption()
        self._set_job_id(record.job_id)
        recorded_grace = record.extra.get("driver_grace_s")
        if isinstance(recorded_grace, (int, float)) and not isinstance(recorded_grace, bool):
            self._previous_grace_s = float(recorded_grace)
        if self._adoption is None:
            self._previous = _previous_driver(record.job_id)
        if self._previous is not None and driver_alive(self._previous[0]):
            raise ConfigError(f"job {self.job_id} is already running here (driver pid {self._previous[0]}); "
                              "stop it first or use another --checkpoint-dir")
        self._previous_alive = _previous_alive(store, record.job_id)
        self._predecessor_gone = self._adoption is None and self._previous is None and self._previous_alive is None
        self._resume_from_checkpoints(announce_none=True)

    def _resume_from_checkpoints(self, *, announce_none: bool) -> None:
        """When the store holds a checkpoint of this job, the first round resumes from the newest one.

        Called when the store is opened and again after waiting out a dead
        predecessor's workers: they write their last checkpoints while we wait.
        """
        if self._durable_store is None or self._job.resumed:
            return
        store = self._durable_store
        checkpoints = store.list()
        if not checkpoints:
            if announce_none:
                log.info("job %s: resuming the job recorded in %s; it has no checkpoint yet, so training starts "
                         "over unless its workers still write one", self.job_id, store.url)
            else:
                log.info("job %s: the previous workers wrote no checkpoint to %s; training starts over",
                         self.job_id, store.url)
            return
        newest = checkpoints[0]
        log.warning("job %s: resuming from %s: the latest checkpoint is of step %d, written %s ago",
                    self.job_id, store.url, newest.step, _age(time.time() - newest.created))
        with self._cond:
            self._job.resumed = True
            self._job.state_committed = True

    def _set_job_id(self, job_id: str) -> None:
        self.job_id = job_id
        self._codec = Codec(self._secret, job_id)
        self._job.job_id = job_id

    def _wait_for_previous_driver(self) -> None:
        """A driver of this job that died without cleaning up may have left workers training on for its
        ``--driver-grace``; wait until they have stopped (and written their last checkpoint).

        Its last sign of life is the later of this machine's private record and
        the entry it refreshed beside the checkpoints (which is all a driver
        restarted on another machine has). Without this wait two generations of
        workers would train the same job and write checkpoints to the same place.
        """
        # The previous workers got the previous driver's grace; the record keeps the first driver's.
        grace = max(self.config.driver_grace_s, self._previous_grace_s)
        lives = []  # (last sign of life + how stale it can be, who)
        if self._previous is not None:
            pid, last_alive = self._previous
            lives.append((last_alive + RECORD_TOUCH_S, f"the previous driver (pid {pid}) died "
                                                        f"{time.time() - last_alive:.0f}s ago"))
        if self._previous_alive is not None:
            from cloud_elastic.checkpoint.alive import ALIVE_RECORD, REFRESH_S

            entry = self._previous_alive
            grace = max(grace, entry.grace_s)
            lives.append((entry.alive + REFRESH_S, (
                f"the previous driver (pid {entry.pid} on {entry.host}) was last alive "
                f"{time.time() - entry.alive:.0f}s ago by {self._durable_store.backend.url(ALIVE_RECORD)}"
                + ("" if self._previous is not None else ", and this machine has no record of it"))))
        if lives:
            last, who = max(lives)
            left = last + grace + _LAST_CHECKPOINT_S - time.time()
            if left > 0:
                log.warning("job %s: %s; its workers train on for up to --driver-grace %gs: waiting %.0fs for them "
                            "to stop before starting new ones", self.job_id, who, grace, left)
                with self._cond:
                    if self._cond.wait_for(lambda: self._stop_reason is not None, left):
                        return  # interrupted: its workers may still run, which our last word must not deny
            self._check_no_other_driver()
            try:
                self._resume_from_checkpoints(announce_none=False)  # what the old workers wrote while we waited
            except CheckpointError as exc:
                self.stop(f"cannot read the checkpoints in {self.config.checkpoint_dir}: {exc}", 1)
        self._predecessor_gone = True

    def _check_no_other_driver(self) -> None:
        """After the wait: a driver elsewhere that refreshed the entry meanwhile is alive; leave the job to it."""
        if self._previous_alive is None or self._stop_reason is not None:
            return
        from cloud_elastic.checkpoint.alive import read_driver_alive

        try:
            now = read_driver_alive(self._durable_store)
        except CheckpointError as exc:
            log.warning("job %s: %s", self.job_id, exc)
            return
        if (now is not None and not now.stopped and now.alive > self._previous_alive.alive
                and not now.is_this_process()):
            self.stop(f"job {self.job_id} is already running: its driver (pid {now.pid} on {now.host}) was alive "
                      f"{max(0.0, time.time() - now.alive):.0f}s ago; stop it first or use another --checkpoint-dir",
                      2)

    def _keep_alive_beside_checkpoints(self) -> None:
        """From now on this driver runs the job: keep its sign of life fresh beside the checkpoints."""
        if self._durable_store is None or self._stop_reason is not None:
            return
        from cloud_elastic.checkpoint.alive import AliveRefresher

        grace = max(self.config.driver_grace_s, self._adoption.grace_s if self._adoption is not None else 0.0)
        self._alive_refresher = AliveRefresher(self._durable_store, self.job_id, grace).start()


def _age(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}min"


def driver_alive(pid: int) -> bool:
    """Whether ``pid`` is a live cloud-elastic process (a pid reused by anything else does not count)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"cloud" in f.read()
    except OSError:  # no /proc (not Linux): trust the pid
        return True


def _previous_alive(store: Any, job_id: str) -> Any:
    """The sign of life a driver of ``job_id`` left beside the checkpoints, unless it ended cleanly.

    ConfigError when it is a live driver on this machine (whose local record was lost).
    """
    from cloud_elastic.checkpoint.alive import read_driver_alive

    try:
        entry = read_driver_alive(store)
    except CheckpointError as exc:
        log.warning("job %s: %s; only this machine's record of the previous driver is used", job_id, exc)
        return None
    if entry is None or entry.job_id != job_id or entry.stopped or entry.is_this_process():
        return None
    if entry.host == socket.gethostname() and driver_alive(entry.pid):
        raise ConfigError(f"job {job_id} is already running here (driver pid {entry.pid}); "
                          "stop it first or use another --checkpoint-dir")
    return entry


def _previous_driver(job_id: str) -> tuple[int, float] | None:
    """(pid, last sign of life as Unix time) of a driver of ``job_id`` that left its status record here."""
    import json

    from cloud_elastic.records import job_dir

    try:
        path = job_dir(job_id) / "driver.json"
        record = json.loads(path.read_text(encoding="utf-8"))
        return int(record["pid"]), path.stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return None
