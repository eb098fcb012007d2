"""The elastic job as a state machine: the driver's every decision, no I/O.

:class:`ElasticJob` is fed events (discovery snapshots, notices, worker
messages, process exits, clock ticks) with the current time, and answers with
replies and queued :data:`Action` objects that the runtime (:mod:`cloud_elastic.driver.runtime`)
carries out. It starts no thread, opens no socket and reads no clock of its
own, so every rule is tested alone with scripted timelines.

It is assembled from small pieces, each tested on its own:

* :mod:`.workers` — one worker's life as an explicit state machine;
* :mod:`.plan` and :mod:`.ranks` — who forms the next round, in which rank order, and whether
  it syncs or must load a checkpoint (a pure function);
* :mod:`.formation` — when a round forms, the update requests that lead to one, and the rollback it
  reports; :mod:`.partitions` — a round that keeps failing to form, cut smaller or ended;
* :mod:`.leaving` — notices, draining hosts, their deadlines, giving them back;
* :mod:`.capacity` — launches, and the ``min_np`` and start timeouts;
* :mod:`.completion` — how the job completes, early returns, and the
  no-progress watch;
* :mod:`.adoption` — a restarted driver adopting its predecessor's workers;
* :mod:`.failures` — what a failure costs (blacklisting, an aborted round),
  and whether the committed state survives it;
* :mod:`.fixed_size` — a script without ``hvd.elastic.run``, run as a fixed-size job
  (success when every worker exits 0; a failure ends or restarts the job);
* :mod:`.liveness` — worker silence measured only over time the driver ran, and which workers are overdue;
* :mod:`.hosts` — host order, the per-slot blacklist, hosts missing from
  discovery for less than the grace, draining hosts and their deadlines;
* :mod:`.discovery_edge` — discovery's snapshots and failures, and the hosts missing
  past the grace whose workers are kept (the last holders of the state, ``--min-np``);
* :mod:`.stalls` — a collective some members wait in and others have not
  completed: the culprit named, and the evidence the fast silence rule needs;
* :mod:`.health` and :mod:`.links` — stragglers, failed self-tests and slow
  networks, drained without a rollback;
* :mod:`.spares` — workers beyond the target size waiting at rendezvous, and
  which of them a round takes;
* :mod:`.sourcing` — several host sources: the choice rule, the fallback and
  what the job costs;
* :mod:`.notice_policy` — which worker watches for notices, soft or hard;
* :mod:`.ending` — a failure while a live worker holds a commit newer than the last checkpoint: that commit is
  checkpointed first, through :mod:`.stopping`'s graceful stop.

The pieces own their state; what they share (workers, round, phase, the
queues) is this module's, and they see it through :class:`~.view.JobView`.
What stays here is the job's entry points (a worker's messages and exits,
discovery, ticks), aborting a round, ending the job, and the step that runs
every piece's checks in order; the shared state itself, with the queues and
the lists of workers a step asks for, is :mod:`.job_state`'s.

Progress is never silently lost: the driver knows which workers hold committed
state (they report their commits), rank 0 is always one of them, and when none
is left the job resumes from a durable checkpoint or fails with a clear error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cloud_elastic.driver.job.actions import Action, Finish, Launch, Phase, Policy, Release, Stop
from cloud_elastic.driver.job.capacity import PROGRESS_EVERY_S, Capacity
from cloud_elastic.driver.job.completion import EARLY_RETURN_WAIT_S, STACKS_WAIT_S, Completion
from cloud_elastic.driver.job.discovery_edge import DiscoveryEdge
from cloud_elastic.driver.job.ending import FailingEnd
from cloud_elastic.driver.job.failures import Failures
from cloud_elastic.driver.job.fixed_size import FixedSize
from cloud_elastic.driver.job.formation import RoundFormation
from cloud_elastic.driver.job.health import Health
from cloud_elastic.driver.job.hosts import Slot, blocked_s
from cloud_elastic.driver.job.exit_status import ExitStatus, signal_name
from cloud_elastic.driver.job.job_state import MEMBER, JobState
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.driver.job.liveness import SilenceWatch
from cloud_elastic.driver.job.stalls import main_frame
from cloud_elastic.driver.job.stopping import GracefulStop
from cloud_elastic.driver.job.adoption import Adoption
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import AdoptRequest, Assignment, ExitOrder, LinkReport, PollReply
from cloud_elastic.providers.api import DiscoveredHosts, Drain

__all__ = [
    "Policy", "Phase", "WorkerState", "WorkerRecord", "Launch", "Stop", "Release", "Finish", "Action",
    "Assignment", "ExitOrder", "PollReply", "ElasticJob", "PROGRESS_EVERY_S", "EARLY_RETURN_WAIT_S", "STACKS_WAIT_S",
]

log = logging.getLogger(__name__)

S = WorkerState


@dataclass
class ElasticJob(JobState):
    """Pure state machine of one elastic job (see module docstring); its shared state is :class:`.JobState`'s."""

    def __post_init__(self) -> None:
        policy = self.policy
        self.silence = SilenceWatch(policy.heartbeat_timeout_s, policy.start_timeout_s, self.emit,
                                    lambda: self.job_id)  # read when it logs: a resumed job takes its checkpoint's id
        self.fixed = FixedSize(self)
        self.leavers = Leavers(self, self.fixed.failed)
        self.capacity = Capacity(self, self.leavers.send_away, self.fixed)
        self.rounds = RoundFormation(self, self.leavers, on_formed=lambda running: self.completion.round_formed(running))
        self.completion = Completion(self, self.rounds.rank0, self.leavers.take_host_along)
        self.adoption = Adoption(self, self.capacity.seen, self.rounds.adopt_round, self.completion.completed)
        self.failures = Failures(self, self.leavers.lost_leaver, self.leavers.take_host_along, self.fixed.failed)
        self.health = Health(self, self.leavers, self.capacity)
        self.discovery = DiscoveryEdge(self, self.leavers.lapsed, self.leavers.send_away)
        self.stopping = GracefulStop(self, self.leavers, self.rounds, self._finish, lambda: self.fixed.elastic)
        self.failing = FailingEnd(self, self.stopping, self.leavers)
        if self.resumed:
            if not self.policy.checkpointing:
                raise ValueError("a resumed job needs checkpointing (it starts from a durable checkpoint)")
            self.state_committed = True

    @property
    def notice_sources(self) -> dict[str, str]:
        """Host -> where its latest notice came from (for status)."""
        return self.leavers.sources

    @property
    def adopting(self) -> bool:
        """A restarted driver adopts the running workers of its predecessor (see :meth:`adopt`)."""
        return self.adoption.open

    @adopting.setter
    def adopting(self, value: bool) -> None:
        self.adoption.open = value

    @property
    def stacks_gen(self) -> int:
        """The latest stacks request (a worker is asked by giving it this number; see worker.link.progress)."""
        return self.completion.stacks_gen

    # ------------------------------------------------------------------ events
    def start(self, now: float, wall_now: float | None = None) -> None:
        """The driver is up; start timers. ``wall_now`` (Unix time) relates drain deadlines to ``now``."""
        self.capacity.started_at = now
        self.wall_offset = (wall_now if wall_now is not None else now) - now
        self._clock(now)

    def discovered(self, snapshot: DiscoveredHosts, now: float) -> None:
        """A discovery snapshot arrived (see :mod:`.discovery_edge`)."""
        self.discovery.discovered(snapshot, now)
        self._step(now)

    def notice(self, host: str, drain: Drain, now: float, *, source: str, soft: bool = False,
               watcher: str | None = None) -> None:
        """A notice for ``host`` from ``source`` (a metadata watcher, the worker ``watcher``'s; a notice queue); see
        :mod:`.leaving`.

        Each notice is logged once; it lapses as :class:`~.hosts.HostManager` says.
        """
        if self.leavers.notice(host, drain, now, source=source, soft=soft, watcher=watcher):
            self._step(now)

    def discovery_failed(self, message: str, *, fatal: bool, now: float) -> None:
        """A discovery call failed: retried within the timeouts; a fatal failure before discovery ever answered
        ends the job (see :mod:`.discovery_edge`)."""
        self.stepped_at = now
        self.discovery.failed(message, fatal=fatal, now=now)

    def registered(self, worker_id: str, now: float) -> bool:
        """A worker process connected. False if the driver does not know it."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return False
        if w.state is S.STARTING:
            w.to(S.CONNECTED)
        w.last_seen = self._clock(now)
        return True

    def rendezvous(self, worker_id: str, last_round: int, reason: str, now: float, commits: int | None = None,
                   rolled_back: int = 0, commit_seq: int | None = None, holds_commit: bool = True,
                   unreachable: tuple[str, ...] = (), *, trained: str = "", addresses: tuple[str, ...] | None = None,
                   takes_facts: bool = False) -> None:
        """A worker arrived at rendezvous, having left ``last_round`` with ``commits`` commits made (after a failure,
        ``rolled_back`` steps undone and the ``unreachable`` addresses its group never reached; ``addresses``: its
        host's; see .partitions), holding the commit ``commit_seq`` unless ``holds_commit`` is False (see
        ``worker.ledger``), whose state's fingerprint is ``trained`` (see .repeats.Trained); ``takes_facts``: see WorkerRecord."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return
        w.last_seen = self._clock(now)
        self.note_commits(w, commits, commit_seq, exact=True, trained=trained)  # what it would restore now
        if w.commit_lost != (not holds_commit):
            w.commit_lost = not holds_commit
            if w.commit_lost:
                log.warning("job %s: worker %s (%s) could not restore its last commit exactly; the next round takes "
                            "the state from another worker", self.job_id, worker_id, w.label)
        rounds = self.rounds
        if reason == "failure" and rolled_back > rounds.steps_lost:
            rounds.steps_lost = rolled_back
        if w.state is S.STARTING:
            w.to(S.CONNECTED)
        # A repeated long-poll for the same round changes nothing; once assigned a newer round, it waits for that reply.
        if w.round <= last_round and w.state in (S.CONNECTED, S.RUNNING, S.DRAINING):
            was_member = w.member_of(self.round)
            w.rdzv_reason, w.unreachable, w.addresses = reason, unreachable, addresses
            w.sync_row, w.takes_facts = (commit_seq or 0, int(holds_commit)), takes_facts
            if w.state is S.DRAINING and self.capacity.sourcing is not None:  # the last holder of the state stays
                self.capacity.sourcing.keep_holder(w, failed=reason == "failure")
            if w.state is S.DRAINING and reason == "failure":  # back from a failure, not leaving at a commit
                self.leavers.died_draining(w, "left its round by a failure")
            if w.state is S.DRAINING or self.phase in (Phase.FINISHING, Phase.DONE):
                self.leavers.left_round(w, now)  # EXITING; the last holders' rank 0 may checkpoint on its way out
                rounds.stopped_waiting(worker_id)
            else:
                if w.state is S.CONNECTED:
                    self.emit("worker_ready", worker=worker_id, host=w.slot.host, slot=w.slot.index)
                w.to(S.WAITING)
                rounds.now_waiting(worker_id)
            if reason == "failure":
                self.failure_since_round = True
                if was_member:
                    # Its collective failed without anyone dying (a broken link, a group
                    # that could not form): its peers may still be blocked on it, and its
                    # old group is kept open, so only an abort releases them.
                    if self.phase is Phase.RUNNING and self.abort_round < self.round:
                        # Who reported the failure that aborts the round (an adopted worker's own lines go nowhere):
                        # the first to report, not the cause. Gloo fails the survivors' collective on a killed peer's
                        # reset before this driver sees the peer's exit, whose own line then follows.
                        cut = ", ".join(rounds.partitions.unreached(w))
                        cut = f"; it could not reach {cut}" if cut else ""
                        log.warning("job %s: round %d failed, first reported by worker %s (%s): a collective of it "
                                    "failed, or its group did not form%s (the member at fault may be another)",
                                    self.job_id, self.round, worker_id, w.label, cut)
                    self.abort()
        if rounds.arrived(w):
            self._step(now)

    def assignment(self, worker_id: str) -> Assignment | ExitOrder | None:
        """The reply for a worker waiting at rendezvous, or None while it must keep waiting."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return ExitOrder("unknown or failed worker")
        if self.phase in (Phase.FINISHING, Phase.DONE) and w.state in (S.CONNECTED, S.WAITING):
            w.to(S.EXITING, "the job is finishing")
            self.rounds.stopped_waiting(worker_id)
        if w.state is S.EXITING:
            return ExitOrder(w.why or "told to exit", *self.leaving_checkpoint(worker_id))
        return self.rounds.assignment(w)

    def heartbeat(self, worker_id: str, now: float, commits: int | None = None,
                  commit_seq: int | None = None, progress: int | None = None, steps: int | None = None,
                  waiting_s: float | None = None, compute_s: float | None = None, comm_s: float | None = None,
                  link: LinkReport | None = None, trained: str = "", holds_commit: bool | None = None
                  ) -> PollReply | None:
        """A worker's heartbeat; None if the worker is unknown or already given up.

        ``progress`` is the worker's progress counter (see ``worker.link.progress``):
        a round none of whose members' counters grows for ``progress_timeout_s``
        is stuck. ``waiting_s`` is how long it has been waiting in one collective;
        ``compute_s`` its compute time per step (None until it has one; see :mod:`.health`), ``comm_s`` its
        time in collectives per step; ``link`` its link probe (see :mod:`.links`); ``trained`` the fingerprint of its
        last commit's state (see :class:`.repeats.Trained`); ``holds_commit``: it can restore it (not a follower).
        """
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return None
        w.last_seen = max(w.last_seen, running := self._clock(now))  # a held poll's arrival may precede a later call
        self.note_commits(w, commits, None if w.state is S.WAITING else commit_seq,  # waiting: rendezvous says it
                          trained=trained)
        if holds_commit is not None and w.state is not S.WAITING:
            w.commit_lost = not holds_commit
        self.stopping.heard(w, now)  # how often it commits: whether a stop waits for its next commit
        if progress is not None and progress != w.progress:
            w.progress, w.progress_at = progress, running
            if w.round == self.round and w.state in MEMBER:
                self.completion.progressed(running)
        if steps is not None and steps > w.steps:
            w.steps = steps
        if waiting_s is not None:
            w.waiting_s, w.waiting_at = waiting_s, running
        w.compute_s, w.comm_s = compute_s, comm_s
        leave = (w.why or "told to leave") if w.state in (S.DRAINING, S.EXITING) else None
        return PollReply(self.round, self.update_gen, self.abort_round, self.phase is Phase.DONE,
                         stacks=w.stacks_wanted, leave=leave, probe=self.health.heard(w, link, running))

    def drain(self, host: str, slot: int | None, now: float) -> tuple[bool, str]:
        """An operator drains ``host`` or one of its slots (``cloud-elastic drain``); (done, message)."""
        return self.health.drain(host, slot, now)

    def unhealthy(self, worker_id: str, reason: str, now: float) -> None:
        """A worker's device self-test failed (``reason``, one line): it is given up and its slot blacklisted."""
        w = self.workers.get(worker_id)
        if w is not None:
            self.health.unhealthy(w, reason, now)

    def stacks_received(self, worker_id: str, request: int, text: str = "") -> WorkerRecord | None:
        """A worker sent the stacks it was asked for (``text``); returns its record (None if unknown)."""
        w = self.workers.get(worker_id)
        if w is not None and request > w.stacks_sent:
            w.stacks_sent, w.last_frame = request, main_frame(text) or w.last_frame
        return w

    def signal_stacks(self, worker_id: str, text: str) -> WorkerRecord | None:
        """A worker given up and asked for its stacks by signal was killed: ``text`` is what it printed ("" for
        nothing: its host frozen or out of reach); a silent one counts as a hang only if it printed them
        (:meth:`.failures.Failures.signal_stacks`). Returns its record (None if unknown)."""
        w = self.workers.get(worker_id)
        if w is not None:
            self.failures.signal_stacks(w, text)
        return w

    def exiting(self, worker_id: str, now: float) -> bool:
        """The worker is past its exit hooks: its heartbeats stop now and its exit status follows.

        Its silence is judged by :data:`~.liveness.EXIT_GRACE_S` from here on, so an
        interpreter slow to tear down ends the worker with its exit status, not as
        a silent one. Nothing else changes: the exit itself is handled as ever.
        """
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return False
        w.exiting_at = w.last_seen = self._clock(now)
        return True

    def completed(self, worker_id: str, now: float, *, commit_seq: int | None = None, steps: int | None = None,
                  error: str | None = None, elastic: bool = True, again: bool = False) -> tuple[str, str]:
        """A worker reports that its training function returned; answers ``(decision, reason)``.

        ``done``, ``wait`` (parked until rank 0 returns) or ``leave``: see :mod:`.completion`.
        ``error`` (rank 0 could not write the final durable checkpoint) makes the
        job fail once it has completed. ``elastic`` False: the worker's script ended
        without ``hvd.elastic.run`` (``error``: what it raised), see :mod:`.fixed_size`.
        ``again``: it entered ``hvd.elastic.run`` again instead (``Completion.entered_again``).
        """
        w = self.workers.get(worker_id)
        if not elastic and w is not None and w.alive:
            return self.fixed.script_ended(w, error)
        if again:
            return self.completion.entered_again(worker_id, now)
        return self.completion.completed(worker_id, now, commit_seq=commit_seq, steps=steps, error=error)

    def completion_reply(self, worker_id: str) -> tuple[str, str] | None:
        """What a worker whose training function returned is told now; None while it must wait for rank 0."""
        return self.completion.reply(worker_id)

    def leaving_checkpoint(self, worker_id: str) -> tuple[float | None, bool]:
        """For a worker told to leave: the seconds it has to checkpoint the commit it leaves at (None: it does not),
        and whether it is the one writer (see :meth:`.leaving.Leavers.left_round`), as its ``ExitOrder`` says at
        rendezvous; a member parked after its training function returned is told so in its completion reply."""
        return self.leavers.checkpoint_s.get(worker_id), self.leavers.writer == worker_id

    def exited(self, worker_id: str, status: ExitStatus, now: float) -> None:
        """A worker process ended."""
        w = self.workers.get(worker_id)
        if w is None or w.state is S.EXITED:
            return
        before = w.state
        was_member = w.member_of(self.round)
        w.to(S.EXITED)
        status = self.adoption.exit_status(worker_id, status)  # an adopted process: the exit code it said
        if before is S.COMPLETED:
            self.completion.exited_after_completing(w, status)
        elif before is S.RUNNING and w.returned and self.phase is Phase.RUNNING:
            # Parked (its function returned, rank 0's not yet): no loss of training. A non-zero exit or a signal fails
            # the job once rank 0 returns at its commit, naming it; if it returned early, it just leaves.
            self.completion.exited_after_completing(w, status, parked_now=now)
        elif before is S.DRAINING and self.fixed.exited(w, status, was_member):
            self.leavers.fixed_ended(w, status.describe)  # it cannot leave: exit 0 is its success, else a failure
        elif before is S.DRAINING:
            # It ended before leaving its round at a commit (killed, crashed): a failure, not a leave, though its
            # slot is not blamed (its host is going). Peers may be blocked in a collective with it: an abort frees them.
            log.warning("job %s: worker %s (%s) %s while draining (%s), before leaving at a commit", self.job_id,
                        worker_id, w.label, status.describe, w.why)
            if self.leavers.lost_leaver(w, status.describe, now, exit_code=status.code if status.known else None) \
                    and was_member:
                self.abort()
        elif before is S.EXITING:
            log.info("job %s: worker %s left (%s)", self.job_id, worker_id, w.why or "told to exit")
            early = {"early_return": True, "commit_step": w.commit_seq, "steps": w.steps,
                     **blocked_s(w.cooldown_s)} if w.returned_early else {}
            self.emit("worker_left", worker=worker_id, host=w.slot.host, slot=w.slot.index,
                      reason=w.why or "told to exit", **({"round": w.round} if w.round else {}), **early)
        elif before is S.LOST:
            pass  # already accounted for when it was given up
        elif self.phase is Phase.FINISHING and was_member and not (status.code == 0 and status.known):
            self._failed_finishing(w, status)
        elif self.phase in (Phase.FINISHING, Phase.DONE):
            log.info("job %s: worker %s %s while the job was finishing", self.job_id, worker_id, status.describe)
        elif self.fixed.exited(w, status, was_member, connected=before is not S.STARTING):
            pass  # a fixed-size job or a plain command: exit 0 is the worker's success, else the attempt's failure
        else:
            what = self.fixed.early_exit(status, connected=before is not S.STARTING)
            self.failures.fail(w, what, now, was_member=was_member, transport=status.transport_error is not None,
                              exit_code=status.code if status.known else None)
        self._step(now)

    def _failed_finishing(self, w: WorkerRecord, status: ExitStatus) -> None:
        """Member ``w`` ended (``status``, not exit 0) before its training function returned, while the job finished
        (rank 0's had returned) and without being told to leave: the job fails once the others are done, naming it
        and its error, as under Horovod (a user's final evaluation that raised must not pass for a success)."""
        what = f"{status.describe} before its training function returned" + (f": {w.error}" if w.error else "")
        line = f"worker {w.worker_id} ({w.label}) {what}"
        log.error("job %s: %s", self.job_id, line)
        killed_by = {"signal": signal_name(-status.code)} if status.known and status.code < 0 else {}
        self.emit("worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank, reason=what,
                  exit_code=None if killed_by else status.code, blacklisted_s=None, round=w.round, **killed_by)
        self.completion.failed_before_returning(line)

    def checkpoint_saved(self, step: int, commit_seq: int | None) -> None:
        """A worker stored the checkpoint of ``step``, commit ``commit_seq``: what a drain loses counts from it."""
        self.leavers.checkpoint_saved(step, commit_seq)

    def checkpoint_loaded(self, step: int, commit_seq: int | None, path: str, trained: str = "") -> int | None:
        """Rank 0 of a from-checkpoint round loaded the checkpoint of ``step``, commit ``commit_seq`` of the job,
        whose state's fingerprint is ``trained`` (what every-worker-lost's repeat guard measures: .repeats.Trained).

        Returns the steps lost, counted in commits like ``round_formed.step``: the highest
        commit the driver heard of since the previous load (from the workers that were lost)
        minus the checkpoint's. None when that cannot be known: a restarted driver that never
        heard from the lost workers, or a report without the checkpoint's commit. Logs one
        line, emits ``checkpoint_loaded`` and, when the load replaced a failed round, its
        ``rollback`` with the same count.
        """
        self.trained.note(trained, stored=True)
        heard = self.commit_high > 0 or not self.resumed
        lost = max(0, self.commit_high - commit_seq) if commit_seq is not None and heard else None
        if commit_seq is not None:
            self.commit_high = commit_seq  # the job's history goes on from the checkpoint
            if self.commit_base is None and self.resumed:
                self.commit_base = commit_seq
            # It is stored: a job failing before its next commit has nothing newer to write (it would write the
            # same step again, pruning an older checkpoint; see .ending).
            self.leavers.checkpoint_saved(step, commit_seq)
        how_many = (f"{lost} committed step(s) after it were lost" if lost is not None else
                    "any steps trained after it are not in it (this driver did not run them: it cannot say how many)")
        log.warning("job %s: resumed from the checkpoint of step %d (%s); %s", self.job_id, step, path, how_many)
        self.emit("checkpoint_loaded", step=step, path=path, steps_lost=lost)
        replaced, self.rounds.rollback_at_load = self.rounds.rollback_at_load, None
        if replaced is not None and lost is not None:
            self.emit("rollback", round=replaced[0], commit_step=commit_seq, steps_lost=lost, reason=replaced[1])
        return lost

    def tick(self, now: float) -> None:
        """Periodic check: heartbeats, timeouts, deadlines, launches, rounds."""
        self._step(now)

    def stop(self, reason: str, exit_code: int, now: float | None = None, *, grace_s: float = 0.0) -> None:
        """End the job from outside (a signal): every worker is to be stopped. With ``grace_s`` and checkpointing,
        first they stop at a commit and rank 0 checkpoints it, for up to ``grace_s`` (see :mod:`.stopping`);
        a stop without grace during that ends the job at once."""
        if self.outcome is not None:
            return
        if self.stopping.active:
            if grace_s <= 0:
                self.stopping.now_instead(reason, exit_code)
            return
        if now is not None and self.stopping.begin(reason, exit_code, now, grace_s):
            self._step(now)
            return
        self._finish(False, reason + self.stopping.unsaved(), exit_code)  # saved nothing: says so

    # ------------------------------------------------------------ adoption
    def begin_adoption(self, last_seq: int) -> None:
        """A restarted driver is up at its predecessor's address: workers may re-register (:meth:`adopt`).

        ``last_seq`` is the highest worker sequence number the predecessor used, so
        that the ids of workers launched from now on never repeat an adopted one.
        """
        self.adoption.begin(last_seq)

    def adopt(self, worker_id: str, slot: Slot, seq: int, request: AdoptRequest, now: float) -> str | None:
        """Adopt a running worker of the predecessor where it stands; None when adopted, else why not
        (see :mod:`.adoption`)."""
        return self.adoption.adopt(worker_id, slot, seq, request, now)

    def end_adoption(self, now: float, missing: dict[str, str]) -> None:
        """The adoption window closed; ``missing`` (worker id -> what became of it) did not come back."""
        self.adoption.end(now, missing)

    # --------------------------------------------------------------- queries
    def take_rendezvous_news(self) -> set[str]:
        """Return and forget the workers that stopped waiting at rendezvous since the last call.

        Their :meth:`assignment` may have changed (a round formed with them, they
        were told to exit, they are gone), so a request waiting for it should look
        again; no other waiting worker's answer changed, except on a change of
        ``round`` or ``phase``, which concerns them all. A worker's own
        :meth:`rendezvous` and :meth:`assignment` calls are not reported: the
        caller already has the answer.
        """
        return self.rounds.take_news()

    @property
    def completed_workers(self) -> int:
        """Workers whose training function returned (exited since, or not yet)."""
        return self.completion.exited + sum(1 for w in self.workers.values() if w.state is S.COMPLETED)

    # ------------------------------------------------------- the pieces' view
    def note_commits(self, w: WorkerRecord, commits: int | None, commit_seq: int | None = None, *, exact=False,
                     trained: str = "") -> None:
        # A heartbeat (which may be older than a later rendezvous) only raises ``commit_seq``; a rendezvous
        # (``exact``) says it as it is, even lower (a sync to an older rank 0: ``ledger.hold_commit``).
        if w.discarded:
            return
        self.trained.note(trained, w.worker_id)  # the state of its last commit: a change is progress (.repeats)
        if isinstance(commit_seq, int) and (commit_seq > w.commit_seq or exact):
            w.commit_seq = commit_seq
            if commit_seq > self.commit_high:
                self.commit_high = commit_seq
        if isinstance(commits, int) and commits > w.commits:
            w.commits = commits
        if w.holds_state:
            if not self.state_committed:
                self.state_committed = True
                log.debug("job %s: first commit seen (worker %s)", self.job_id, w.worker_id)

    def end(self, success: bool, reason: str, exit_code: int) -> None:
        """End the job (once). A failure while a live worker holds a commit newer than the last checkpoint ends it
        once that commit is checkpointed, or the graceful stop's time is up (see :mod:`.ending`)."""
        if self.outcome is not None:
            return
        if not success:
            routed = self.failing.route(reason, exit_code, self.stepped_at)
            if routed is None:
                return  # the holders of the last commit checkpoint it first: the graceful stop ends the job
            reason = routed
        self._finish(success, reason, exit_code)

    def _finish(self, success: bool, reason: str, exit_code: int) -> None:
        if self.outcome is not None:
            return
        self.completion.fail_pending(self.stepped_at or 0.0)  # a dead parked holder is named however the job ends
        self.phase = Phase.DONE
        self.outcome = Finish(success, reason, exit_code)
        (log.info if success else log.error)("job %s: %s", self.job_id, reason)
        for w in self.alive():
            if w.state is not S.EXITING:
                w.to(S.EXITING, "the job is over")
        self._actions.append(self.outcome)

    def abort(self) -> None:
        self.failure_since_round = True
        if self.phase is Phase.RUNNING and self.abort_round < self.round:
            self.abort_round = self.round
            self._alive_memo = None
            left = [w for w in self.members() if not w.returned]
            if not left:
                what = ("its other members had returned from their training function" if self.members()
                        else "no member is left in it")
            elif not self.state_committed:
                # Heartbeats tell of commits late: the survivors know, and the next round's log says.
                what = "survivors roll back to their last commit (none reported yet: the initial state if none)"
            else:
                what = "survivors roll back to their last commit"
            log.info("job %s: round %d aborted; %s", self.job_id, self.round, what)
            self.rounds.pending_rollback = self.round

    def give_up(self, w: WorkerRecord, what: str, now: float, *, stacks: bool = True) -> None:
        if w.returned and w.state is S.RUNNING and self.phase is Phase.RUNNING:  # parked: no training lost
            self.completion.lost_while_parked(w, what, now, stacks=stacks)
            return
        self.failures.give_up(w, what, now, stacks=stacks)

    def commits_lost_reason(self) -> str:
        return self.failures.commits_lost_reason()

    # ---------------------------------------------------------------- internals
    def _step(self, now: float) -> None:
        if self.phase is Phase.DONE:
            return
        self.stepped_at = now
        self._alive_memo = None
        self._alive_memo = self.alive()
        try:
            self._step_all(now)
            alive = self.alive()
            self.rounds.index(alive)
            self._alive_count = len(alive)
        finally:
            self._alive_memo = None

    def _step_all(self, now: float) -> None:
        self.discovery.expire(now)
        for w, what in self.silence.overdue(self.alive(), len(self.workers), now, self._clock(now), self.round):
            self.give_up(w, what, now, stacks=w.state is not S.STARTING)  # one never registered has nothing to say
        if self.stopping.active and (self.phase is not Phase.FINISHING or self.stopping.overdue(now)):
            self.stopping.step(now)  # a graceful stop: nothing launches or forms; it ends once the workers left
            return  # (training that completes during it ends as a completion does, within the stop's time)
        if self.completion.check_early_returns(now):
            return  # rank 0 lost with the final state in parked members: the job ends (they write it first)
        self.completion.check_progress(now)
        self.health.check(now)
        self.leavers.mark(now)
        self.leavers.enforce_deadlines(now)
        self.leavers.release_drained(now, rollback_pending=self.rounds.pending_rollback is not None)
        if self.phase is Phase.FINISHING:
            self.completion.step_finishing(now)
            self.rounds.track_spares()  # none once the job finishes (status, events)
            return
        if self.fixed.step(now):
            return  # a fixed-size job's round runs (or is being stopped): nothing launches or re-forms
        # Each while the job is not ending (a failure may checkpoint first); the state's loss is judged before any
        # launch, so a job that fails for it starts no replacement in the same step (review h4).
        for part in (lambda _: self.failures.check_state_kept(), self.capacity.plan_launches, self.capacity.check,
                     self.rounds.maybe_request_update, self.rounds.maybe_form):
            if self.phase is not Phase.DONE and not self.stopping.active:
                part(now)
