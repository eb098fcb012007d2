"""The worker's link to its driver: heartbeats, reports, a lost or restarted driver.

A :class:`DriverLinkMixin` (the worker's context) keeps one heartbeat thread
long-polling the driver and decides:

* what the worker learns from each reply: the current round, the update
  generation (a graceful membership change is pending), the highest aborted
  round, whether to start the host's notice watcher, whether the driver wants
  this worker's stacks (its round looks stuck), and whether the job is over;
* how long it trains on without a driver: a control-plane call rides out a
  network blip; past the heartbeat timeout the driver counts as lost (rank 0
  then checkpoints at every commit it can); past ``--driver-grace`` the exit
  hooks run (rank 0's last checkpoint) and the worker exits with code 75;
* what a restarted driver gets: an :class:`~cloud_elastic.protocol.AdoptRequest`
  saying where the worker stands (it keeps its round, rank and process group;
  only the store client is renewed before its next round); a refusal makes it
  exit (code 75), as its training would now be a second copy of the job;
* that standard output and error survive a dead driver's broken pipe, so the worker can train on for the
  grace, and are kept for a driver that adopts it (:mod:`.kept_output`, tended at each heartbeat tick).

A mixin, not a piece of its own: the heartbeat thread writes what the training
thread reads (the rounds seen, the driver's state), which is the context's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from cloud_elastic.config import past_grace_s
from cloud_elastic.protocol import AdoptRequest, FlightEntry, PollReply, PollRequest, RankInfo
from cloud_elastic.protocol_reports import (ExitingReport, StacksReport, driver_retrying, driver_unreachable,
                                            error_line)
from cloud_elastic.records import EXIT_REPORT_ENV, exit_report_path
from cloud_elastic.worker.link import kept_output
from cloud_elastic.worker.link.kept_output import _SurvivingStream, _survive_output_loss  # noqa: F401 - the worker's context starts it
from cloud_elastic.worker.link.link_probe import link_probe_of
from cloud_elastic.worker.link.client import DriverClient
from cloud_elastic.worker.link.pauses import Pauses
from cloud_elastic.worker.link.progress import format_stacks

__all__ = ["DriverLinkMixin", "note_exit_code", "notice_reporter", "say", "stacks_signal_armed"]

log = logging.getLogger(__name__)

#: While the driver does not answer a call, a warning at the first failure, then at most one this often.
RETRY_WARNING_EVERY_S = 10.0

#: The exit code the script ended with, told by the local fork server that ran it (None: not told).
_script_exit_code: int | None = None


def note_exit_code(code: int) -> None:
    """The fork server's ``run_main`` says the script ended with ``code`` (certain: it caught the ``SystemExit``
    or the exception, or saw the script return); the exit hook's ``exiting`` message then carries it."""
    global _script_exit_code
    _script_exit_code = code


