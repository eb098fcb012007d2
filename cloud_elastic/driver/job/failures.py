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
* a worker given up (:meth:`Failures.give_up`: silent, never arrived, stuck) is
  stopped at once; a leaver given up costs its peers a rollback but no blacklisting;
* the committed state is never silently lost (:meth:`Failures.check_state_kept`):
  once no live worker holds it and no member is on its way back, the next round
  resumes from the latest checkpoint, or, without ``--checkpoint-dir``, the job
  fails at once with ``training state lost: ...``.
"""

from __future__ import annotations

import logging
from typing import Callable

from cloud_elastic.driver.job.actions import Phase, Stop
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.exit_status import signal_name
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["Failures"]

log = logging.getLogger(__name__)

S = WorkerState


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

    def fail(self, w: WorkerRecord, what: str, now: float, *, was_member: bool, transport: bool,
             exit_code: int | None = None) -> None:
        """``w`` failed (``what`` says how); ``transport``: its host could not be reached."""
        if self._fixed_failed(w, what, exit_code=exit_code, transport=transport, was_member=was_member):
            return
        job = self._job
        hosts = job.hosts
        reason = f"worker {w.worker_id} ({w.label}) {what}"
        job.last_failure = reason
        whole_host = transport or bool(job.policy.whole_host_slots)
        # A fresh VM is "running" minutes before sshd answers or cloud-elastic is installed: at start-up a
        # transport failure says the host is not ready yet, and the job waits for it (see Capacity.check),
        # trying it again at the shortest cooldown without counting a failure (Blacklist.retry_soon).
        # No round of this driver yet and no worker holding state (a resumed job's state is in its checkpoint).
        booting = transport and job.round == 0 and (not job.state_committed or job.resumed)
        block = hosts.blacklist.retry_soon if booting else hosts.blacklist.record_failure
        if whole_host:
            host_slots = hosts.ready.get(w.slot.host, w.slot.index + 1)
            # One outage is one failure of each slot, however many of the host's workers report it.
            slots = [Slot(w.slot.host, i) for i in range(host_slots)]
            delays = [block(s, now) for s in slots if not hosts.blacklist.blocked(s, now)]
            # A host-mate's report of the same outage blocked them already: say how long they stay blocked.
            left = [t for s, t, _ in hosts.blacklist.blocked_slots(now) if s in slots]
            delay = max(delays, default=max(left, default=0.0))
            log.warning("job %s: %s; host %s %s %.0fs", job.job_id, reason, w.slot.host,
                        "not reachable yet: retried in" if booting else "blacklisted for", delay)
        else:
            delay = hosts.blacklist.record_failure(w.slot, now)
            log.warning("job %s: %s; slot %s blacklisted for %.0fs", job.job_id, reason, w.slot, delay)
        # A negative code is a signal (Popen's convention): the schema has exit_code null and the signal's name.
        killed_by = signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None
        job.emit(
            "worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank, reason=what,
            exit_code=None if killed_by else exit_code, blacklisted_s=round(delay, 1), whole_host=whole_host,
            **({"round": w.round} if w.round else {}), **({"signal": killed_by} if killed_by else {}),
            **({"booting": True} if booting else {}),
        )
        job.failure_since_round = True
        self._take_host_along(w)
        if was_member:
            job.abort()
        # Under --whole-hosts the failed worker's host-mates are leaving with it (just above): they are not
        # survivors. Counting them, a job whose every host had failed waited for --elastic-timeout instead
        # of ending, relaunching the hosts at each blacklist cooldown.
        gone = w.slot.host if job.policy.whole_host_slots else None
        survivors = [x for x in job.alive() if x.slot.host != gone]
        if not survivors and job.completed_workers == 0 and not booting:
            policy = job.policy
            if job.state_committed and policy.checkpointing:
                log.warning(
                    "job %s: lost every worker; waiting up to %gs (--elastic-timeout) for --min-np %d slot(s), "
                    "then resuming from the latest checkpoint", job.job_id, policy.elastic_timeout_s, policy.min_np,
                )
            else:
                lost = "; the training state was lost with them (no --checkpoint-dir)" if job.state_committed else ""
                job.end(False, f"all workers failed; last: {reason}{lost}", 1)

    def give_up(self, w: WorkerRecord, what: str, now: float, *, stacks: bool = True) -> None:
        """Stop ``w`` at once as lost (silent, never arrived, stuck), with the failure path that applies;
        ``stacks``: its process is asked for its Python stacks (by signal) just before it is killed."""
        job = self._job
        was_member = w.member_of(job.round)
        before, why_leaving = w.state, w.why
        leaving = before in (S.DRAINING, S.EXITING)
        w.to(S.LOST, what)
        job.forget_alive()
        job.act(Stop(w.worker_id, what, immediate=True, stacks=stacks))
        if not leaving and job.phase is not Phase.FINISHING:
            self.fail(w, what, now, was_member=was_member, transport=False)
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
                "step in which a parameter was first changed in place outside the optimizer; "
                "CLOUD_ELASTIC_COMMIT_MODE=snapshot keeps every commit whole from the start), and without "
                "--checkpoint-dir nothing can bring it back")
