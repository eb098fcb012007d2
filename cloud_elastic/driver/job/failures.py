"""What a worker's failure costs the job, and whether the committed training state survives it.

:class:`Failures` decides, for the job:

* a worker that failed (:meth:`Failures.fail`: crashed, exited early, was
  killed, its host unreachable) has its slot blacklisted for a cooldown, or
  every slot of its host on a transport error (one outage is one failure of
  each slot, however many of the host's workers report it); a member's failure
  aborts its round; the last worker failing ends the job unless a durable
  checkpoint can bring the state back; with ``--whole-hosts`` a failure is the
  whole host's (every slot blacklisted, and its other workers leave with it);
  before the first round (nothing committed), a host that cannot be reached is
  one still booting, not a failed job: it is tried again at the shortest
  cooldown, counting no failure of its slots, while a worker that ran and
  failed counts as after it; either way ``--start-timeout`` from the driver's
  start bounds the wait for the first round (:meth:`.capacity.Capacity.check`);
  a slot whose worker fails :data:`.repeats.REPEATS` times in a row without progress is
  blacklisted for good, and the job ends when every worker was lost that many times
  in a row without progress in between, counting only failures of the worker's own
  doing (an exception, an exit code, a crash signal: not a SIGKILL or SIGTERM from
  outside, nor a host out of reach; see :mod:`.repeats`); every line
  carries the error the worker's script said it ended with;
* a worker given up (:meth:`Failures.give_up`: silent, never arrived, stuck) is
  stopped at once; a leaver given up costs its peers a rollback but no blacklisting;
  one given up while its process still ran (``hung``: stuck, or silent and then printing its stacks on the
  stop's signal, :meth:`Failures.signal_stacks`) :data:`.repeats.REPEATS` times in a row with no progress of
  the job in between ends the job (see :mod:`.repeats`: progress is a commit of a state not trained before);
* the committed state is never silently lost (:meth:`Failures.check_state_kept`):
  once no live worker holds it and no member is on its way back, the next round
  resumes from the latest checkpoint, or, without ``--checkpoint-dir``, the job
  fails at once with ``training state lost: ...``.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Hashable

from cloud_elastic.driver.job.actions import Phase, Stop
from cloud_elastic.driver.job.hosts import Slot, blocked_for
from cloud_elastic.driver.job.repeats import REPEATS, SILENT, Hangs, Streak, own_failure
from cloud_elastic.driver.job.stalls import main_frame
from cloud_elastic.driver.job.exit_status import signal_name
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["Failures"]

log = logging.getLogger(__name__)

#: The most silent workers whose stacks signal may be out at once (kept until their stop path reports).
_SIGNALS_OUT = 64

S = WorkerState
#: What a silent worker whose stacks signal is not armed was doing, as far as the driver can tell.
_UNARMED = f"{SILENT}, its stacks not asked for (no stacks signal armed in its process)"


class Failures:
    """Failures and the committed state of one job (see module docstring)."""

    def __init__(self, job: JobView, lost_leaver: Callable[[WorkerRecord, str, float], bool],
                 take_host_along: Callable[[WorkerRecord], None] = lambda w: None,
                 fixed_failed: Callable[..., bool] = lambda w, what, **how: False) -> None:
        """``lost_leaver(w, what, now)``: a draining worker was lost in its round (False: a fixed-size job took it as
        its failure); ``take_host_along(w)``: the other workers of ``w``'s host leave with it under ``--whole-hosts``
        (see :mod:`.leaving`);
        ``fixed_failed(w, what, exit_code=, transport=, was_member=)``: True when a fixed-size job takes the failure
        (no blacklisting, no abort: the whole attempt ends; see :mod:`.fixed_size`)."""
        self._job = job
        self._lost_leaver = lost_leaver
        self._take_host_along = take_host_along
        self._fixed_failed = fixed_failed
        self._state_lost_logged = False
        #: The highest worker number when every worker was last lost (a resumed attempt's workers are newer),
        #: the job's commit then, and the states checkpoint loads had given then (``Trained.loaded``).
        self._lost_mark, self._lost_at, self._lost_loaded = 0, -1, None
        self._lost_in_vain = Streak()  # every worker lost, in a row, each time without progress
        self._own_since_lost = False  # a worker failed of its own doing since every worker was last lost
        self._hangs = Hangs()  # workers given up while their process still ran, in a row without progress
        #: Workers given up for silence whose stacks signal is still out: how far the job had trained (the key, the
        #: commit) and the keys they would count at.
        self._silent: dict[str, tuple[Hashable, int, frozenset[Hashable]]] = {}
        #: The latest outage (see _together): the highest worker number when its first worker was given up as hung,
        #: the driver's running time then, and its number.
        self._outage: tuple[int, float, int] = (-1, -math.inf, 0)

    def _lost_again(self) -> int:
        """Every worker is lost, with checkpointing: how many times in a row that has now happened without
        progress. Where the states' fingerprints tell (:meth:`.repeats.Trained.loaded`), progress is what the
        checkpoints hold: the attempt just lost loaded a state no attempt had loaded before (the one before it
        stored a new one). What an attempt commits and loses with its workers is no progress: Horovod's loop
        resumed from the same checkpoint redoes the same batches and fails again. Otherwise (a state without plain
        attributes) it is the commit count: no progress when no worker of the resumed attempt made a commit of its
        own (its first is past the checkpoint it resumed from), or the job is lost at the same commit as the time
        before (a bug far past the checkpoint: each attempt commits up to it and fails there again). A loss counts
        only when a worker failed of its own doing since the last one (:func:`.repeats.own_failure`): a storm of
        reclaims that kills every worker again and again is not the script's, and the job resumes each time."""
        job = self._job
        mark, self._lost_mark = self._lost_mark, max((w.seq for w in job.workers.values()), default=0)
        at, self._lost_at = self._lost_at, job.commit_high
        loaded, self._lost_loaded = self._lost_loaded, job.trained.loaded()
        own, self._own_since_lost = self._own_since_lost, False
        if self._lost_loaded is not None:
            progressed = loaded != self._lost_loaded  # a new state loaded (or the first loss): progress
        else:
            progressed = at != job.commit_high and any(w.commits > 0 for w in job.workers.values() if w.seq > mark)
        if progressed:
            self._lost_in_vain.clear()
        return self._lost_in_vain.note("lost") if own else self._lost_in_vain.count

    def _every_slot_repeated(self) -> bool:
        """Every slot of the ready hosts is blacklisted for good for failing REPEATS times without progress (the
        slots of a job resumed again and again, each attempt lost there, reach it before the job's own count
        does when its attempts do not all fail together): a resume could only fail the same way."""
        hosts = self._job.hosts
        if hosts.blacklist.hi <= 0 or not hosts.ready:  # 0 0: one failure each, not a repeated one
            return False
        return all(hosts.blacklist.for_good(Slot(h, i)) for h, n in hosts.ready.items() for i in range(n))

    def _for_good(self, where: str, own: bool) -> str:
        """The last failure (``own``: of its worker's own doing) blocked ``where`` for the rest of the job: why, for
        its log line and for the job's end line (below --min-np, that names the ``last failure``)."""
        job = self._job
        why = (" (--blacklist-cooldown-range 0 0)" if job.hosts.blacklist.hi <= 0 else
               " (it already was)" if not own else
               f": it failed {REPEATS} times in a row {job.trained.none_between(job.commit_high)}")
        job.last_failure += f"; {where} is blacklisted for the rest of the job{why}"
        return why

    def fail(self, w: WorkerRecord, what: str, now: float, *, was_member: bool, transport: bool,
             exit_code: int | None = None) -> bool:
        """``w`` failed (``what`` says how); ``transport``: its host could not be reached. False when a fixed-size
        job took the failure as its attempt's (see :mod:`.fixed_size`)."""
        if self._fixed_failed(w, what, exit_code=exit_code, transport=transport, was_member=was_member):
            return False
        job = self._job
        hosts = job.hosts
        # The exception its script said it ended with, as a fixed-size job's lines carry it (.fixed_size).
        reason = f"worker {w.worker_id} ({w.label}) {what}" + (f": {w.error}" if w.error else "")
        job.last_failure = reason
        whole_host = transport or bool(job.policy.whole_host_slots)
        # A fresh VM is "running" minutes before sshd answers or cloud-elastic is installed: at start-up a
        # transport failure says the host is not ready yet, and the job waits for it (see Capacity.check),
        # trying it again at the shortest cooldown without counting a failure (Blacklist.retry_soon).
        # No round of this driver yet and no worker holding state (a resumed job's state is in its checkpoint).
        booting = transport and job.round == 0 and (not job.state_committed or job.resumed)
        # How far the job had trained (the states its commits held, or its commit: Trained.at): a slot failing
        # REPEATS times in a row there, each time of its worker's own doing, is blacklisted for good. A kill from
        # outside or a host out of reach does not count (None).
        own = own_failure(w.error, exit_code, transport)
        self._own_since_lost = self._own_since_lost or own
        at = job.trained.at(job.commit_high) if own else None

        def block(slot: Slot) -> float:
            if booting:
                return hosts.blacklist.retry_soon(slot, now)
            # Under 0 0 any failure of its worker, not only one of its own doing, blocks the slot for good.
            return hosts.blacklist.record_failure(slot, now, at, failed=not transport)

        if whole_host:
            host_slots = hosts.ready.get(w.slot.host, w.slot.index + 1)
            # One outage is one failure of each slot, however many of the host's workers report it.
            slots = [Slot(w.slot.host, i) for i in range(host_slots)]
            delays = [block(s) for s in slots if not hosts.blacklist.blocked(s, now)]
            # A host-mate's report of the same outage blocked them already: say how long they stay blocked.
            left = [t for s, t, _ in hosts.blacklist.blocked_slots(now) if s in slots]
            delay = max(delays, default=max(left, default=0.0))
            where = f"host {w.slot.host}"
        else:
            delay, where = block(w.slot), f"slot {w.slot}"
        if booting:
            log.warning("job %s: %s; %s not reachable yet: retried in %.0fs", job.job_id, reason, where, delay)
        else:
            why = self._for_good(where, at is not None) if delay == math.inf else ""
            log.warning("job %s: %s; %s blacklisted %s%s", job.job_id, reason, where, blocked_for(delay), why)
        # A negative code is a signal (Popen's convention): the schema has exit_code null and the signal's name.
        killed_by = signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None
        job.emit(
            "worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank, reason=what,
            exit_code=None if killed_by else exit_code, whole_host=whole_host,
            **({"blacklisted_s": None, "blacklisted_for_good": True} if delay == math.inf
               else {"blacklisted_s": round(delay, 1)}),
            **({"round": w.round} if w.round else {}), **({"signal": killed_by} if killed_by else {}),
            **({"booting": True} if booting else {}),
        )
        job.failure_since_round = True
        self._take_host_along(w)
        if was_member:
            # A spare failing in the same moment sets last_failure after this: the rollback names this (review h4).
            if job.abort_round < job.round:  # not already aborted for another cause (a stall, a leaver)
                job.abort_reason = job.abort_reason or reason
            job.abort()
        # Under --whole-hosts the failed worker's host-mates are leaving with it (just above): they are not
        # survivors. Counting them, a job whose every host had failed waited for --elastic-timeout instead
        # of ending, relaunching the hosts at each blacklist cooldown.
        gone = w.slot.host if job.policy.whole_host_slots else None
        survivors = [x for x in job.alive() if x.slot.host != gone]
        if not survivors and job.completed_workers == 0 and not booting:
            policy = job.policy
            if job.state_committed and policy.checkpointing:
                again = self._lost_again()
                if again >= REPEATS or self._every_slot_repeated():
                    job.end(False, f"every worker failed, {again} time(s) in a row at commit {job.commit_high}, "
                                   f"resuming from the checkpoint in between without getting further (resuming again "
                                   f"would fail the same way); last: {job.last_failure}", 1)
                    return
                log.warning(
                    "job %s: lost every worker; waiting up to %gs (--elastic-timeout) for --min-np %d slot(s), "
                    "then resuming from the latest checkpoint", job.job_id, policy.elastic_timeout_s, policy.min_np,
                )
            else:
                lost = "; the training state was lost with them (no --checkpoint-dir)" if job.state_committed else ""
                job.end(False, f"all workers failed; last: {reason}{lost}", 1)
        return True

    def give_up(self, w: WorkerRecord, what: str, now: float, *, stacks: bool = True) -> None:
        """Stop ``w`` at once as lost (silent, never arrived, stuck), with the failure path that applies;
        ``stacks``: its process is asked for its Python stacks (by signal) just before it is killed, unless it said
        that its stacks signal is not armed (the signal would run its script's own handler, or stop a wrapper)."""
        job = self._job
        armed = w.stacks_signal is not False
        was_member = w.member_of(job.round)
        before, why_leaving = w.state, w.why
        leaving = before in (S.DRAINING, S.EXITING)
        w.to(S.LOST, what)
        job.forget_alive()
        job.act(Stop(w.worker_id, what, immediate=True, stacks=stacks and armed))
        if not leaving and job.phase is not Phase.FINISHING:
            if self.fail(w, what, now, was_member=was_member, transport=False) and w.hung:
                # Workers given up together (one outage, every member of one stuck round) count once, however many
                # scans found them (see _together).
                at = (job.trained.at(job.commit_high), job.commit_high, self._together(w, now))
                if w.hung != SILENT:
                    self._hung(w, *at)
                elif not armed:  # its silence for the whole --heartbeat-timeout counts alone (signal_stacks)
                    w.hung = _UNARMED
                    self._hung(w, *at)
                elif stacks:  # it counts once it has printed its stacks on the stop's signal (signal_stacks)
                    self._silent[w.worker_id] = at
                    while len(self._silent) > _SIGNALS_OUT:  # a launcher that cannot signal never reports
                        del self._silent[next(iter(self._silent))]
            return
        if before is S.EXITING:
            # It had already left its round; only its process was slow to go.
            job.emit("worker_left", worker=w.worker_id, host=w.slot.host, slot=w.slot.index,
                     reason=f"{why_leaving or 'told to exit'}; its process then {what} and was stopped",
                     **({"round": w.round} if w.round else {}))
        elif before is S.DRAINING and not self._lost_leaver(w, what, now):
            return  # a fixed-size job took it as its attempt's failure: no round rolls back
        if was_member:
            job.abort()

    def _together(self, w: WorkerRecord, now: float) -> frozenset[Hashable]:
        """What ``w``, given up as hung at ``now``, counts as one with (:class:`.repeats.Hangs`): the round it was a
        member of (every member of one stuck round), and the outage it was given up in, whatever its host and round:
        the workers already launched when the outage's first worker was given up, given up within one
        --heartbeat-timeout of it (driver running time). One outage of several hosts (a network drop, a zone-wide
        blip) takes their workers' heartbeats away together, so all of them are given up within that time, in
        whatever order the scans find them, and a host's round member and its newcomer waiting for the next round
        match. A worker launched after that (the slot's worker relaunched after the give-up, whose set-up hangs the
        same way), or one given up later (it ran on past the outage), is a new hang, and counts again (keyed by the
        host alone, every later hang there matched the first and a fixed-size job ran on for good)."""
        job = self._job
        running = job.running(now)
        launched, since, outage = self._outage
        if w.seq > launched or running - since > job.policy.heartbeat_timeout_s:
            launched = max(x.seq for x in job.workers.values())
            since, outage = running, outage + 1
            self._outage = (launched, since, outage)
        keys: set[Hashable] = {("outage", outage)}
        if w.round:
            keys.add(("round", w.round))
        return frozenset(keys)

    def signal_stacks(self, w: WorkerRecord, text: str) -> None:
        """The stop path's word on ``w``, given up and asked for its stacks by signal, now killed: ``text`` is what it
        printed ("" for nothing; ``w.stacks_signal`` False: its process could not be asked). One given up for silence
        (for the whole --heartbeat-timeout) counts as a hang only now, and never if a heartbeat of its process came
        after its give-up (``w.heard_after_given_up``: a frozen host that thawed; a GIL-hung process cannot send one).
        Where its stacks signal is armed it counts only if it printed them: a process hung holding the GIL does
        (``faulthandler``'s handler needs no GIL), and the job's end line names its main thread's frame; a frozen
        host, or one whose network is down with its ssh session still open, prints nothing, and that outage is not
        its script's doing. Where it is not armed (the script handles SIGUSR1, a wrapper gets the signal) or its
        process cannot be asked, the silence itself counts: an outage longer than --heartbeat-timeout then counts
        too."""
        job = self._job
        at = self._silent.pop(w.worker_id, None)
        if at is None or job.outcome is not None or job.phase is Phase.FINISHING:
            return
        if w.heard_after_given_up:
            log.info("job %s: worker %s (%s), given up for silence, heartbeated again before its kill (its host "
                     "frozen or cut off, then back): not counted as a hang of its script", job.job_id, w.worker_id,
                     w.label)
            return
        if text:
            frame = main_frame(text, on_signal=True)
            if "cloud_elastic/worker/link/" in frame.replace("\\", "/"):
                # Waiting on the driver, in cloud-elastic's own link (a call whose answer never came): its heartbeats
                # were cut on the way, not held up by its script (a review cut the driver's port alone, by a proxy).
                log.info("job %s: worker %s (%s), given up for silence, was waiting on the driver (its main thread at "
                         "%s): its link to the driver was cut, not counted as a hang of its script", job.job_id,
                         w.worker_id, w.label, frame)
                return
            w.hung = f"{SILENT}, its main thread at {frame}" if frame else f"{SILENT}, its main thread's frame unknown"
        elif w.stacks_signal is False:
            w.hung = _UNARMED
        else:
            log.info("job %s: worker %s (%s), given up for silence, printed no stacks on the signal (its host frozen "
                     "or out of reach): not counted as a hang of its script", job.job_id, w.worker_id, w.label)
            return
        self._hung(w, *at)

    def _hung(self, w: WorkerRecord, at: Hashable, commit: int, together: frozenset[Hashable]) -> None:
        """``w`` was given up while its process still ran (``w.hung`` says what it was doing) with the job at
        ``commit``, trained that far (``at``: :meth:`.repeats.Trained.at`), as part of ``together`` (its round and
        outage: :meth:`_together`): the :data:`.repeats.REPEATS`-th time in a row with no progress of the job in
        between ends the job, through the failing end (its newest commit checkpointed first). The slot itself only
        cools down, as after any give-up."""
        job = self._job
        times = self._hangs.given_up(at, together, w.worker_id, w.slot.host, str(w.slot))
        if job.outcome is not None:
            return
        if times < REPEATS:
            if times:
                log.warning("job %s: worker %s (%s) was given up while its process still ran (%s): %d of %d in a row "
                            "at commit %d before the job ends", job.job_id, w.worker_id, w.label, w.hung, times,
                            REPEATS, commit)
            return
        job.end(False, self._hangs.line(f"{w.slot} ({w.label})", commit, times, w.hung, job.trained.nothing), 1)

    def check_state_kept(self) -> None:
        """Fail at once when the committed state is gone and nothing can bring it back."""
        job = self._job
        if not job.state_committed or job.phase is not Phase.RUNNING:
            return
        if any(w.holds_state for w in job.alive() if w.state is not S.EXITING):
            return
        if job.members():
            return  # members still on their way back will report their commits at rendezvous
        if job.policy.checkpointing:
            if not self._state_lost_logged:
                self._state_lost_logged = True
                log.warning(
                    "job %s: every worker that held the training state is gone; the next round resumes "
                    "from the latest checkpoint once --min-np %d worker(s) are ready",
                    job.job_id, job.policy.min_np,
                )
            return
        last = f" (last failure: {job.last_failure})" if job.last_failure else ""
        reason = self.commits_lost_reason() or ("every worker that held committed state is gone, and without "
                                                "--checkpoint-dir nothing can bring it back")
        job.end(False, f"training state lost: {reason}{last}", 1)

    def commits_lost_reason(self) -> str:
        """Why the state is lost when workers survive that could not restore their commit ('' if none did)."""
        if not any(w.commit_lost for w in self._job.alive()):
            return ""
        # The workers report only that they cannot (holds_commit); each one's log line says why.
        return ("no survivor could restore the last commit exactly (each one logged why: a peer failed in a "
                "collective between an in-place optimizer update and the next commit, or before the update of the "
                "step in which a parameter was first changed in place outside the optimizer, which "
                "CLOUD_ELASTIC_COMMIT_MODE=snapshot avoids by keeping every commit whole from the start; or the "
                "survivor was a newcomer still receiving the commit in a follow window, which "
                "CLOUD_ELASTIC_FOLLOW=0 avoids by giving newcomers the whole state before they train), and without "
                "--checkpoint-dir nothing can bring it back")
