"""A script without ``hvd.elastic.run``: the job runs it as a fixed-size job.

Most Horovod scripts call ``hvd.init()``, wrap the optimizer and broadcast the
parameters, and never enter ``hvd.elastic.run``: nothing in them can roll back
to a commit or take a newcomer in. Such a worker says so as its script ends:
its exit hook sends ``completed`` with ``elastic`` false (see
``WorkerContext._at_exit``), whether the script returned or raised, before its
exit status reaches the driver. A worker inside ``hvd.elastic.run`` says so in
every heartbeat (``PollRequest.elastic``, :meth:`FixedSize.entered`): once any
worker has (only that: a worker refuses ``state.commit()`` outside ``elastic.run``,
so a commit alone decides nothing), the job is elastic, and a worker whose script ended before entering it only failed in
its set-up: its exit is judged as any elastic worker's (its slot cools down, the
others go on down to ``--min-np``). A heartbeat comes within the poll hold
(half a second by default), so a worker that fails sooner after its peers
entered is judged before they are known elastic; a worker entering it while no
failure or exit 0 of the attempt has been judged yet still makes the job
elastic. From the first such report while no worker entered ``elastic.run``,
:class:`FixedSize` decides, for the job:

* **nothing grows or re-forms** while the attempt's round runs: no launch, no
  new round (:meth:`FixedSize.step` answers True and the job's step stops there);
* **success** is every member of the round exiting 0: the job then succeeds,
  and workers that never joined are stopped;
* **failure**: the first failure of a member of the attempt's round (an exit
  other than 0, a worker killed or given up, a member back at rendezvous once
  a member's script ended in the attempt: its group did not form or a
  collective failed, and no round re-forms for it to finish its script in
  (before any member's script ended, in a restarted attempt as in the first,
  its round re-forms instead); a failure seen before the first report counts
  too, since the others' collectives fail after it) is the job's reason. A
  member's ``CollectiveError`` (its view of a lost peer) is never the reason
  when another member failed otherwise (a signal, another exception, an exit
  without a report): such a failure replaces it, and the job waits up to
  :data:`ROOT_CAUSE_WAIT_S` for one. A
  worker outside the round (a ``--spares`` spare, one still starting) that
  fails is blacklisted as in an elastic job, and does not end the attempt
  (nothing is launched while the attempt's round runs). No slot is
  blacklisted: the script, not the slot, ends the attempt. The job fails with
  that reason at once, or, with ``--restarts N``
  (``Policy.restarts``), every worker is stopped and, once all are gone, the
  job starts again from its first round on ``-np`` slots, up to N times (as
  torchrun's ``--max-restarts``). A restarted script resumes only from a
  checkpoint it writes and loads itself; the driver says so in its log;
* **a noticed host** (a spot interruption) cannot shrink the job: its worker drains as any member does,
  but its script cannot leave at a commit, so once the job is known fixed-size its end is judged here
  (``ElasticJob.exited``, and ``Leavers.lost_leaver`` for one removed by force at its host's deadline or
  silent): exit 0 is its success, anything else the attempt's failure, with no round aborted;
* **progress is never silently reset**: a job in which a worker ever committed
  training state (through ``elastic.run``) is not restarted from the script's
  start, since that would train from initial weights over the committed state;
  it fails with its reason instead. A job resumed from a ``--checkpoint-dir``
  checkpoint whose workers all exit 0 without entering ``elastic.run`` (which is
  what loads it) fails too: none of them loaded it.

A command that never calls ``hvd.init()`` (``hostname``, ``python -c 1``) never
registers, so it sends no report. Its worker exiting 0 unregistered is a *plain
exit* (:meth:`FixedSize.exited` with ``connected`` false): while every worker of
the job does the same, nothing is launched, and once none is left the job
succeeds, as ``horovodrun`` or ``mpirun`` would run the command (on every worker
launched: ``--max-np``'s and ``--spares``' slots too, since none can be known a
plain command's before one exits; the line says how many ran it beyond ``-np``),
with one line saying the command never connected (nothing elastic happened: there is no
training state to protect). It stays a failure (:meth:`FixedSize.early_exit`
says which) when the job has state a command that never connects cannot have
kept: ``--checkpoint-dir`` (it neither loaded nor saved a checkpoint), a commit,
a restarted driver's job; or when another worker of the job connected or failed
(a mix: the elastic rules judge the job, and earlier plain exits' slots are
launched again). A worker whose host could not be reached before it connected
(an SSH failure: a host still booting, see ``Failures.fail``) is no such mix:
its slot is tried again as any booting host's, and only such slots are launched
on while the plain exits stand (:meth:`FixedSize.plain_retries`), so the command
runs once a slot, and the job ends once nothing is left to run it.

Pure logic: no clock, thread or socket; ``now`` is passed in.
"""

