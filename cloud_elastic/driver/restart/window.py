"""A restarted driver adopting its dead predecessor's running workers: the adoption window.

When :func:`~.predecessor.plan_start` found the predecessor's adoption record (:mod:`.record`), the
driver listens where the predecessor listened, with its secret, and an :class:`AdoptionWindow`
stands in front of the job's rules (an ``Interceptor`` of the control plane,
:class:`~cloud_elastic.driver.runtime.control_plane.ControlPlane`). It decides:

* what a message gets: ``adopt`` re-registers a worker of the predecessor where it stands; a
  predecessor's worker not adopted yet is told to re-register; while the window is open, a
  rendezvous, completion, notice or checkpoint report is held (never waited for: the server has
  one thread) until the window closes;
* when the window closes (:meth:`AdoptionWindow.wait`): once every recorded worker is back, or
  two heartbeat timeouts after the driver started (never less than one heartbeat timeout after
  it is ready); the workers that did not come back are stopped and count as lost (the job's
  side, :mod:`cloud_elastic.driver.job.adoption`, decides what the job makes of that);
* that a SIGTERM the predecessor let an adopted worker stay for (its adopt request says until when)
  drains the worker's host as that notice did, once the window closes (a host watcher's notice
  comes again by itself: the worker's watcher reports it anew, see ``worker.link.driver_link``);
* the handles on the adopted processes (:func:`adopted_process`: by pid locally, through the
  remote wrapper over SSH).

The window is opened (:meth:`AdoptionWindow.open`) before the server answers anyone: a worker
that reaches the driver the moment it listens would otherwise be refused as if it came too late,
and exit.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.launch.api import Launcher, WorkerProcess, WorkerSpec
from cloud_elastic.driver.launch.local import process_start_time
from cloud_elastic.driver.net.control_server import Held
from cloud_elastic.driver.restart.record import (AdoptedLocalProcess, AdoptedWorker, AdoptionRecord, exit_reports,
                                                 recorded_exits)
from cloud_elastic.driver.restart.relay import OutputRelay
from cloud_elastic.driver.restart.remote_reports import fetch_exit_reports
from cloud_elastic.errors import LaunchError
from cloud_elastic.protocol import AdoptRequest, PollReply, ReRegister, WaitReply
from cloud_elastic.protocol_reports import NoticeReport
from cloud_elastic.worker.link.kept_output import output_paths

__all__ = ["AdoptionWindow", "WindowClosed", "adopted_process"]

log = logging.getLogger(__name__)

#: The kinds that would move the job: held while the window is open.
_HELD_KINDS = ("rendezvous", "completed", "notice", "checkpoint")
#: How long a held completion, notice or checkpoint report waits for the window to close.
_HOLD_S = 60.0


@dataclass(frozen=True)
class WindowClosed:
    """What came back when the window closed: the predecessor's workers adopted, and those missing."""

    adopted: tuple[AdoptedWorker, ...]
    missing: tuple[AdoptedWorker, ...]
    adopted_after_s: float  # from the driver's start to the last re-registration