def say(line: str) -> None:
    """``line`` on standard error, with its newline, in one write. The heartbeat thread says it while the script
    prints on (the worker runs unbuffered): ``print`` writes the text, then the newline, and a line of the script
    written between the two would be glued to the end of this one."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def stacks_signal_armed() -> bool:
    """Whether this process prints its stacks on the driver's signal (SIGUSR1), told at registration and with each
    heartbeat: ``faulthandler`` still holds it (the worker library registers it at start unless the script had a
    handler; a handler the script sets later shows in ``signal.getsignal``), and this process is the one the
    launcher signals, the leader of its process group (under a wrapper script, the wrapper is). Where it is not,
    the driver counts a worker silent past --heartbeat-timeout as hung without its stacks (``driver.job.repeats``)."""
    try:
        leads = os.getpgid(0) == os.getpid()
    except OSError:
        return False
    return leads and signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)


class DriverLinkMixin:
    """The heartbeat thread and every call to the driver (see module docstring)."""

    #: The planned next round this worker acts on; ``rounds.next_group`` (the context's) overrides these three.
    next_plan = 0
    #: The deadline of a SIGTERM the driver let this worker stay for (0: none): told to a restarted driver too.
    sigterm_deadline = 0.0
    #: Its training function returned and the driver said ``done`` (set by ``report_completed``): a restarted
    #: driver takes it back as completed, in the work after training, not as a member still training.
    training_done = False
    #: This host's watcher is leaving, and every other worker of its host has exited (``PollReply.host_vacated``).
    host_vacated = False
    #: A call of :meth:`_call` was answered once: the driver's address is right (past its deadline, a call raises).
    driver_reached = False

    def _trained(self) -> str:
        """The fingerprint of the state this worker would restore (``ledger.trained``), for the driver's repeat guards."""
        ledger = getattr(self, "ledger", None)
        return ledger.trained if ledger is not None else ""

    def _next_offered(self, offer: Any, round_now: int, round_plan: int, sent: float) -> None:
        """What a heartbeat reply says of the planned next round (none here)."""

    def _drop_next(self, why: str, *, before_round: int | None = None) -> None:
        """Retire the planned next round's group (none here)."""

    def _joined_unformed_plan(self) -> bool:
        """In a planned round its driver had not formed yet (never here)."""
        return False

    def _forget_plans(self) -> None:
        """A restarted driver adopted this worker: forget the dead driver's plan numbers (none here)."""

    def _call(self, kind: str, payload: dict[str, Any] | None = None, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """A control-plane call that rides out a network blip (these calls are idempotent on the driver).

        Retried every 0.2 s for up to ``max(3 * heartbeat timeout, driver grace + 5)`` seconds, with a warning at
        the first failure and then at most one every :data:`RETRY_WARNING_EVERY_S`, saying how long it has tried.
        Past that, a worker that never reached its driver (a ``--driver-address`` it cannot reach, a firewall)
        exits with one line (:meth:`_unreachable`); one that did raises the last OSError.
        """
        assert self._client is not None
        # Within the driver grace the heartbeat thread decides when to give up; here, just keep trying.
        began, warned = time.monotonic(), None
        if kind == "register":  # whether a hang of this process shows its stacks (see stacks_signal_armed)
            payload = {**(payload or {}), "stacks_signal": stacks_signal_armed()}
        patience = max(3 * self.heartbeat_timeout_s, self.driver_grace_s + 5)
        while True:
            try:
                reply = self._client.call(kind, payload, timeout_s=timeout_s)
                self.driver_reached = True
                return reply
            except OSError as exc:
                now = time.monotonic()
                if now - began > patience:
                    if not self.driver_reached:
                        self._unreachable(now - began, exc)
                    raise
                if warned is None or now - warned >= RETRY_WARNING_EVERY_S:
                    tried = "failed" if warned is None else f"still fails after {now - began:.0f}s"
                    warned = now
                    log.warning("%s", driver_retrying(self.worker_id, kind, self.settings.driver_address, tried,
                                                      str(exc), patience))
                time.sleep(0.2)

    def _unreachable(self, tried_s: float, exc: OSError) -> None:
        """This worker never reached its driver in ``tried_s`` seconds: exit (code 1) with one line, no traceback,
        which the driver's end line carries as this worker's reason (``protocol_reports.driver_unreachable``)."""
        self.driver_lost = True  # the exit hooks try the driver no more
        why = driver_unreachable(self.settings.driver_address, tried_s, str(exc) or type(exc).__name__)
        print(f"cloud-elastic: worker {self.worker_id}: {why}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    def say_exiting(self) -> None:
        """Tell the driver this process is past its exit hooks: heartbeats stop now, the exit status follows.

        The message carries the exit code the process is about to exit with (:meth:`_exit_report`): a
        driver that adopted this worker cannot reap it, and must not take a failure for a success. One
        try, a few seconds at most (the process is exiting): on failure the driver judges the silence by
        the heartbeat timeout, as before (and an adopted worker's unknown exit as a failure).
        """
        if self._codec is None:
            return
        report = self._exit_report()
        self._leave_exit_report(report)
        if self.driver_lost:
            return
        try:
            DriverClient(self.settings.driver_address, self._codec, self.worker_id).call(
                "exiting", report.to_wire(), timeout_s=min(5.0, self.heartbeat_timeout_s))
        except Exception as exc:  # the driver may be gone: its heartbeat timeout then applies
            log.debug("worker %s: could not tell the driver it is exiting: %s", self.worker_id, exc)

    def _leave_exit_report(self, report: ExitingReport) -> None:
        """After its training function returned, leave ``report`` in the job's directory on this machine, where the
        driver keeps its records (:func:`~cloud_elastic.records.exit_report_path`), or, started by the SSH remote
        wrapper, where :data:`~cloud_elastic.records.EXIT_REPORT_ENV` says (the wrapper adds the exact exit status):
        should the driver die before this process's end reached it, its successor reads how this worker ended
        (``driver.restart.record.exit_reports``, fetched over ssh from another host) instead of failing a rank that
        did not come back. Nothing on a host where neither is."""
        info = self.info
        if not (self.training_done and info):
            return
        remote = os.environ.get(EXIT_REPORT_ENV, "")
        path = Path(remote) if os.path.isabs(remote) else exit_report_path(self.settings.job_id, self.worker_id)
        if path is None or not (remote or (path.parent / "driver.json").is_file()):
            return
        data = json.dumps({"v": 1, "round": info.round, "rank": info.rank, **report.to_wire()})
        tmp = path.with_name(path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:  # a restarted driver then fails the job for want of it, never takes it for a success
            log.warning("worker %s: could not leave its exit report at %s: %s", self.worker_id, path, exc)

    def _exit_report(self) -> ExitingReport:
        """The exit code this process is about to exit with, where it is certain, else None (unknown, never 0).

        For a local worker, forked by the fork server or started from scratch through ``driver.launch.local_main``
        (both run the script with ``forkserver_child.run_main``), the code the script ended with
        (:func:`note_exit_code`: ``SystemExit`` however raised, ``exit(2)`` and ``from sys import exit`` included);
        else 1 after an exception that ended the script (``sys.excepthook`` saw it). A plain interpreter (an SSH
        worker, a local command of another shape) shows no exit hook the code of a top-level ``SystemExit``, so a
        script that seems to end cleanly there says nothing: an SSH worker's driver learns the status from the
        remote wrapper, which reaps it.
        """
        raised = getattr(self, "_uncaught", None) or getattr(sys, "last_value", None)
        error = error_line(f"{type(raised).__name__}: {raised}") if raised is not None else None
        if _script_exit_code is not None:
            return ExitingReport(_script_exit_code, error if _script_exit_code else None)
        return ExitingReport(1, error) if raised is not None else ExitingReport(None)

    def report_checkpoint(self, event: str, **fields: Any) -> None:
        """Tell the driver a checkpoint was ``saved``, ``loaded`` or could not be loaded (``failed``).

        Best effort: while the driver is away the report is skipped (the
        checkpoint itself is what matters), and a failed call is logged.
        """
        if self._codec is None or (self.driver_lost and event != "failed"):
            return
        with self._reporter_lock:
            if self._reporter is None:
                self._reporter = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
            try:
                # "writing" holds a publish back (see durable.rank_zero): briefly, should the driver's host be gone.
                self._reporter.call("checkpoint", dict(fields, event=event, round=self.info.round if self.info else 0),
                                    timeout_s=2.0 if event == "writing" else self.heartbeat_timeout_s + 5)
            except Exception as exc:  # the driver may be gone; the checkpoint is on storage either way
                log.warning("worker %s: could not report checkpoint %s to the driver: %s", self.worker_id, event, exc)


    # ---------------------------------------------------------------- notices
    def report_sigterm(self, deadline: float) -> bool:
        """A SIGTERM reached this worker inside ``elastic.run`` (see ``termination``): report it as a
        ``terminate`` notice for this host, as the host's watcher would, with ``deadline`` (Unix seconds).

        True when the driver keeps this worker until it leaves at its next commit; False when it
        does not (the TERM was the driver's own: the job is over, or the worker is no longer wanted).
        One try, within the heartbeat timeout; raises when the driver cannot be reached.
        """
        from cloud_elastic.worker.termination import REASON, SOURCE

        if self._codec is None or self.driver_lost:
            return False
        reply = DriverClient(self.settings.driver_address, self._codec, self.worker_id).call("notice", {
            "source": SOURCE, "notice": "terminate", "reason": REASON.format(worker=self.worker_id),
            "deadline": deadline, "own": True,
        }, timeout_s=self.heartbeat_timeout_s)
        stays = reply.get("ok") is True and reply.get("stay") is True
        if stays:
            self.sigterm_deadline = deadline
        return stays

    def _maybe_watch_notices(self, cloud: Any) -> None:
        """Start this host's metadata notice watcher when the driver picks this worker for it (once).

        Never raises: a watcher that cannot start costs the notice's lead time, not the training.
        """
        if not isinstance(cloud, str) or self._notice_watcher is not None or self._codec is None:
            return
        try:
            self._start_notice_watcher(cloud)
        except Exception:  # noqa: BLE001 - logged with its traceback; training goes on without a watcher
            log.exception("worker %s: could not start the %s notice watcher", self.worker_id, cloud)

    def _start_notice_watcher(self, cloud: str) -> None:
        from cloud_elastic.errors import ConfigError
        from cloud_elastic.notices import watcher_for

        try:
            watcher = watcher_for(cloud, self.hostname)  # its endpoint overrides come from this process's environment
        except ConfigError as exc:
            log.warning("worker %s: no %s notice watcher: %s", self.worker_id, cloud, exc)
            return
        if watcher is None:
            return
        self._notice_watcher = watcher
        assert self._codec is not None
        client = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
        watcher.start(notice_reporter(client, self.heartbeat_timeout_s + 10))
        log.info("worker %s: watching %s instance metadata for notices on host %s", self.worker_id, cloud, self.hostname)


    # -------------------------------------------------------------- heartbeat
    def _heartbeat_loop(self) -> None:
        assert self._codec is not None
        client = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
        pauses = Pauses()  # the driver's silence rule allows for them (see link.pauses)
        pauses.start()
        try:
            self._heartbeats(client, pauses)
        finally:
            pauses.close()

    def _heartbeats(self, client: DriverClient, pauses: Pauses) -> None:
        last_ok = time.monotonic()
        keeper = kept_output.keep_for(self.job_id, self.worker_id)  # output kept while no driver reads it
        while not self._shutdown.is_set():
            if keeper is not None:
                keeper.tend()
            try:
                progress = self.progress
                sent = time.monotonic()
                reply = PollReply.from_wire(client.call(
                    "poll",
                    PollRequest(self._seen_round, self._seen_update, self._seen_abort, self.commits,
                                self.commit_seq, progress.sample(), progress.steps,
                                round(progress.waiting_s(), 2), progress.compute_s(),
                                comm_s=progress.comm_s(), link=link_probe_of(self).report(),
                                flight=self._flight_entry(),
                                pause_s=pauses.expected_s(first_step=self._first_step_of_round()),
                                next_plan=self.next_plan, elastic=getattr(self, "elastic_entered", False),
                                stacks_signal=stacks_signal_armed(), trained=self._trained(),
                                holds_commit=self.holds_commit).to_wire(),
                    timeout_s=self._poll_timeout_s(last_ok),
                ))
                if reply.reregister:
                    self._reregister(client)
                    reply = None
                last_ok = time.monotonic()
                if self.driver_lost:
                    self.driver_lost = False
                    log.warning("worker %s: the driver answers again", self.worker_id)
            except Exception as exc:  # any failure to reach the driver counts toward giving up
                # Counted from the last answer, so a worker never outlives its driver by more than the grace.
                silent = time.monotonic() - last_ok
                if not self.driver_lost and silent > self.heartbeat_timeout_s:
                    self.driver_lost = True
                    say(f"cloud-elastic: worker {self.worker_id} cannot reach the driver ({exc}); training on "
                        f"for up to {self.driver_grace_s:g}s (--driver-grace)")
                if silent > self.driver_grace_s:
                    self._grace_exit(exc)
                time.sleep(0.2)
                continue
            if reply is None:
                continue  # adopted; the next poll brings the restarted driver's view
            self._seen_round = reply.round
            self._seen_update = max(self._seen_update, reply.update_gen)
            self._seen_abort = max(self._seen_abort, reply.abort_round)
            if reply.dismissed:
                self.dismissed = True  # e.g. given up while it could not answer: every round is over for it
            if reply.leave:
                self.sent_away = reply.leave
            self.host_vacated = self.host_vacated or reply.host_vacated  # see WorkerContext.leave
            self.view_as_of = sent
            self._maybe_watch_notices(reply.notice_watcher)
            link_probe_of(self).order(reply.probe)  # the driver's probe order runs on a thread of its own
            self._next_offered(reply.next_round, reply.round, reply.round_plan, sent)  # a planned next round forms in the background
            self.abort_lost_round()  # NCCL: an aborted round's kernels end now, not at its timeout (rounds.on_device)
            if reply.stacks > self._stacks_sent:
                self._send_stacks(client, reply.stacks)
            if reply.shutdown:
                return

    def _first_step_of_round(self) -> bool:
        """In a round, before its first optimizer step (set when the round's group formed, see ``rounds.groups``)."""
        return self.progress.steps == self.__dict__.get("_round_steps0", -1)

    def _flight_entry(self) -> FlightEntry | None:
        """The newest entry of this worker's flight record, for its heartbeat (see ``rounds.flight``)."""
        recorder = self.__dict__.get("_flight")  # made by the training thread when its first round formed
        latest = None if recorder is None else recorder.latest()
        return None if latest is None else FlightEntry(**latest)

    def await_current_view(self) -> None:
        """Return once what this worker knows of the driver's rounds is recent enough to act on.

        The driver gives a worker up after ``heartbeat_timeout_s`` of silence and
        aborts its round. A worker that was stopped or starved that long (its
        heartbeat thread too) resumes with the view it had before: the abort is
        unknown to it, and it trained and committed on in the dead round (a chaos
        run: twice, before its kill). So when the newest answered heartbeat was
        *sent* longer ago than the timeout, this waits until one sent after now is
        answered (the driver answers at once when the worker's view is out of
        date), until the driver counts as lost (training on without it is the
        driver grace's business), or at most the heartbeat call's own timeout.
        Costs a clock read otherwise.
        """
        if self._heartbeat is None or self.driver_lost or self.dismissed:
            return  # standalone, or no view to wait for (training on without the driver is the grace's business)
        asked = time.monotonic()
        if asked - self.view_as_of <= self.heartbeat_timeout_s:
            return
        deadline = asked + self.heartbeat_timeout_s + 10 + 1  # the poll's own timeout, and a second
        if self.__dict__.get("_silence_warned") != self.view_as_of:  # once a silence: not at every collective of it
            self.__dict__["_silence_warned"] = self.view_as_of
            log.warning("worker %s: no word from the driver for %.1fs; waiting for its current view before going on",
                        self.worker_id, asked - self.view_as_of)
        while (self.view_as_of < asked and not self.dismissed and not self.driver_lost
               and self._heartbeat.is_alive() and time.monotonic() < deadline):
            time.sleep(0.01)

    def _send_stacks(self, client: DriverClient, request: int) -> None:
        """The driver asked for this worker's stacks (its round looks stuck): send every thread's."""
        self._stacks_sent = request
        try:
            recorder = self.__dict__.get("_flight")
            text = format_stacks() + ("" if recorder is None else "\n" + recorder.format() + "\n")
            client.call("stacks", StacksReport(request, text).to_wire(),
                        timeout_s=self.heartbeat_timeout_s + 10)
        except Exception as exc:  # the heartbeat goes on; the driver stops waiting for them
            log.warning("worker %s: could not send its stacks to the driver: %s", self.worker_id, exc)


    # ------------------------------------------------------------- adoption
    def _reregister(self, client: DriverClient) -> None:
        """A driver restarted within the grace does not know this worker yet: tell it where we stand.

        The worker keeps its process group and its step: the driver takes it over in
        its current round. Only the store client is renewed (its server died with the
        old driver), before the next round forms. A driver that refuses (it resumed
        the job without this worker) makes the worker exit: its training would now
        be a second copy of the job. What the dead driver was told of this host's leaving goes to the
        new one: a SIGTERM it let the worker stay for, in the request; a notice of the host's watcher,
        at its next sighting.
        """
        with self._adopt_lock:
            place = round_, ranks, update_gen = self._adoption_place()
            request = AdoptRequest(round_, ranks, update_gen, self._seen_update, self._seen_abort, self.commits,
                                   self.settings.slot, os.getpid(), self.commit_seq, self.sigterm_deadline,
                                   self.training_done)
            # What adoption changes on this side happens before the request, not on its reply: a reply lost (a
            # timeout) after the driver adopted it leaves no second chance, since the next poll is answered as
            # usual. Kept, the old plan numbers aborted the adopted round and every later one of the same plan
            # number, and the dead driver's store client failed every round (review s59 rvP finding 1). A driver
            # that refuses makes the worker exit anyway.
            self._store_stale = True
            self._drop_next("a restarted driver knows no plan")
            self._forget_plans()  # and numbers its own from 1 again: see rounds.next_group
            self.__dict__["_adopt_place"] = (self.info, place)  # for a request sent again: see _adoption_place
            reply = client.call("adopt", request.to_wire(), timeout_s=self.heartbeat_timeout_s + 10)
            if not reply.get("ok"):
                say(f"cloud-elastic: worker {self.worker_id}: the restarted driver refused to adopt it "
                    f"({str(reply.get('reason') or 'no reason given')[:300]}); exiting")
                os._exit(75)
            self.__dict__.pop("_adopt_place", None)
            if self._notice_watcher is not None:
                # The dead driver may have taken a notice for this host and died before acting on it or
                # writing it down: the new one hears of it at the watcher's next sighting.
                self._notice_watcher.resend()
            if self.driver_lost:
                self.driver_lost = False
            log.warning("worker %s: adopted by the restarted driver in round %d", self.worker_id,
                        request.round)

    def _adoption_place(self) -> tuple[int, RankInfo | None, int]:
        """The round, ranks and update generation an adopt request tells (round 0: a newcomer).

        Worked out from the round as this worker holds it before it forgets the dead driver's plans, and kept
        for as long as it holds that round: an adopt request sent again (the first one failed) must say the
        same, though the plans are forgotten by then (a newcomer in an unformed plan would otherwise pass for
        a member of that round).
        """
        kept = self.__dict__.get("_adopt_place")
        if kept is not None and kept[0] is self.info:
            return kept[1]
        info = self.info if self._attempted_round and not self._joined_unformed_plan() else None
        ranks = None if info is None else RankInfo(info.rank, info.size, info.local_rank, info.local_size,
                                                   info.cross_rank, info.cross_size)
        return (0, None, 0) if info is None else (info.round, ranks, info.update_gen)

    def _reconnect_store(self) -> None:
        host, _, port = self.settings.store_address.rpartition(":")
        self._store = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=self.collective_timeout_s))
        self._store_stale = False

    def _poll_timeout_s(self, last_ok: float) -> float:
        """A heartbeat's timeout: the heartbeat timeout + 10 s, cut at the end of the grace (counted from the last
        answer, ``last_ok``), never below :func:`~cloud_elastic.config.past_grace_s`: a driver that stops answering
        without refusing held the worker a whole call past its grace (review h32)."""
        left = self.driver_grace_s - (time.monotonic() - last_ok)
        return min(self.heartbeat_timeout_s + 10, max(left, past_grace_s(self.heartbeat_timeout_s)))

    def _grace_exit(self, exc: BaseException) -> None:
        """The driver stayed away past the grace: run the exit hooks (rank 0's last checkpoint), then exit."""
        for hook in self.before_grace_exit:
            try:
                hook()
            except Exception:  # exiting is what matters now
                log.warning("worker %s: an exit hook failed", self.worker_id, exc_info=True)
        say(f"cloud-elastic: worker {self.worker_id} lost contact with the driver for more than "
            f"{self.driver_grace_s:g}s (--driver-grace; last error: {exc}); exiting")
        os._exit(75)


def notice_reporter(client: DriverClient, timeout_s: float) -> Callable[[Any], None]:
    """The report callback of a host's notice watcher: sends each notice to the driver.

    The callback raises (ControlPlaneError, OSError) unless the driver took the
    notice, an ``{"ok": false}`` reply included, so that the watcher reports
    it again at its next sighting instead of losing it.
    """
    from cloud_elastic.errors import ControlPlaneError

    def report(notice: Any) -> None:
        reply = client.call("notice", {
            "source": notice.source, "notice": notice.kind, "reason": notice.reason, "deadline": notice.deadline,
        }, timeout_s=timeout_s)
        if reply.get("ok") is not True:
            raise ControlPlaneError(f"the driver did not take the {notice.kind} notice ({notice.reason})")

    return report