from __future__ import annotations

import logging

from cloud_elastic.driver.job.actions import Phase, Stop
from cloud_elastic.driver.job.exit_status import ExitStatus, reported_error_line, signal_name
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["FixedSize", "FIXED_SIZE"]

log = logging.getLogger(__name__)

S = WorkerState

#: How the job's messages name this mode.
FIXED_SIZE = "a fixed-size job: no worker entered hvd.elastic.run"

#: What a worker that exited 0 without ever registering did, in the job's messages.
NEVER_CONNECTED = "exited with code 0 without ever connecting to the driver (its command never called hvd.init())"

#: How long the job waits, after a failure, for the exit of the worker whose script reported its error
#: first (the root cause: its peers fail only when its sockets close), so that its error is the reason.
ROOT_CAUSE_WAIT_S = 2.0


class FixedSize:
    """The fixed-size mode of one job (see module docstring)."""

    def __init__(self, job: JobView) -> None:
        self._job = job
        #: The job runs a script without elastic.run (known from the first worker's report).
        self.known = False
        #: A worker said it entered elastic.run (its heartbeat): the job is elastic (see :meth:`entered`).
        self.elastic = False
        #: Restarts made so far (``--restarts``).
        self.restarts = 0
        self._failure: str | None = None  # the first failure of the current attempt
        self._failure_of: str | None = None  # the worker whose failure that is
        self._weak = False  # that failure is a CollectiveError's: a survivor's view of a lost peer (see _collective)
        self._failure_seen: float | None = None  # when the job's step first saw it
        self._root_before: str | None = None  # the first worker to report an error, before that failure
        self._errors: dict[str, str] = {}  # worker id -> the error its script ended with (from its report)
        self._member_failure: str | None = None  # the last failure of a round member before the first report
        self._succeeded = 0  # members of the current attempt that exited 0
        self._ended = False  # a member's script ended in the current attempt (its report or its exit 0)
        self._plain: set[str] = set()  # workers that exited 0 unregistered while no other worker did otherwise
        self._unreached: set[str] = set()  # workers whose host could not be reached before they connected (booting)

    # ---------------------------------------------------------------- reports
    def entered(self, worker_id: str) -> None:
        """``worker_id``'s heartbeat says it has entered ``hvd.elastic.run``: the job is elastic.

        Where a report already made the job fixed-size but nothing of the attempt was judged as such yet (no
        failure, no exit 0, no restart), the job is elastic after all: the exits to come are judged as an
        elastic job's."""
        if self.elastic:
            return
        self.elastic = True
        if self.known and self._failure is None and self._succeeded == 0 and self.restarts == 0:
            self.known, self._ended = False, False
            log.info("job %s: worker %s entered hvd.elastic.run: the job is elastic after all (a worker that "
                     "ended before entering it failed in its set-up)", self._job.job_id, worker_id)

    def script_ended(self, w: WorkerRecord, error: str | None) -> tuple[str, str]:
        """``w``'s script ended before entering ``elastic.run`` (its exit status follows).

        Answers the ``completed`` reply: ``done`` (the worker is exiting anyway).
        """
        job = self._job
        if error:
            w.error = self._errors[w.worker_id] = reported_error_line(error)  # the failure's lines name it
        if self.elastic:
            # Another worker entered elastic.run: an elastic job, in whose set-up w ended (or failed). Its exit is
            # judged as any elastic worker's. Only a worker's entering decides: a commit does not (a worker refuses
            # one outside elastic.run; an older one's, or a resumed job's checkpoint, says nothing of this script).
            log.info("job %s: worker %s (%s) ended before entering hvd.elastic.run, which another worker entered: "
                     "its exit is judged as any elastic worker's", job.job_id, w.worker_id, w.label)
            return "done", ""
        if w.round == job.round > 0:
            self._ended = True
        if not self.known:
            self.known = True
            # A member's failure seen before the first report (a worker killed: no report) is this attempt's;
            # a spare's, or a worker's that never joined, is not (it was blacklisted and replaced).
            self._failure = self._member_failure
            restarts = job.policy.restarts
            log.info("job %s: worker %s ended before entering hvd.elastic.run, and no worker has entered it: the "
                     "job runs as a fixed-size job, as torchrun would. It succeeds when every worker exits 0; no "
                     "worker is replaced or added, and a failure %s", job.job_id, w.worker_id,
                     f"restarts the whole job (--restarts {restarts})" if restarts
                     else "fails the job (--restarts N would restart it)")
        return "done", ""

    # ------------------------------------------------------------------ exits
    def exited(self, w: WorkerRecord, status: ExitStatus, was_member: bool = True, *, connected: bool = True) -> bool:
        """A live, staying worker's process ended in a fixed-size job; False when this mode does not apply.

        Exit 0 is the worker's success; anything else is the attempt's failure (:meth:`failed`), when
        ``was_member`` (a member of the attempt's round). ``connected`` False: it never registered, and
        an exit 0 of it may be a plain command's (see module docstring).
        """
        if not self.known:
            if not connected and status.transport_error is not None:
                self._unreached.add(w.worker_id)  # its host not up yet: not a mix (see the module docstring)
            return not connected and _clean(status) and self._plain_exit(w)
        if _clean(status):
            job = self._job
            if w.round == job.round and w.round > 0:
                self._succeeded += 1
                self._ended = True
            log.info("job %s: worker %s (%s) finished its script (exit 0)", job.job_id, w.worker_id, w.label)
            return True
        exit_code = status.code if status.known else None
        return self.failed(w, status.describe, exit_code=exit_code, transport=status.transport_error is not None,
                           was_member=was_member)

    def failed(self, w: WorkerRecord, what: str, *, exit_code: int | None = None, transport: bool = False,
               was_member: bool = True) -> bool:
        """``w`` failed (exited other than 0, was killed, given up) in a fixed-size job; False when this mode
        does not apply. The first failure of a member of the attempt's round becomes its reason; nothing is
        blacklisted, so ``transport`` (its host unreachable) changes nothing here. A worker outside the round
        (a spare, one still starting) fails as in an elastic job: blacklisted, and no end of the attempt."""
        if not was_member:
            return False
        job = self._job
        error = self._errors.get(w.worker_id)
        reason = f"worker {w.worker_id} ({w.label}) {what}" + (f": {error}" if error else "")
        if not self.known:
            self._member_failure = reason
            return False
        job.last_failure = reason
        first, weak = self._failure is None, _collective(error)
        if first:
            self._root_before = self._root()
        # The root cause is a worker whose script had reported its error before the first failure was seen (its
        # peers' collectives fail only once its process closes its sockets, and their exits may be reaped before
        # its own), or any failure other than a peer's CollectiveError (a signal leaves no report).
        if first or (self._weak and not weak) or (w.worker_id == self._root_before and self._failure_of != w.worker_id):
            first = True
            self._failure, self._failure_of, self._weak = reason, w.worker_id, weak
        (log.error if first else log.info)("job %s: %s%s", job.job_id, reason,
                                           "" if first else " (after the first failure, above)")
        killed_by = signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None
        job.emit("worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank, reason=what,
                 exit_code=None if killed_by else exit_code, blacklisted_s=None,
                 **({"round": w.round} if w.round else {}), **({"signal": killed_by} if killed_by else {}))
        return True

    def early_exit(self, status: ExitStatus, connected: bool) -> str:
        """How the exit of a worker whose training function had not returned reads, as a failure."""
        if status.code != 0 or status.transport_error:
            return status.describe
        if connected:
            return "exited with code 0 before its training function returned"
        return NEVER_CONNECTED + "; " + (self._protected() or "other workers of the job connected or failed")

    def _protected(self) -> str:
        """Why a command that never connects cannot succeed in this job ('' when it can)."""
        job = self._job
        if job.policy.checkpointing:
            return "with --checkpoint-dir that is no success: it neither loaded nor saved a checkpoint"
        if job.state_committed or job.resumed:
            return "the job holds committed training state that the command never loaded"
        return ""

    def _plain_exit(self, w: WorkerRecord) -> bool:
        """``w`` exited 0 without registering: True when the job takes it as a plain command's worker."""
        job = self._job
        self._plain.add(w.worker_id)
        if self._protected() or self._mixed():
            self._plain.discard(w.worker_id)
            return False
        log.info("job %s: worker %s %s", job.job_id, w.worker_id, NEVER_CONNECTED)
        return True

    def _mixed(self) -> bool:
        """Some worker did other than exit 0 unregistered (it connected, failed, is being stopped)."""
        plain, unreached = self._plain, self._unreached
        return any(w.state is not S.STARTING and w.worker_id not in plain and w.worker_id not in unreached
                   for w in self._job.workers.values())

    def plain_retries(self) -> set[tuple[str, int]] | None:
        """While the plain-command rules hold (a worker exited 0 unregistered, none did otherwise): the slots the job
        may launch on, those whose worker could not be reached (its host booting) and that no worker runs on or ran
        the command on; None when the rules do not hold (every free slot may be launched on)."""
        if not self._plain or self.known:
            return None
        workers = self._job.workers.values()
        taken = {(w.slot.host, w.slot.index) for w in workers if w.state is not S.EXITED or w.worker_id in self._plain}
        return {(w.slot.host, w.slot.index) for w in workers if w.worker_id in self._unreached} - taken

    def _plain_step(self) -> bool:
        """The plain-command rules at each step while workers exited 0 unregistered (see :meth:`step`)."""
        job = self._job
        if self._mixed():
            log.warning("job %s: %d worker(s) %s, but other workers of the job connected or failed: the job is "
                        "judged by its other rules, and their slots may be launched again", job.job_id,
                        len(self._plain), NEVER_CONNECTED)
            self._plain = set()
            return False
        if self.plain_retries():
            return False  # a booting host's slot waits for its retry: launched on alone (Capacity.plan_launches)
        if job.alive():
            return True  # the others are still starting: no launch in the meantime
        beyond = len(self._plain) - job.policy.num_proc  # --max-np's and --spares' slots run the command too
        job.end(True, f"every worker ({len(self._plain)}) {NEVER_CONNECTED}: the job ran it as a plain command "
                      "(nothing elastic happened)" + (
                          f"; {beyond} of them beyond -np {job.policy.num_proc}: every worker launched runs it, "
                          "on the slots of --max-np and --spares too" if beyond > 0 else ""), 0)
        return True

    # ------------------------------------------------------------------- step
    def step(self, now: float) -> bool:
        """The fixed-size rules at each step of the job: True while the attempt's round runs or is being
        stopped (no launch, no new round), False when it does not apply or the job may form a round."""
        job = self._job
        if job.phase is Phase.DONE:
            return False
        if self._plain and self._plain_step():
            return True
        if not self.known:
            return False
        if self._failure is None and self._ended:
            self._came_back()
        if self._failure is not None:
            return self._after_failure(now)
        if job.members():
            return True
        if self._succeeded == 0:
            return False  # no round of this attempt yet (a restart): launches and the first round go on
        # Every member exited 0. Workers that never joined are stopped with the job (Finish).
        if job.resumed:
            job.end(False, f"every worker ({self._succeeded}) exited 0 without entering hvd.elastic.run, so none "
                           f"loaded the checkpoint this job resumes from; whatever the script trained started from "
                           f"its initial weights: not a success ({FIXED_SIZE}). The checkpoint is kept: run the "
                           "script that wrote it (with hvd.elastic.run), or use a new --checkpoint-dir", 1)
            return True
        after = f" after {self.restarts} restart(s)" if self.restarts else ""
        job.end(True, f"training completed on {self._succeeded} worker(s), every one exiting 0{after} "
                      f"({FIXED_SIZE})", 0)
        return True

    def _came_back(self) -> None:
        """Once a member's script ended in this attempt, a member of its round back at rendezvous fails the
        attempt: nothing re-forms, so it would never finish its script, and the others' exits 0 must not pass
        for the job's success. Before that (a restarted attempt's group that did not form: a transient Gloo
        failure, a peer killed in ``hvd.init``) the round re-forms as in the first attempt."""
        job = self._job
        w = next((w for w in job.alive() if w.state is S.WAITING and w.round == job.round > 0), None)
        if w is not None:
            self.failed(w, f"came back to rendezvous from round {w.round} (reason {w.rdzv_reason}): its process "
                           "group did not form on every rank or a collective failed, and a fixed-size job forms no "
                           "new round for it")

    def _root(self) -> str | None:
        """The worker whose script reported an error first in this attempt, a CollectiveError aside (None: none)."""
        return next((i for i, error in self._errors.items() if not _collective(error)), None)

    def _after_failure(self, now: float) -> bool:
        job = self._job
        if self._failure_seen is None:
            self._failure_seen = now
        root = self._root_before
        if root == self._failure_of:
            root = None
        # A peer's CollectiveError: the lost member's own exit (a signal leaves no report) may be reaped next.
        others = self._weak and any(w.worker_id != self._failure_of and w.round == job.round for w in job.alive())
        if (others or root is not None and any(w.worker_id == root for w in job.alive())) and \
                now - self._failure_seen < ROOT_CAUSE_WAIT_S:
            return True  # the worker that reported its error first, or the one the failed collective lost, is exiting
        reason = self._failure
        if self._weak and root is not None:  # its process is slow to exit: its error is still the root cause
            reason = (f"worker {root} ({job.workers[root].label}) ended its script with {self._errors[root]} (its "
                      f"process had not exited {ROOT_CAUSE_WAIT_S:g}s later)")
        limit = job.policy.restarts
        if self.restarts >= limit or job.state_committed:
            why = ""
            if self.restarts < limit:
                why = ("; not restarted: workers had committed training state, which a restart from the script's "
                       "start would silently lose")
            elif limit:
                why = f"; no restart left (--restarts {limit})"
            job.end(False, f"{reason} ({FIXED_SIZE}){why}", 1)
            return True
        stopping = [w for w in job.alive() if w.state is not S.EXITING]
        if stopping:
            log.warning("job %s: %s fails with a worker: stopping every worker for restart %d of %d (--restarts)",
                        job.job_id, FIXED_SIZE.split(":")[0], self.restarts + 1, limit)
        for w in stopping:
            w.to(S.EXITING, "the fixed-size job restarts after a failure")
            job.act(Stop(w.worker_id, "the fixed-size job restarts after a failure"))
        job.forget_alive()
        if job.alive():
            return True  # wait until every worker of the failed attempt is gone
        self.restarts += 1
        self._failure, self._failure_of, self._failure_seen, self._root_before = None, None, None, None
        self._weak = False
        self._errors, self._succeeded, self._member_failure, self._ended = {}, 0, None, False
        job.phase = Phase.STARTING
        log.warning("job %s: restart %d of %d: every worker starts the script again (after: %s). It resumes "
                    "only from a checkpoint the script itself writes and loads; without one it trains from the "
                    "start", job.job_id, self.restarts, limit, reason)
        return False


def _collective(error: str | None) -> bool:
    """A script ended with ``CollectiveError`` (Horovod's ``HorovodInternalError``): a survivor's view of a lost peer."""
    return bool(error) and error.split(":", 1)[0].strip() in ("CollectiveError", "HorovodInternalError")


def _clean(status: ExitStatus) -> bool:
    """The process exited 0, as reported by the launcher that started it."""
    return status.code == 0 and status.known and status.transport_error is None