class AdoptionWindow:
    """The adoption window of one restarted driver (see module docstring).

    ``job`` and ``cond`` are the job and its lock; ``rules(kind, msg)`` answers a message by the
    job's rules (for the messages this window held); ``rendezvous_hold_s`` is how long the control
    plane holds a rendezvous request; ``clock`` and ``started_at`` the driver's clock and its start.
    """

    def __init__(self, record: AdoptionRecord, job: Any, cond: Any, *, rules: Callable[[str, dict[str, Any]], Any],
                 clock: Callable[[], float], started_at: float, heartbeat_timeout_s: float,
                 rendezvous_hold_s: float) -> None:
        self.record = record
        self._job = job
        self._cond = cond
        self._rules = rules
        self._clock = clock
        self._started_at = started_at
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._rendezvous_hold_s = rendezvous_hold_s
        self.is_open = False
        self._adopted_at = 0.0  # when the last worker re-registered (clock)
        self._sigterms: list[dict[str, Any]] = []  # their notices, for the rules once the window closes
        self._remote_reports: dict[int, tuple[str, int | None]] = {}  # fetched from SSH hosts (fetch_exit_reports)

    def open(self) -> None:
        """Open the window: the predecessor's workers may re-register from now on."""
        with self._cond:
            self._job.begin_adoption(self.record.seq)
            self.is_open = True

    def give_up(self) -> None:
        """Back to a plain restart (the predecessor's ports could not be bound): no worker is adopted."""
        with self._cond:
            self.is_open = False
            self._job.adopting = False

    def wait(self, stopped: Callable[[], bool]) -> WindowClosed:
        """Wait until every recorded worker is back, the deadline passes or ``stopped()``; then close.

        The deadline counts from the driver's start, as the workers re-register while the driver
        starts; but it is never less than a heartbeat timeout from now, so a slow start on a loaded
        machine does not leave a worker that is on its way no time. A local worker whose process had
        already ended when the wait began (the machine rebooted, the worker died with its driver) is not
        waited for: it cannot come back.
        """
        window = max(2 * self._heartbeat_timeout_s, 3.0)
        deadline = max(self._started_at + window, self._clock() + self._heartbeat_timeout_s)
        ended = ended_locally(self.record.workers)
        expected = {w.worker_id for w in self.record.workers} - ended.keys()
        with self._cond:
            self._cond.wait_for(lambda: stopped() or expected <= set(self._job.workers),
                                max(0.0, deadline - self._clock()))
            missing = tuple(w for w in self.record.workers if w.worker_id not in self._job.workers)
            waited = self._clock() - self._started_at
            self._job.end_adoption(self._clock(), {
                w.worker_id: f"its process (pid {ended[w.worker_id]}) had ended when the window's wait began"
                if w.worker_id in ended else f"did not re-register within {waited:.0f}s" for w in missing})
            adopted = tuple(w for w in self.record.workers if w.worker_id in self._job.workers)
        return WindowClosed(adopted, missing, self._adopted_at - self._started_at)

    def fetch_exit_reports(self, missing: tuple[AdoptedWorker, ...], launcher_for: Callable[[str], Launcher],
                           spec_for: Callable[[AdoptedWorker], WorkerSpec], connect_timeout_s: float) -> None:
        """After :meth:`wait`, without the job's lock: when the adopted workers' training was over, fetch the exit
        reports the ``missing`` SSH workers left on their hosts (:mod:`.remote_reports`; bounded by the ssh connect
        timeout), for :meth:`close`. Nothing to fetch otherwise."""
        with self._cond:
            finishing, round_ = self._job.adoption.finishing, self._job.round
        if finishing and missing:
            self._remote_reports = fetch_exit_reports(missing, round_, spec_for=spec_for, launcher_for=launcher_for,
                                                      connect_timeout_s=connect_timeout_s)

    def close(self) -> None:
        """The window is closed and discovery has answered: workers adopted after their training function returned
        complete again (judged with the exit reports of their peers that did not come back: kept in the adoption
        record by the predecessor that saw them exit, left in the job's directory, or fetched from their SSH hosts),
        and held messages go to the job's rules now. A code the predecessor recorded from the process's real exit
        status is final: the worker wrote its report before its process ended (a crash in teardown comes after it),
        so a report only fills a rank with no such code; a later one that knows no code hides none."""
        with self._cond:
            self.is_open = False
            round_ = self._job.round
            reports = recorded_exits(self.record, round_)
            final = recorded_exits(self.record, round_, final=True)
            for rank, (worker_id, code) in {**exit_reports(self.record.job_id, round_), **self._remote_reports}.items():
                if rank in final:
                    if code is not None and code != final[rank][1]:
                        log.warning("job %s: rank %d (%s) reported exit code %s, but its process ended with %d: "
                                    "the process's status counts", self._job.job_id, rank, worker_id, code,
                                    final[rank][1])
                elif code is not None or rank not in reports:
                    reports[rank] = (worker_id, code)
            self._job.adoption.finish(self._clock(), reports, final=set(final))
            for notice in self._sigterms:
                self._rules("notice", notice)
            self._sigterms.clear()
            self._cond.notify_all()

    # ------------------------------------------------------------ Interceptor
    def intercept(self, kind: str, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held | None:
        """What a restarted driver answers before the job's rules see a message (None: let them).

        Called under the job's lock, for the driver's whole life: after the window closed, a
        predecessor's worker that did not come back is still told to re-register (and then refused).
        """
        if kind == "adopt":
            return self._adopt(worker_id, msg)
        if kind == "status":
            return None
        if worker_id not in self._job.workers and self.record.worker(worker_id) is not None:
            if kind == "poll":
                return PollReply(0, 0, 0, False, reregister=True).to_wire()
            if kind == "rendezvous":
                return ReRegister().to_wire()
        if self.is_open and kind in _HELD_KINDS:
            return self._hold(kind, msg)
        return None

    def _hold(self, kind: str, msg: dict[str, Any]) -> Held:
        """Held, not waited for: the control-plane server answers every connection from one thread."""

        def check(final: bool) -> dict[str, Any] | None:
            if self.is_open and not final:
                return None
            if kind == "rendezvous":
                return WaitReply().to_wire()  # it asks again, and is then served as usual
            reply = self._rules(kind, msg)
            if isinstance(reply, dict):
                return reply
            # The rules would hold it (a completion waiting for rank 0's): this hold answers now
            # instead, and the worker asks again (a hold of a hold has no connection to answer).
            self._cond.drop(reply)
            return WaitReply().to_wire()

        return self._cond.hold(check, self._rendezvous_hold_s if kind == "rendezvous" else _HOLD_S)

    def _adopt(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        request = AdoptRequest.from_wire(msg)
        entry = self.record.worker(worker_id)
        if entry is None or entry.slot != request.slot:
            why = "not a worker of this job's previous driver"
        else:
            why = self._job.adopt(worker_id, Slot(entry.host, entry.slot), entry.seq, request, self._clock())
        if why is not None:
            log.warning("job %s: refused to adopt worker %s: %s", self._job.job_id, worker_id, why)
            return {"ok": False, "reason": why}
        self._adopted_at = self._clock()
        if request.sigterm_deadline:
            self._sigterm(worker_id, request.sigterm_deadline)
        self._cond.notify_all()
        return {"ok": True}

    def _sigterm(self, worker_id: str, deadline: float) -> None:
        """The worker's SIGTERM, reported to the predecessor, as the worker reported it (``worker.termination``)."""
        from cloud_elastic.notices.api import TERMINATE
        from cloud_elastic.worker.termination import REASON, SOURCE

        notice = dict(NoticeReport(SOURCE, TERMINATE, REASON.format(worker=worker_id), deadline, own=True).to_wire(),
                      worker=worker_id)
        if self.is_open:
            self._sigterms.append(notice)
        else:  # adopted again after the window closed (its first reply was lost): the rules take it now
            self._rules("notice", notice)


def ended_locally(workers: tuple[AdoptedWorker, ...]) -> dict[str, int]:
    """Worker id -> pid of each local worker of ``workers`` whose process no longer runs (no process of that pid, or
    another one started since: its recorded start time differs). None where ``/proc`` cannot tell (not Linux): the
    window waits for them as before."""
    if not os.path.exists("/proc/self/stat"):
        return {}
    ended = {}
    for worker in workers:
        handle = worker.handle
        if handle.get("kind") != "local":
            continue
        try:
            pid, start = int(handle["pid"]), handle.get("start")
            started = process_start_time(pid)
            if started is None or (start is not None and started != int(start)):
                ended[worker.worker_id] = pid
        except (KeyError, TypeError, ValueError):
            continue  # a handle it cannot read: waited for as before
    return ended


def adopted_process(worker: AdoptedWorker, spec: WorkerSpec, launcher_for: Callable[[str], Launcher],
                    on_output: Callable[[str], None]) -> WorkerProcess | None:
    """A handle on a worker the predecessor started (``spec`` says what it runs): by pid locally, through its
    remote wrapper over SSH (``launcher_for(host)``'s ``attach``, its output to ``on_output``)."""
    handle = worker.handle
    try:
        if handle.get("kind") == "local":
            start = handle.get("start")
            return AdoptedLocalProcess(spec, int(handle["pid"]), int(start) if start is not None else None,
                                       _relay(worker, on_output))
        if handle.get("kind") == "ssh":
            attach = getattr(launcher_for(worker.host), "attach", None)
            if attach is not None:
                return attach(spec, str(handle["nonce"]), on_output)
    except (KeyError, TypeError, ValueError, LaunchError) as exc:
        log.warning("cannot reach worker %s of the previous driver: %s", worker.worker_id, exc)
    return None


def _relay(worker: AdoptedWorker, on_output: Callable[[str], None]) -> OutputRelay | None:
    """The relay of a local worker's output to this driver's (its pipe went with the dead driver), started at its first poll."""
    paths = output_paths(worker.job_id, worker.worker_id) if worker.job_id else None
    if paths is None:
        return None
    return OutputRelay(paths[1], on_output, worker.worker_id, kept=paths[0])
