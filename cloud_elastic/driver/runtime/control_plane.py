"""The driver's answers to the control plane: one handler per message kind.

The driver (a :class:`ControlPlaneMixin`) answers every signed message the
control-plane server (:mod:`.server`) accepts, under the job's lock:

* ``register``, ``rendezvous``, ``poll`` (heartbeats), ``completed``,
  ``exiting`` (past its exit hooks: its heartbeats stop, its exit status follows),
  ``stacks``, ``notice``, ``checkpoint`` and ``status``; anything else is a
  ControlPlaneError (the server answers 400);
* long-polls are *held* replies (:class:`~.server.Held`, see :mod:`.waiters`),
  never a blocked thread: a heartbeat until the round, update generation or
  abort round changes (held longer in a very large group, see
  :data:`POLLS_PER_S`), a rendezvous until the worker's assignment or exit
  order, a completion until rank 0's verdict;
* one worker per host runs the host's metadata notice watcher: the first live
  one, then whoever heartbeats first after it goes;
* a worker that got SIGTERM reports it as a notice for its host (``own``), and is
  told whether it stays until the drain sends it away (``stay``): not when the
  TERM was the driver's own;
* a malformed notice or checkpoint report is refused as a whole; a rank 0 that
  cannot load its checkpoint stops the job (``training state lost``).

A mixin, not a piece of its own: every handler reads the job under the driver's
lock and may wake its held requests, and the adoption window (:mod:`.adopting`)
answers some messages before the job's rules see them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.driver.net.control_server import Held
from cloud_elastic.driver.job.workers import WorkerState
from cloud_elastic.protocol import (
    CompletedReport,
    CompletionReply,
    PollReply,
    PollRequest,
    RendezvousRequest,
    StacksReport,
    WaitReply,
)
from cloud_elastic.providers.api import Drain

__all__ = ["ControlPlaneMixin", "POLLS_PER_S", "RENDEZVOUS_POLL_S", "watch_cloud"]

log = logging.getLogger(__name__)

#: How long a rendezvous request is held before the worker is told to ask again.
RENDEZVOUS_POLL_S = 10.0
_NOTICE_KINDS = ("terminate", "rebalance", "maintenance")
#: A worker that gets SIGTERM in these states stays until its host's drain sends it away (at its next commit,
#: or at once from rendezvous); in any other, the TERM is the driver's own (see ``_notice``).
_STAYS_ON_SIGTERM = (WorkerState.WAITING, WorkerState.RUNNING, WorkerState.DRAINING)
#: Heartbeats a second the driver is sized for (about half a core on the benchmark machine): up to 2,000 workers
#: poll every heartbeat interval (0.5 s); a larger group is held longer (see Driver._poll_hold_s).
POLLS_PER_S = 4000.0


class ControlPlaneMixin:
    """The driver's control-plane message handlers (see module docstring)."""

    def _handle(self, kind: str, msg: dict[str, Any], *, adoption_checked: bool = False) -> dict[str, Any] | Held:
        worker_id = msg.get("worker")
        if not isinstance(worker_id, str):
            raise ControlPlaneError("message lacks a worker id")
        with self._cond:
            now = self._clock()
            if self._adoption is not None and not adoption_checked:
                early = self._while_adopting(kind, worker_id, msg)
                if early is not None:
                    return early
            if kind == "register":
                ok = self._job.registered(worker_id, now)
                self._cond.notify_all()
                return {"ok": ok, "heartbeat_interval_s": self.config.heartbeat_interval_s,
                        "notice_watcher": self._notice_watcher(worker_id)}
            if kind == "rendezvous":
                return self._rendezvous(worker_id, msg)
            if kind == "poll":
                return self._poll(worker_id, msg)
            if kind == "completed":
                return self._completed(worker_id, msg, now)
            if kind == "exiting":
                return {"ok": self._job.exiting(worker_id, now)}
            if kind == "stacks":
                return self._stacks(worker_id, msg)
            if kind == "notice":
                return self._notice(worker_id, msg, now)
            if kind == "checkpoint":
                return self._checkpoint(worker_id, msg)
            if kind == "status":
                return self._status(now)
            if kind == "drain":
                return self._drain(msg, now)
            if kind == "unhealthy":
                return self._unhealthy(worker_id, msg, now)
        raise ControlPlaneError(f"unknown message kind {kind!r}")

    def _drain(self, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """``cloud-elastic drain JOB HOST[:SLOT]`` (signed with the job's secret, like ``status``)."""
        host, slot = msg.get("host"), msg.get("slot")
        if not isinstance(host, str) or not host or len(host) > 255 or not (slot is None or _is_int(slot) and slot >= 0):
            raise ControlPlaneError("malformed drain request: needs a host and an optional non-negative slot")
        done, message = self._job.drain(host, slot, now)
        self._cond.notify_all()
        return {"ok": done, "message": message}

    def _unhealthy(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """A newcomer's device self-test failed: one line in the log, its slot blacklisted (see ``worker.selftest``)."""
        reason = msg.get("reason")
        if not isinstance(reason, str) or not reason:
            raise ControlPlaneError("malformed unhealthy report: needs a reason")
        self._job.unhealthy(worker_id, reason.splitlines()[0][:300], now)
        self._cond.notify_all()
        return {"ok": True}

    def _rendezvous(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        request = RendezvousRequest.from_wire(msg)
        self._job.rendezvous(worker_id, request.last_round, request.reason, self._clock(), request.commits,
                             request.rolled_back, request.commit_seq, request.holds_commit)
        self._emit_events()  # a round this arrival formed is recorded before anyone is told of it
        # Only the requests this arrival answered (a round formed) are answered now; the
        # loop need not tick for an arrival, the job has already done what it changes.
        self._cond.wake()

        def check(final: bool) -> dict[str, Any] | None:
            reply = self._job.assignment(worker_id)
            return (reply or WaitReply()).to_wire() if reply is not None or final else None

        return check(False) or self._cond.hold_rendezvous(worker_id, check, RENDEZVOUS_POLL_S)

    def _poll(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any] | Held:
        request = PollRequest.from_wire(msg)
        known = (request.round, request.update_gen, request.abort_round)
        if self._job.rank_of(worker_id) == 0:
            # The job's commit count, not this process's: it goes on when another worker becomes rank 0.
            self._rate.add(self._clock(), request.commit_seq)
            if self._sinks.metrics is not None:
                self._sinks.metrics.observe_step(request.commit_seq)

        def check(final: bool) -> dict[str, Any] | None:
            reply = self._job.heartbeat(worker_id, self._clock(), request.commits, request.commit_seq,
                                        request.progress, request.steps, request.waiting_s, request.compute_s,
                                        comm_s=request.comm_s, link=request.link)
            if reply is None:
                return PollReply(0, 0, 0, True).to_wire()
            if (reply.round, reply.update_gen, reply.abort_round) != known or reply.shutdown or final:
                watcher = self._notice_watcher(worker_id)
                return (reply if watcher is None else dataclasses.replace(reply, notice_watcher=watcher)).to_wire()
            return None

        return check(False) or self._cond.hold_poll(check, self._poll_hold_s())

    def _completed(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any] | Held:
        """A worker's training function returned: held while it waits for rank 0's (see ElasticJob.completed)."""
        report = CompletedReport.from_wire(msg)
        decision, reason = self._job.completed(worker_id, now, commit_seq=report.commit_seq, steps=report.steps,
                                               error=report.error, elastic=report.elastic)
        self._cond.notify_all()
        if decision != "wait":
            return CompletionReply(decision, reason).to_wire()

        def check(final: bool) -> dict[str, Any] | None:
            answer = self._job.completion_reply(worker_id)
            if answer is None:
                return CompletionReply("wait").to_wire() if final else None
            return CompletionReply(*answer).to_wire()

        return self._cond.hold(check, 30.0)

    def _stacks(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        """A worker of a stuck round sent its stacks: into the log and the events file."""
        report = StacksReport.from_wire(msg)
        w = self._job.stacks_received(worker_id, report.request)
        if w is None:
            return {"ok": False}
        log.warning("job %s: stacks of worker %s (%s), round %d:\n%s", self.job_id, worker_id, w.label, w.round,
                    report.text.rstrip())
        self._sinks.sink.emit("stacks", worker=worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                              text=report.text, **({"round": w.round} if w.round else {}))
        self._cond.notify_all()
        return {"ok": True}

    def _poll_hold_s(self) -> float:
        """How long a heartbeat is held: the heartbeat interval, longer in a group so large that the
        driver would otherwise answer more than POLLS_PER_S heartbeats a second, and never more
        than a quarter of the heartbeat timeout (a worker's silence is still found in time)."""
        interval = self.config.heartbeat_interval_s
        return max(interval, min(self.config.heartbeat_timeout_s / 4, self._job.alive_count / POLLS_PER_S))

    def _notice_watcher(self, worker_id: str) -> str | None:
        """The cloud whose metadata notices this worker must watch, if it is its host's watcher.

        One watcher per host: the first live worker there; when it goes, the next
        worker of that host to heartbeat takes over.
        """
        if self._watch_cloud is None:
            return None
        w = self._job.workers.get(worker_id)
        if w is None or not w.alive:
            return None
        current = self._job.workers.get(self._watchers.get(w.slot.host, ""))
        if current is None or not current.alive:
            self._watchers[w.slot.host] = worker_id
            return self._watch_cloud
        return self._watch_cloud if current is w else None

    def _notice(self, worker_id: str, msg: dict[str, Any], now: float) -> dict[str, Any]:
        """A worker's metadata watcher saw a notice for its own host."""
        w = self._job.workers.get(worker_id)
        source, kind, reason, deadline = msg.get("source"), msg.get("notice"), msg.get("reason"), msg.get("deadline")
        if (
            not isinstance(source, str) or kind not in _NOTICE_KINDS or not isinstance(reason, str)
            or not (deadline is None or (isinstance(deadline, (int, float)) and not isinstance(deadline, bool)))
        ):
            raise ControlPlaneError("malformed notice message")
        if w is None:
            return {"ok": False}
        if msg.get("own") is True:
            # A SIGTERM to this worker (worker.termination). The driver's own TERM goes only to workers it
            # no longer wants, or to all at the job's end: those die of it. Any other drains the host.
            if self._job.outcome is not None or w.state not in _STAYS_ON_SIGTERM:
                return {"ok": True, "stay": False}
        self._job.notice(w.slot.host, Drain(deadline=deadline, reason=reason[:200]), now, source=source[:40],
                         soft=kind != "terminate")  # the job drains on soft ones too under --drain-on-rebalance
        self._cond.notify_all()
        return {"ok": True, "stay": True} if msg.get("own") is True else {"ok": True}

    def _checkpoint(self, worker_id: str, msg: dict[str, Any]) -> dict[str, Any]:
        """Rank 0 wrote or loaded a durable checkpoint, or could not load one (the job then ends)."""
        event, step, path = msg.get("event"), msg.get("step"), msg.get("path")
        w = self._job.workers.get(worker_id)
        if w is None or not w.alive:
            return {"ok": False}
        if event == "failed":
            reason = msg.get("reason")
            if not isinstance(reason, str):
                raise ControlPlaneError("malformed checkpoint message")
            if self._stop_reason is None:
                self._stop_reason = (f"training state lost: cannot resume from the checkpoint: {reason[:300]}", 1)
            self._cond.notify_all()
            return {"ok": True}
        commit_seq = msg.get("commit_seq")  # of a load; older workers leave it out
        if (event not in ("saved", "loaded") or not isinstance(path, str) or not _is_int(step)
                or not (commit_seq is None or _is_int(commit_seq))):
            raise ControlPlaneError("malformed checkpoint message")
        if event == "saved":
            extra = {k: msg[k] for k in ("duration_s", "bytes") if _is_number(msg.get(k))}
            if "bytes" in extra and not _is_int(extra["bytes"]):
                del extra["bytes"]
            log.info("job %s: checkpoint of step %d saved by %s to %s", self.job_id, step, worker_id, path[:500])
            self._sinks.sink.emit("checkpoint_saved", step=step, path=path[:1000], **extra)
        else:
            self._job.checkpoint_loaded(step, commit_seq, path[:1000])  # logs the steps lost, emits the events
            self._cond.notify_all()
        return {"ok": True}

    def _status(self, now: float) -> dict[str, Any]:
        from cloud_elastic.driver.job.status_reply import status_reply

        return status_reply(self._job, self.config, provider=str(getattr(self._discovery, "name", "")),
                            now=now, wall_now=time.time(), uptime_s=now - self._started_at,
                            steps_per_s=self._rate.rate if self._rate.rate > 0 else None).to_json()



def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_WATCHED_CLOUDS = ("aws", "gcp", "azure")


def watch_cloud(setting: str, provider: str) -> str | None:
    """Which metadata notice watcher workers run: ``--notice-watcher``, or with ``auto`` the provider's cloud."""
    if setting == "auto":
        return provider if provider in _WATCHED_CLOUDS else None
    return None if setting == "none" else setting
