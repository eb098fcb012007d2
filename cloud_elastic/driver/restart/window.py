"""A restarted driver adopting its dead predecessor's running workers: the runtime side.

Within the dead predecessor's ``--driver-grace`` the driver (an
:class:`AdoptingMixin`) finds the predecessor's private adoption record
(:mod:`.adoption`) by the checkpoint URL, rebinds its control and store ports
with its secret before anything slow happens, and lets its workers re-register
(``adopt``). It decides:

* whether to adopt at all: a live predecessor is refused elsewhere
  (:mod:`.restart`), and workers with less than a second of grace left are not
  worth the race;
* what a message gets while the window is open: a worker not adopted yet is
  told to re-register; a rendezvous, completion, notice or checkpoint report is
  held (never waited for: the server has one thread) until the window closes;
* when the window closes: once every recorded worker is back, or two heartbeat
  timeouts after the driver started (never less than one heartbeat timeout
  after it is ready); the workers that did not come back are stopped and count
  as lost (:mod:`.takeover` decides what the job makes of that);
* the handles on the adopted processes (by pid locally, through the remote
  wrapper over SSH), and keeping our own adoption record up to date for a
  successor.

A mixin, not a piece of its own: the window rebinds the driver's server and
store and swaps its secret, which the driver's other parts share.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.runtime.discovery import DiscoveryPoller
from cloud_elastic.driver.runtime.control_plane import RENDEZVOUS_POLL_S
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.launch.api import WorkerProcess, WorkerSpec
from cloud_elastic.driver.restart.predecessor import driver_alive
from cloud_elastic.driver.net.control_server import Held
from cloud_elastic.errors import ConfigError, ControlPlaneError, LaunchError
from cloud_elastic.protocol import AdoptRequest, PollReply, PollRequest, ReRegister, WaitReply

__all__ = ["AdoptingMixin"]

log = logging.getLogger(__name__)

#: Adopting workers that have less than this left of their grace is not worth the race.
_ADOPT_MARGIN_S = 1.0


class AdoptingMixin:
    """The adoption window of a restarted driver (see module docstring)."""

    def _listen_for_adoption(self) -> None:
        """With ``--checkpoint-dir``: if a driver of this job died here within its workers' grace, listen
        at once where it listened, with its secret, so that its workers re-register while this driver
        opens the checkpoint storage (seconds: that imports torch).

        Found by the checkpoint URL in this user's private driver records; the
        job id is confirmed against the storage's job record afterwards.
        """
        if self.config.checkpoint_dir is None:
            return
        from cloud_elastic.driver.restart.record import find_records
        from cloud_elastic.records import runtime_root

        for record, pid, last_alive in find_records(runtime_root(), self.config.checkpoint_dir):
            if driver_alive(pid) or not record.workers:
                continue  # a live driver is refused by _open_durable
            left = last_alive + record.grace_s - time.time()
            if left < _ADOPT_MARGIN_S:
                log.info("job %s: the previous driver died %.0fs ago, past its workers' --driver-grace %gs: "
                         "not adopting them", record.job_id, time.time() - last_alive, record.grace_s)
                return
            break
        else:
            return
        self._adoption, self._previous = record, (pid, last_alive)
        self._secret = record.secret
        self._set_job_id(record.job_id)
        self._advertised, self._bind = record.advertised, record.bind
        # The window opens before the server answers anyone: a worker that reaches this driver the
        # moment it listens would otherwise be refused as if it came too late, and exit.
        with self._cond:
            self._job.begin_adoption(record.seq)
            self._adopting = True
        try:
            self._start_store(record.bind, record.store_port)
            self._serve(record.bind, record.control_port)
        except OSError as exc:
            log.warning("job %s: cannot listen at the previous driver's address (%s); its workers cannot be "
                        "adopted", self.job_id, exc)
            self._abandon_adoption()
            return
        log.warning("job %s: the previous driver (pid %d) died %.0fs ago; adopting its %d running worker(s) "
                    "(they train on for up to %.0fs more) at %s (control port %d, store port %d)", self.job_id,
                    pid, time.time() - last_alive, len(record.workers), left, self._advertised, self._server.port,
                    self._store_port)

    def _abandon_adoption(self) -> None:
        """Back to a plain restart: stop listening at the predecessor's ports, forget its secret."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._store is not None:
            self._store.close()
            self._store = None
        with self._cond:
            self._adoption, self._adopting = None, False
            self._job.adopting = False
        self._secret = new_secret()
        self._codec = Codec(self._secret, self.job_id)

    def _start_adopting(self) -> None:
        """Let the predecessor's workers re-register (they may have begun already), then carry on with them.

        Workers that do not come back within the adoption window are stopped and
        count as lost (the job's failure path: a new round, survivors roll back).
        When none comes back, this is the plain resume: wait out the grace, then
        resume from the latest checkpoint.
        """
        record = self._adoption
        assert self._server is not None
        self._record_for_status()
        log.info("job %s: driver at %s (control port %d, store port %d) again", self.job_id, self._advertised,
                 self._server.port, self._store_port)
        first = self._first_discovery()  # the workers re-register meanwhile, on the server's threads
        window = max(2 * self.config.heartbeat_timeout_s, 3.0)
        # Counted from the start, as the workers re-register while this driver imports torch and opens
        # the storage; but never closed less than a heartbeat timeout after this driver is ready, so a
        # slow start on a loaded machine does not leave a worker that is on its way no time.
        deadline = max(self._started_at + window, self._clock() + self.config.heartbeat_timeout_s)
        expected = {w.worker_id for w in record.workers}
        with self._cond:
            self._cond.wait_for(lambda: self._stop_reason is not None or expected <= set(self._job.workers),
                                max(0.0, deadline - self._clock()))
            missing = [w for w in record.workers if w.worker_id not in self._job.workers]
            waited = self._clock() - self._started_at
            self._job.end_adoption(self._clock(), {w.worker_id: f"did not re-register within {waited:.0f}s"
                                                   for w in missing})
            adopted = [w for w in record.workers if w.worker_id in self._job.workers]
        if adopted:
            self._predecessor_gone = True  # the missing ones are being stopped below, and joined at shutdown
            log.warning("job %s: adopted %d running worker(s) %.2fs after the driver started", self.job_id,
                        len(adopted), self._adopted_at - self._started_at)
        for w in missing:  # they may be stopped or hung: none must outlive the job
            proc = self._adopted_process(w)
            if proc is not None:
                t = threading.Thread(target=proc.terminate, args=(self.config.terminate_grace_s,), daemon=True)
                t.start()
                self._stoppers.append(t)
        for w in adopted:
            proc = self._adopted_process(w)
            if proc is not None:
                self._procs[w.worker_id] = proc
        if first is not None and not adopted:
            log.warning("job %s: no worker of the previous driver came back; resuming as without them",
                        self.job_id)
            self._wait_for_previous_driver()
        with self._cond:
            if first is not None:
                self._job.discovered(first, self._clock())
            self._adopting = False
            self._cond.notify_all()
        if first is not None:
            self._poller = DiscoveryPoller(self._discovery, self._on_discovery,
                                           interval_s=self.config.discovery_interval_s)
            self._poller.start()

    def _adopted_process(self, worker: Any) -> WorkerProcess | None:
        """A handle on a worker the predecessor started: by pid locally, through its remote wrapper over SSH."""
        from cloud_elastic.driver.restart.record import AdoptedLocalProcess

        env = {}
        for item in self.config.forward_env:  # what the worker's launch forwarded (PYTHONPATH, say)
            name, sep, value = item.partition("=")
            if sep:
                env[name] = value
            elif name in os.environ:
                env[name] = os.environ[name]
        spec = WorkerSpec(worker.worker_id, worker.host, worker.slot, self.config.command, env, self._secret,
                          self.config.cwd)
        handle = worker.handle
        try:
            if handle.get("kind") == "local":
                start = handle.get("start")
                return AdoptedLocalProcess(spec, int(handle["pid"]), int(start) if start is not None else None)
            if handle.get("kind") == "ssh":
                launcher = self._launcher_for(worker.host)
                attach = getattr(launcher, "attach", None)
                if attach is not None:
                    return attach(spec, str(handle["nonce"]),
                                  lambda line, wid=worker.worker_id: self._forward(wid, line))
        except (KeyError, TypeError, ValueError, LaunchError) as exc:
            log.warning("job %s: cannot reach worker %s of the previous driver: %s", self.job_id, worker.worker_id, exc)
        return None

    def _while_adopting(self, kind: str, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held | None:
        """What a restarted driver answers before the job's rules see a message (None: let them).

        A worker of the predecessor not adopted yet is told to re-register;
        while the window is open, messages that would move the job (rendezvous,
        completion, notices) wait until it has closed and discovery has answered.
        """
        if kind == "adopt":
            return self._adopt_worker(worker_id, msg)
        if kind == "status" and self._sinks is None:
            raise ControlPlaneError("the driver is starting; ask again")
        if kind == "status":
            return None
        if kind == "poll" and self._sinks is None and worker_id in self._job.workers:
            # Before run() has opened the metrics: a plain heartbeat, no long-poll.
            request = PollRequest.from_wire(msg)
            reply = self._job.heartbeat(worker_id, self._clock(), request.commits, request.commit_seq)
            return (reply or PollReply(0, 0, 0, True)).to_wire()
        if worker_id not in self._job.workers and self._adoption.worker(worker_id) is not None:
            if kind == "poll":
                return PollReply(0, 0, 0, False, reregister=True).to_wire()
            if kind == "rendezvous":
                return ReRegister().to_wire()
        if self._adopting and kind in ("rendezvous", "completed", "notice", "checkpoint"):
            # Held, not waited for: the control-plane server answers every connection from one thread.
            def check(final: bool) -> dict[str, Any] | None:
                if self._adopting and not final:
                    return None
                if kind == "rendezvous":
                    return WaitReply().to_wire()  # it asks again, and is then served as usual
                reply = self._handle(kind, msg, adoption_checked=True)
                if isinstance(reply, dict):
                    return reply
                # The rules would hold it (a completion waiting for rank 0's): this hold answers now
                # instead, and the worker asks again (a hold of a hold has no connection to answer).
                self._cond.drop(reply)
                return WaitReply().to_wire()

            return self._cond.hold(check, RENDEZVOUS_POLL_S if kind == "rendezvous" else 60.0)
        return None

    def _adopt_worker(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        request = AdoptRequest.from_wire(msg)
        entry = self._adoption.worker(worker_id)
        if entry is None or entry.slot != request.slot:
            why = "not a worker of this job's previous driver"
        else:
            why = self._job.adopt(worker_id, Slot(entry.host, entry.slot), entry.seq, request, self._clock())
        if why is not None:
            log.warning("job %s: refused to adopt worker %s: %s", self.job_id, worker_id, why)
            return {"ok": False, "reason": why}
        self._adopted_at = self._clock()
        self._cond.notify_all()
        return {"ok": True}

    def _keep_adoption_record(self) -> None:
        """Keep what a restarted driver needs to adopt our workers (see :mod:`.adoption`) up to date."""
        if not self._status_recorded or self._server is None or self.config.checkpoint_dir is None:
            return  # without --checkpoint-dir a restarted driver cannot find this job again
        with self._cond:
            workers = []
            for worker_id, proc in self._procs.items():
                w = self._job.workers.get(worker_id)
                handle = getattr(proc, "handle", None)
                if w is not None and w.alive and handle is not None:
                    workers.append((worker_id, w.slot.host, w.slot.index, w.seq, handle))
            seq = max((w.seq for w in self._job.workers.values()), default=0)
        key = (seq, tuple(w[0] for w in workers))
        if key == self._adopt_saved:
            return
        from cloud_elastic.driver.restart.record import write_record
        from cloud_elastic.records import job_dir

        grace = max(self.config.driver_grace_s, self._adoption.grace_s if self._adoption is not None else 0.0)
        record = {"job": self.job_id, "checkpoint_dir": self.config.checkpoint_dir, "advertised": self._advertised,
                  "bind": self._bind, "control_port": self._server.port, "store_port": self._store_port,
                  "grace_s": grace, "seq": seq,
                  "workers": [{"id": wid, "host": host, "slot": slot, "seq": wseq, "handle": handle()}
                              for wid, host, slot, wseq, handle in workers]}
        try:
            write_record(job_dir(self.job_id), record)
            self._adopt_saved = key
        except (OSError, ConfigError) as exc:
            log.warning("job %s: cannot keep the adoption record: %s", self.job_id, exc)
            self._adopt_saved = key
