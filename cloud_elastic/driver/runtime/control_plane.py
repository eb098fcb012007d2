"""The driver's answers to the control plane: :class:`ControlPlane`, one handler per message kind.

:meth:`ControlPlane.handle` answers every signed message the control-plane
server (:mod:`cloud_elastic.driver.net.control_server`) accepts, under the job's lock:

* ``register``, ``rendezvous``, ``poll`` (heartbeats), ``completed``,
  ``exiting`` (past its exit hooks: its heartbeats stop, its exit status follows),
  ``stacks``, ``notice``, ``checkpoint``, ``unhealthy``, ``drain`` and ``status``
  (:data:`ControlPlane.KINDS`); anything else is a ControlPlaneError (the server answers 400);
* every message's fields are parsed by its type (:mod:`cloud_elastic.protocol`,
  :mod:`cloud_elastic.protocol_reports`), which refuses a malformed one as a whole (one line
  naming the field);
* long-polls are *held* replies (:class:`~cloud_elastic.driver.net.control_server.Held`, see
  :mod:`.condition`), never a blocked thread: a heartbeat until the round, update generation or
  abort round changes (held longer in a very large group, see :data:`POLLS_PER_S`), a rendezvous
  until the worker's assignment or exit order, a completion until rank 0's verdict;
* who watches a host's metadata notices, and what a notice does, are the pure rules of
  :mod:`cloud_elastic.driver.job.notice_policy`;
* a rank 0 that cannot load its checkpoint stops the job (``training state lost``), as does one that
  cannot write one, or sees storage apart from the driver's (``CheckpointReport.ending``); its attempts
  that failed but may pass are judged by :class:`~cloud_elastic.driver.job.checkpoint_watch.CheckpointWatch`;
* an :class:`Interceptor` (a restarted driver's adoption window,
  :class:`~cloud_elastic.driver.restart.window.AdoptionWindow`) sees each message first and may
  answer it before the job's rules do;
* the metrics (``--metrics-port``) read the world size and rank 0's step rate from it at each scrape, as
  ``status`` shows them (:meth:`ControlPlane.live`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Protocol

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.checkpoint_watch import CheckpointWatch
from cloud_elastic.driver.job.notice_policy import host_vacated, notice_action, notice_watcher
from cloud_elastic.driver.job.status_reply import round_members, status_reply
from cloud_elastic.driver.net.control_server import Held
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.metrics import LIVE_WAIT_S, STALE_HEARTBEATS, LiveFigures, StepRate
from cloud_elastic.protocol import (CompletedReport, CompletionReply, NextRoundReport, PollReply, PollRequest,
                                    RendezvousRequest, StacksReport, WaitReply)
from cloud_elastic.protocol_reports import CheckpointReport, DrainRequest, ExitingReport, NoticeReport, UnhealthyReport
from cloud_elastic.providers.api import Drain

__all__ = ["ControlPlane", "Interceptor", "POLLS_PER_S", "RENDEZVOUS_POLL_S"]

log = logging.getLogger(__name__)

#: How long a rendezvous request is held before the worker is told to ask again.
RENDEZVOUS_POLL_S = 10.0
#: Heartbeats a second the driver is sized for (about half a core on the benchmark machine): up to 2,000 workers
#: poll every heartbeat interval (0.5 s); a larger group is held longer (see ControlPlane.poll_hold_s).
POLLS_PER_S = 4000.0
#: How long a completion report is held while it waits for rank 0's verdict.
_COMPLETION_HOLD_S = 30.0


class Interceptor(Protocol):
    """Sees every message before the job's rules, under the job's lock.

    Returns the reply (a dict, or :class:`Held` for a reply that comes later) when it answers the
    message itself, or None to let the rules answer it. It may raise ControlPlaneError to refuse it.
    """

    def intercept(self, kind: str, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held | None:
        ...


class ControlPlane:
    """The job's side of every control-plane message (see module docstring).

    ``sinks`` is the job's open events file and metrics; ``stop(reason, exit_code)`` ends the job
    (it takes the lock, which is reentrant); ``record_events()`` writes the job's queued events (called
    under the lock before a reply that tells a worker of a round); ``provider`` and ``started_at``
    (``clock`` time) go into the status reply; ``watch_cloud`` is the cloud whose metadata notices
    workers watch (None: none, see :func:`~cloud_elastic.driver.job.notice_policy.watched_cloud`).
    """

    KINDS = ("register", "rendezvous", "poll", "completed", "exiting", "stacks", "notice", "checkpoint", "status",
             "drain", "unhealthy", "next_round")

    def __init__(self, job: Any, cond: JobCondition, config: JobConfig, *, sinks: Any,
                 clock: Callable[[], float], stop: Callable[[str, int], None], record_events: Callable[[], None],
                 provider: str = "", started_at: float = 0.0, watch_cloud: str | None = None,
                 interceptor: Interceptor | None = None) -> None:
        self._job = job
        self._cond = cond
        self._config = config
        self._sinks = sinks
        self._clock = clock
        self._stop = stop
        self._record_events = record_events
        self._provider = provider
        self._started_at = started_at
        self._watch_cloud = watch_cloud
        self._interceptor = interceptor
        self._watchers: dict[str, str] = {}  # host -> worker id running its metadata notice watcher
        self.rate = StepRate()  # rank 0's optimizer steps per second, for status and the metrics
        self.checkpoints = CheckpointWatch(job.job_id, config.checkpoint_interval_s)
        self._table: dict[str, Callable[[str, dict[str, Any], float], Any]] = {
            "register": self._register, "rendezvous": self._rendezvous, "poll": self._poll,
            "completed": self._completed, "exiting": self._exiting, "stacks": self._stacks,
            "notice": self._notice, "checkpoint": self._checkpoint, "status": self._status,
            "drain": self._drain, "unhealthy": self._unhealthy, "next_round": self._next_round,
        }
        # The metrics read the world size and step rate from here at each scrape (MetricsServer.follow); a sink
        # that only takes observations follows nothing.
        follow = getattr(getattr(sinks, "metrics", None), "follow", None)
        if follow is not None:
            follow(self.live)

    def handle(self, kind: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        """Answer one verified message (the control server's handler): the interceptor's reply, else the rules'.

        ControlPlaneError for a message without a worker id, or of a kind the driver does not know.
        """
        worker_id = _worker_of(msg)
        with self._cond:
            if self._interceptor is not None:
                early = self._interceptor.intercept(kind, worker_id, msg)
                if early is not None:
                    return early
            return self.by_rules(kind, msg)

    def by_rules(self, kind: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        """The job's rules' answer to ``msg``, past the interceptor (which calls this for a message it held)."""
        worker_id = _worker_of(msg)
        handler = self._table.get(kind)
        if handler is None:
            raise ControlPlaneError(f"unknown message kind {kind!r}")
        with self._cond:
            return handler(worker_id, msg, self._clock())

    def live(self) -> LiveFigures | None:
        """The world size and rank 0's step rate as ``status`` shows them, for a metrics scrape (from the scrape
        thread); None when the job's lock stays held for :data:`~cloud_elastic.metrics.LIVE_WAIT_S`."""
        if not self._cond.acquire(timeout=LIVE_WAIT_S):
            return None
        try:
            return LiveFigures(len(round_members(self._job)), self.rate.as_of(self._clock()))
        finally:
            self._cond.release()

    def poll_hold_s(self) -> float:
        """How long a heartbeat is held: the heartbeat interval, longer in a group so large that the
        driver would otherwise answer more than POLLS_PER_S heartbeats a second, and never more
        than a quarter of the heartbeat timeout (a worker's silence is still found in time)."""
        interval = self._config.heartbeat_interval_s
        return max(interval, min(self._config.heartbeat_timeout_s / 4, self._job.alive_count / POLLS_PER_S))

    # --------------------------------------------------------------- the kinds
    def _register(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        armed = msg.get("stacks_signal")  # whether it prints its stacks on the driver's signal (None: an older worker)
        if armed is not None and not isinstance(armed, bool):
            raise ControlPlaneError(f"malformed register: 'stacks_signal' must be true or false, got {armed!r}")
        ok = self._job.registered(worker_id, now)
        if ok:
            self._job.workers[worker_id].stacks_signal = armed
        self._cond.notify_all()
        # running: the job trains already (or keeps spares, which may be any of its first workers), so the worker
        # joins at its first call that needs the round (after its own set-up), not inside hvd.init() (see
        # worker.context).
        running = self._job.phase is Phase.RUNNING or self._config.spares > 0
        return {"ok": ok, "heartbeat_interval_s": self._config.heartbeat_interval_s,
                "notice_watcher": self._notice_watcher(worker_id), "running": running}

    def _exiting(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        report = ExitingReport.from_wire(msg)  # its exit status where the process's is unknown (adoption.exit_status)
        self._job.adoption.exiting(worker_id, report.code, report.error)
        return {"ok": self._job.exiting(worker_id, now)}

    def _drain(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """``cloud-elastic drain JOB HOST[:SLOT]`` (signed with the job's secret, like ``status``)."""
        request = DrainRequest.from_wire(msg)
        done, message = self._job.drain(request.host, request.slot, now)
        self._cond.notify_all()
        return {"ok": done, "message": message}

    def _unhealthy(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """A newcomer's device self-test failed: one line in the log, its slot blacklisted (see ``worker.selftest``)."""
        report = UnhealthyReport.from_wire(msg)
        self._job.unhealthy(worker_id, report.reason, now)
        self._cond.notify_all()
        return {"ok": True}

    def _rendezvous(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any] | Held:
        request = RendezvousRequest.from_wire(msg)
        self._job.rendezvous(worker_id, request.last_round, request.reason, now, request.commits,
                             request.rolled_back, request.commit_seq, request.holds_commit, request.unreachable,
                             trained=request.trained, addresses=request.addresses, takes_facts=request.takes_facts)
        self._record_events()  # a round this arrival formed is recorded before anyone is told of it
        # Only the requests this arrival answered (a round formed) are answered now; the
        # loop need not tick for an arrival, the job has already done what it changes.
        self._cond.wake()

        def check(final: bool) -> dict[str, Any] | None:
            reply = self._job.assignment(worker_id)
            return (reply or WaitReply()).to_wire() if reply is not None or final else None

        return check(False) or self._cond.hold_rendezvous(worker_id, check, RENDEZVOUS_POLL_S)

    def _poll(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any] | Held:
        request = PollRequest.from_wire(msg)
        if request.elastic:  # a worker inside hvd.elastic.run: the job is elastic (see job.fixed_size)
            self._job.fixed.entered(worker_id)
        known = (request.round, request.update_gen, request.abort_round, request.next_plan)
        w = self._job.workers.get(worker_id)
        if w is not None and request.stacks_signal is not None and w.alive:  # a script may take SIGUSR1 after init
            w.stacks_signal = request.stacks_signal
        if w is not None and w.rank == 0 and not w.discarded:  # a discarded one's steps are of a past no round has
            # Its process's optimizer steps (the rate starts afresh with another rank 0's count), and the job's
            # last commit, counted in commits: the training step only when the script commits every step. Its
            # next heartbeat comes within the hold its poll gets: missing several, its rate reads 0 (StepRate.as_of).
            self.rate.add(now, request.steps, worker_id, stale_s=STALE_HEARTBEATS * self.poll_hold_s())
            if self._sinks.metrics is not None:
                self._sinks.metrics.observe_progress(request.steps, request.commit_seq, worker_id)

        def check(final: bool) -> dict[str, Any] | None:
            # At its arrival (``now``): a held poll's later looks bring no news of the worker (see liveness).
            reply = self._job.heartbeat(worker_id, now, request.commits, request.commit_seq,
                                        request.progress, request.steps, request.waiting_s, request.compute_s,
                                        comm_s=request.comm_s, link=request.link, trained=request.trained,
                                        holds_commit=request.holds_commit)
            if reply is None:
                return PollReply(0, 0, 0, True).to_wire()
            rounds = self._job.rounds
            offer = rounds.next.offer_to(worker_id)  # the planned next round (see job.next_round)
            if offer is not None or rounds.planned:
                reply = dataclasses.replace(reply, next_round=offer, round_plan=rounds.planned)
            if (reply.round, reply.update_gen, reply.abort_round, offer.plan if offer else 0) != known \
                    or reply.shutdown or final:
                watcher = self._notice_watcher(worker_id)
                if watcher is not None:  # a leaving watcher acknowledges its host's notices once the others left
                    workers = self._job.workers
                    vacated = reply.leave is not None and host_vacated(workers[worker_id], workers.values())
                    reply = dataclasses.replace(reply, notice_watcher=watcher, host_vacated=vacated)
                return reply.to_wire()
            return None

        # Its arrival, not the held reply's later looks, is when the worker was last known alive (see liveness).
        self._job.silence.heard(worker_id, self._job.running(now), request.flight, request.pause_s)
        return check(False) or self._cond.hold_poll(check, self.poll_hold_s())

    def _next_round(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """A worker formed the planned next round's group in the background, or could not (see job.next_round)."""
        report = NextRoundReport.from_wire(msg)
        self._job.rounds.next.report(worker_id, report.plan, report.formed, report.reason)
        self._cond.notify_all()  # the last member's report raises the update: every held heartbeat learns it now
        return {"ok": True}

    def _completed(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any] | Held:
        """A worker's training function returned: held while it waits for rank 0's (see ElasticJob.completed)."""
        report = CompletedReport.from_wire(msg)
        decision, reason = self._job.completed(worker_id, now, commit_seq=report.commit_seq, steps=report.steps,
                                               error=report.error, elastic=report.elastic, again=report.again)
        self._cond.notify_all()
        if decision != "wait":
            return CompletionReply(decision, reason, *self._job.leaving_checkpoint(worker_id)).to_wire()

        def check(final: bool) -> dict[str, Any] | None:
            answer = self._job.completion_reply(worker_id)
            if answer is None:
                return CompletionReply("wait").to_wire() if final else None
            return CompletionReply(*answer, *self._job.leaving_checkpoint(worker_id)).to_wire()

        return self._cond.hold(check, _COMPLETION_HOLD_S)

    def _stacks(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """A worker of a stuck round sent its stacks: into the log and the events file."""
        report = StacksReport.from_wire(msg)
        w = self._job.stacks_received(worker_id, report.request, report.text)
        if w is None:
            return {"ok": False}
        log.warning("job %s: stacks of worker %s (%s), round %d:\n%s", self._job.job_id, worker_id, w.label, w.round,
                    report.text.rstrip())
        self._sinks.sink.emit("stacks", worker=worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                              text=report.text, **({"round": w.round} if w.round else {}))
        self._cond.notify_all()
        return {"ok": True}

    def _notice_watcher(self, worker_id: str) -> str | None:
        """The cloud whose metadata notices this worker must watch, if it is its host's watcher."""
        w = self._job.workers.get(worker_id)
        current = self._job.workers.get(self._watchers.get(w.slot.host, "")) if w is not None else None
        choice = notice_watcher(self._watch_cloud, w, current)
        if choice.takes_over:
            self._watchers[w.slot.host] = worker_id
        return choice.cloud

    def _notice(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """A worker's metadata watcher saw a notice for its own host, or the worker got SIGTERM (``own``)."""
        report = NoticeReport.from_wire(msg)
        w = self._job.workers.get(worker_id)
        if w is None:
            return {"ok": False}
        action = notice_action(report.notice, own=report.own, state=w.state, job_over=self._job.outcome is not None)
        if action.drain:
            # The job drains on soft notices too under --drain-on-rebalance.
            self._job.notice(w.slot.host, Drain(deadline=report.deadline, reason=report.reason), now,
                             source=report.source, soft=action.soft, watcher=worker_id)
            self._cond.notify_all()
        return {"ok": True, "stay": action.stay} if report.own else {"ok": True}

    def _checkpoint(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """Rank 0 wrote or loaded a durable checkpoint, or one failed (the job then ends: CheckpointReport.ending)."""
        w = self._job.workers.get(worker_id)
        if w is None or not w.alive:
            return {"ok": False}
        report = CheckpointReport.from_wire(msg)
        if report.event == "failed":
            self._stop(report.ending(), 1)
            self._cond.notify_all()
        elif report.event == "not_written":
            if self._job.resumed:  # resumed or adopted with a checkpoint (Driver._resume): it is there to go back to
                self.checkpoints.one_exists()
            why = self.checkpoints.not_written(str(report.reason), now)
            # Once one checkpoint exists failures only warn: the event (and its metric) is what an alert can see.
            self._sinks.sink.emit("checkpoint_failed", reason=str(report.reason)[:500],
                                  failed_in_a_row=self.checkpoints.failed_in_a_row,
                                  since_s=round(self.checkpoints.failing_for(now), 1))
            if why is not None and self._job.outcome is None:
                self._stop(CheckpointReport("failed", reason=why, failure="write").ending(), 1)
                self._cond.notify_all()
        elif report.event == "writing":
            # Its writer holds the commit it is about to publish (review h25): had every member died between that
            # publish and "saved", with the commit not yet in a heartbeat, a spare formed a round from the initial
            # weights over the checkpoint. Known committed now, a round without a holder loads the checkpoint.
            self._job.note_commits(w, None, report.commit_seq)
        elif report.event == "saved":
            self.checkpoints.saved(now)
            # Its writer holds the commit it stored, as its next heartbeat would say: every worker failing before
            # that heartbeat resumes from this checkpoint, not "all workers failed" (Failures.fail).
            self._job.note_commits(w, None, report.commit_seq)
            self._job.checkpoint_saved(report.step, report.commit_seq)
            extra = {k: v for k, v in (("duration_s", report.duration_s), ("bytes", report.bytes)) if v is not None}
            log.info("job %s: checkpoint of step %d saved by %s to %s", self._job.job_id, report.step, worker_id,
                     report.path[:500])
            self._sinks.sink.emit("checkpoint_saved", step=report.step, path=report.path, **extra)
        else:
            self.checkpoints.one_exists()
            self._job.checkpoint_loaded(report.step, report.commit_seq, report.path,  # logs the steps lost
                                        trained=report.trained or "")
            self._cond.notify_all()
        return {"ok": True}

    def _status(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        return status_reply(self._job, self._config, provider=self._provider, now=now, wall_now=time.time(),
                            uptime_s=now - self._started_at, steps_per_s=self.rate.as_of(now)).to_json()


def _worker_of(msg: dict[str, Any]) -> str:
    worker_id = msg.get("worker")
    if not isinstance(worker_id, str):
        raise ControlPlaneError("message lacks a worker id")
    return worker_id
