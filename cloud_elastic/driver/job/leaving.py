"""Hosts that leave: notices, draining, deadlines, and giving a drained host back.

:class:`Leavers` decides, for the job:

* what a notice does (:meth:`Leavers.notice`): a hard one drains the host, a
  soft one (rebalance recommendation, maintenance) only keeps new workers off
  it unless ``--drain-on-rebalance``; each is logged and emitted once;
* which workers are asked to leave (:meth:`Leavers.mark`): those on a draining
  host or one gone past the missing grace; a round member drains (it leaves at
  its next commit, with zero steps lost), anyone else exits;
* when a draining worker is removed by force (:meth:`Leavers.enforce_deadlines`):
  still in its round ``deadline_margin_s`` before its host's deadline, but never
  sooner than one such margin after the driver learned of that deadline (one
  already past or close on arrival is most often clock skew between the driver
  and the pod or cloud that set it, or a late notice: the worker, still
  answering, gets that long to reach a commit); its peers roll back, and its
  slot is not blacklisted (the host is going, the worker did nothing wrong);
* when a draining host is given back to the cloud (:meth:`Leavers.release_drained`):
  once no worker is left on it, exactly once per notice, its log line saying how its workers left (at a
  commit, removed by force, dead while draining: :meth:`Leavers.died_draining`; a host that left the group, or
  a slot its host no longer lists, with no release, has that line only when one of its draining workers died;
  a fixed-size job's worker, which cannot leave at a commit, is judged by :mod:`.fixed_size` instead:
  :meth:`Leavers.fixed_ended`); after a hard notice,
  the job takes no worker there again while discovery lists the same instance
  (:meth:`~.hosts.HostManager.given_back`);
* what the last holders of the state do on their way out (:meth:`Leavers.left_round`): sent away with no
  worker to take the state, and with ``--checkpoint-dir``, one host of them, picked by the order they leave in
  (``ExitOrder.checkpoint_s`` to its workers alone: the time they have, up to one deadline margin before its
  host's deadline; ``ExitOrder.writer`` to the first, a replica's writer), writes a checkpoint of the commit
  they left at before it exits, and no round resumes from a checkpoint until it has exited.

Cost: :meth:`Leavers.mark` scans every worker only when a host changed
usability or a worker was born since its last scan; the deadline and release
checks scan only while some host is draining.
"""

from __future__ import annotations

import logging
from typing import Callable

from cloud_elastic.driver.job.actions import Phase, Release, Stop
from cloud_elastic.driver.job.exit_status import signal_name
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.providers.api import Drain

__all__ = ["Leavers"]

log = logging.getLogger(__name__)

S = WorkerState
#: The last holders of the state drain this many deadline margins before their host's deadline (see
#: :meth:`Leavers.mark`): one margin to reach a commit before the force-removal margin.
HOLD_MARGINS = 2
#: With ``--checkpoint-dir`` they drain this many margins sooner: the time their rank 0 has to write the last commit.
CHECKPOINT_MARGINS = 1
#: The time a last holder on a host without a deadline (gone from discovery) has to write that checkpoint.
NO_DEADLINE_CHECKPOINT_S = 120.0
#: Before any commit is heard of, members on hosts drained without a deadline (``cloud-elastic drain``, a soft notice
#: under ``--drain-on-rebalance``) train on towards their first commit this long, then only while no worker waits to
#: take over (see :meth:`Leavers.mark`).
FIRST_COMMIT_HOLD_S = 60.0
#: States of alive workers that are staying (see JobView.active), as a tuple: membership in a tuple tests
#: identity first, while an enum's hash is computed in Python.
_ACTIVE = (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING)


class Leavers:
    """Notices and draining hosts, for one job (see module docstring)."""

    def __init__(self, job: JobView, fixed_failed: Callable[..., bool] = lambda w, what, **how: False) -> None:
        """``fixed_failed(w, what, exit_code=, was_member=)``: True when a fixed-size job takes the loss of a draining
        worker as its attempt's failure (see :mod:`.fixed_size`: its script cannot leave at a commit)."""
        self._job = job
        self._fixed_failed = fixed_failed
        #: Host -> where its latest notice came from (for status).
        self.sources: dict[str, str] = {}
        self._released: set[str] = set()
        # Draining hosts whose workers did not leave at a commit -> what happened (removed by force, died).
        self._forced: dict[str, str] = {}
        # The same, for hosts that left the group (not draining: by host) or lost slots (by slot): said once emptied.
        self._gone: dict[str | Slot, str] = {}
        self._terminating: set[str] = set()  # hosts drained by a hard notice (not a soft one under drain_soft)
        self._deadlines: dict[str, tuple[float, float]] = {}  # draining host -> (its deadline, wall time first seen)
        self._forced_drains: list[str] = []  # their log lines, until the steps lost are known
        # Exact shortcut: no worker's host changed usability while hosts.version is _checked[0] and no
        # worker was born while the count of workers is _checked[1].
        self._checked: tuple[int, int] = (-1, -1)
        self._draining_round = -1  # the last round in which a member was marked draining
        # Workers kept as the last holders -> when first kept (said once, not again per round; the bound of
        # FIRST_COMMIT_HOLD_S counts from then).
        self._held_since: dict[str, float] = {}
        self._started_over: set[str] = set()  # draining hosts whose workers were stopped holding no commit heard of
        # The last holders sent away with no successor -> their host's deadline (None: none); once they left their
        # round, those told to checkpoint on their way out -> the seconds they have for it (see left_round).
        self._last_holders: dict[str, float | None] = {}
        self.checkpoint_s: dict[str, float] = {}
        #: The one worker of them that writes alone (a replica's checkpoint; a sharded one's is its host's): see
        #: :meth:`left_round`. Read into its ``ExitOrder.writer``.
        self.writer: str | None = None
        #: Those told to checkpoint on their way out -> the commit they left at (what their checkpoint is of).
        self.left_at: dict[str, int] = {}
        # Draining host whose workers left holding the last copy of the state -> the commit they left at.
        self._last_hosts: dict[str, int] = {}
        self._checkpoint: tuple[int, int] | None = None  # (step, commit) of the newest checkpoint reported saved
        self._noticed: dict[str, list[str]] = {}  # draining host -> its workers when its hard notice came

    def notice(self, host: str, drain: Drain, now: float, *, source: str, soft: bool = False,
               watcher: str | None = None, how: str = "its workers leave at their next commit") -> bool:
        """A notice for ``host`` from ``source`` (``watcher``: the worker whose metadata watcher reported it); True
        when it is news (the job then steps).

        A hard notice drains the host: its workers leave at their next commit, or
        are removed by force just before ``drain.deadline``. A soft one only keeps
        new workers off the host, unless ``hosts.drain_soft`` makes it drain too.
        ``how``: what its workers do, for the log line (a hand drain's reply says it per kind of worker: see
        :meth:`.health.Health.drain`).
        """
        job = self._job
        if not soft:
            self._terminating.add(host)
        soft = soft and not job.hosts.drain_soft  # --drain-on-rebalance
        if soft:
            news = job.hosts.soft_notice(host, drain.reason, now)
        elif source == "operator":  # cloud-elastic drain: no lapse, it lasts until the host leaves discovery
            news = job.hosts.hold(host, drain)
        else:
            # The cloud reclaims a host the operator drained already: not news to its workers, but its deadline is
            # (review s59 rvO: never logged). Said once, as the notice's first report: one that lapses is news again.
            reclaims = host in job.hosts.held and host not in job.hosts.notices and drain.deadline is not None
            news = job.hosts.notice(host, drain, now, now + job.wall_offset, source=source, watcher=watcher)
            if reclaims and not news and host in job.hosts.notices:
                how, news = "the operator drained it already: its workers leave by that deadline at the latest", True
        if not news:
            return False
        self.sources[host] = source
        left = ""
        if drain.deadline is not None:
            left = f", {drain.deadline - (now + job.wall_offset):.0f}s before its deadline"
        if soft:
            log.info("job %s: notice from %s for host %s: %s; no new worker will be placed there",
                     job.job_id, source, host, drain.reason)
        else:
            log.warning("job %s: notice from %s for host %s: %s%s; %s", job.job_id, source, host, drain.reason, left,
                        how)
            if host not in self._noticed:  # the operator's drain noted its workers first (the cost line names them)
                self._noticed[host] = [w.worker_id for w in job.alive() if w.slot.host == host]
        job.emit("notice", source=source, host=host, reason=drain.reason, deadline=drain.deadline, soft=soft,
                 action="no new workers" if soft else "drain")
        return True

    def lapsed(self, host: str) -> None:
        """The notice for ``host`` lapsed (see :class:`~.hosts.HostManager`)."""
        self.sources.pop(host, None)
        self._terminating.discard(host)

    def members_may_drain(self, round_: int) -> bool:
        """False when no member of round ``round_`` was marked draining (only :meth:`mark` drains members)."""
        return self._draining_round == round_

    def take_forced_drains(self) -> list[str]:
        """The log lines of hosts drained by force or whose draining workers died, kept until the survivors report
        the steps lost."""
        lines, self._forced_drains = self._forced_drains, []
        return lines

    def mark(self, now: float | None = None) -> None:
        """Workers whose host is draining or gone (past the missing grace) are asked to leave.

        Except the last holders of the state: when every running member's host is draining (a notice for
        every host at once), they train on, and leave only once a new worker holds the state (it joins as
        any newcomer, or a waiting spare, with room next to them: see :mod:`.spares`; they drain the step
        after) or :data:`HOLD_MARGINS` deadline margins before their host's deadline (with
        ``--checkpoint-dir``, :data:`CHECKPOINT_MARGINS` more, to checkpoint on their way out: see
        :meth:`left_round`); sent away at once, they took the training state with them. Before any commit is heard
        of, the running members on hosts with a notice are the holders (of the first commit, made or on its way),
        but not after their round was aborted, and on a host without a deadline past :data:`FIRST_COMMIT_HOLD_S`
        only while no worker waits to take over; a round that forms from step 0 without them then sends them away
        at once (:meth:`leave_uncommitted`).
        """
        job = self._job
        checked = (job.hosts.version, len(job.workers))
        if checked == self._checked:
            return  # no host changed and no worker was born since every worker's host was checked
        self._checked = checked
        ready, missing = job.hosts.ready, job.hosts.missing
        leaving = []
        for w in job.alive():
            if w.state not in _ACTIVE:
                continue
            # HostManager.is_usable, inlined: this runs over every worker each step.
            host, index = w.slot.host, w.slot.index
            if index < (missing[host][0] if host in missing else ready.get(host, 0)):
                continue
            leaving.append(w)
        held = {w.worker_id for w in self._holding(leaving, now)}
        for w in leaving:
            if w.worker_id in held or w.state not in _ACTIVE:  # taken along with its host already (--whole-hosts)
                continue
            drain = job.hosts.draining.get(w.slot.host)
            why = f"host {w.slot.host} is draining ({drain.reason})" if drain else self._left(w.slot)
            log.info("job %s: worker %s (%s) will leave: %s", job.job_id, w.worker_id, w.label, why)
            self.send_away(w, why)
        for w in leaving:  # a last holder waiting at rendezvous (or its host-mate) leaves from there
            if w.state is S.EXITING and w.worker_id in self._last_holders and now is not None:
                self.left_round(w, now)

    def _holding(self, leaving: list[WorkerRecord], now: float | None) -> list[WorkerRecord]:
        """The members of ``leaving`` kept training as the last holders of the state (see :meth:`mark`)."""
        job = self._job
        if now is None or not leaving:
            return []
        going = {w.worker_id for w in leaving}
        holders = [w for w in job.alive() if (w.state is S.RUNNING or w.state is S.WAITING) and w.holds_state]
        if not job.state_committed:
            # No commit heard of yet (the first is not made, or its heartbeat is on the way): the running members
            # are its prospective holders; sent away now, a newcomer would start over from step 0 beside them.
            # Not when a host left discovery without a notice: .discovery_edge keeps a host only for the holders it
            # knows of, and starting over before the first commit is the documented rule there.
            # Not after a loss aborted their round: they are failing, back at rendezvous or lost.
            holders = [w for w in job.members() if w.state is S.RUNNING]
            if job.abort_round >= job.round or any(w.slot.host not in job.hosts.draining for w in holders):
                return []
        if not holders or any(w.worker_id not in going for w in holders):
            return []  # someone stays to hold the state (or no round runs)
        wall = now + job.wall_offset
        hold = (HOLD_MARGINS + (CHECKPOINT_MARGINS if job.policy.checkpointing else 0)) * job.policy.deadline_margin_s
        held = []
        for w in holders:
            drain = job.hosts.draining.get(w.slot.host)
            if drain is not None and self._may_hold(w, drain, now, wall + hold):
                held.append(w)
            else:  # sent away with no one to take the state
                self.checkpoint_on_leaving(w, None if drain is None else drain.deadline)
        if held:
            self._checked = (-1, -1)  # looked at again next step: the deadline comes closer without any change
            if any(w.worker_id not in self._held_since for w in held):
                for w in held:
                    self._held_since.setdefault(w.worker_id, now)
                bound = "" if all(job.hosts.draining[w.slot.host].deadline is not None for w in held) else (
                    f", {FIRST_COMMIT_HOLD_S:g}s at most without a deadline")
                first = "" if job.state_committed else (
                    f" (no commit heard of yet: they train on to their first{bound}; past that, a waiting worker "
                    "starts over from the initial weights)")
                hosts = sorted({w.slot.host for w in held})
                until = ("their host's deadline" if len(hosts) == 1 else "their hosts' deadlines") if all(
                    job.hosts.draining[w.slot.host].deadline is not None for w in held) else "a deadline, where one is set"
                log.warning("job %s: every holder of the state is on a draining host (%s): they train on, and leave "
                            "once a new worker holds the state, or %gs before %s%s", job.job_id, ", ".join(hosts),
                            hold, until, first)
        return held

    def _may_hold(self, w: WorkerRecord, drain: Drain, now: float, leave_by: float) -> bool:
        """Whether holder ``w`` on a draining host trains on (see :meth:`mark`); ``leave_by``: the wall time now,
        plus the margins it needs to leave."""
        if drain.deadline is not None:
            return leave_by < drain.deadline
        job = self._job
        if job.policy.hosts_fixed and not self._successor_possible():
            return False  # nobody can ever take the state over: they leave (checkpointing first), and the job ends
        if job.state_committed or now < self._held_since.get(w.worker_id, now) + FIRST_COMMIT_HOLD_S:
            return True
        # Past the bound, only a waiting newcomer ends the hold (it starts over): with none, nobody would take over.
        r = job.round
        return not any(o.state is S.WAITING and o.round != r for o in job.alive())

    def _successor_possible(self) -> bool:
        """On a fixed host list: whether a worker may yet take the state over from holders on drained hosts (one
        waiting, one still starting or setting up on a host not drained: a spare after hvd.init(), review h24; or a
        slot of a host not drained that no live worker holds and that is not blacklisted for good).
        Review h9: a hand drain of a fixed list's last host replied that the job ends, while its holders, holding
        for a successor that could never come, trained on without end."""
        job = self._job
        r, hosts = job.round, job.hosts
        for o in job.alive():
            if (o.state is S.WAITING and o.round != r) or (
                    (o.state is S.STARTING or o.state is S.CONNECTED) and o.slot.host not in hosts.draining):
                return True
        occupied = {(o.slot.host, o.slot.index) for o in job.alive()}
        return any((h, i) not in occupied and not hosts.blacklist.for_good(Slot(h, i))
                   for h, n in hosts.ready.items() if h not in hosts.held and h not in hosts.draining for i in range(n))

    def leave_uncommitted(self, leavers: list[WorkerRecord], round_: int) -> None:
        """Round ``round_`` forms from step 0 without ``leavers``, members of the round before draining for a
        notice with no commit heard of (not held, see :meth:`mark`, or no longer): they leave now, stopped. Their
        work cannot be handed on, and they must not train on beside the new round."""
        job = self._job
        log.warning("job %s: no commit was heard of: round %d starts over from the initial weights, and worker(s) "
                    "%s on leaving host(s) stop now (their uncommitted work cannot be handed on)", job.job_id, round_,
                    ", ".join(w.worker_id for w in leavers))
        for w in leavers:
            w.discarded = True  # a commit it reports from now on is of a past no round continues
            self._last_holders.pop(w.worker_id, None)
            self._started_over.add(w.slot.host)
            self.send_away(w, f"round {round_} starts over from the initial weights without it (no commit heard of)")

    def checkpoint_on_leaving(self, w: WorkerRecord, deadline: float | None) -> None:
        """``w`` holds the state and leaves with no worker to take it (its host's deadline, or the job stopping:
        see :mod:`.stopping`): told to checkpoint the commit it leaves at, before ``deadline`` (wall time; None:
        :data:`NO_DEADLINE_CHECKPOINT_S`) less one margin, once it has left its round (see :meth:`left_round`)."""
        self._last_holders[w.worker_id] = deadline

    @property
    def newest_checkpoint(self) -> tuple[int, int] | None:
        """(step, commit) of the newest checkpoint reported stored (see :meth:`checkpoint_saved`), None if none."""
        return self._checkpoint

    def left_round(self, w: WorkerRecord, now: float) -> None:
        """``w`` arrived at rendezvous draining (or at the job's end), or was sent away from it: it exits now.

        A last holder of the state sent away with no successor is told, with ``--checkpoint-dir``, to write a
        checkpoint of the commit it left at first (its rank 0 does), in the time left before one deadline margin
        before its host's deadline (:attr:`checkpoint_s`, read into its ``ExitOrder``).
        """
        job = self._job
        if w.state is not S.EXITING:
            w.to(S.EXITING, w.why or "the job is finishing")
        if w.worker_id not in self._last_holders:
            return
        deadline = self._last_holders.pop(w.worker_id)
        if w.slot.host in job.hosts.draining and self._held_elsewhere(w.slot.host, w.commit_seq):
            return  # one that stays came to hold that commit since (a spare synced beside it: review h24)
        self._last_hosts[w.slot.host] = max(w.commit_seq, self._last_hosts.get(w.slot.host, 0))
        if job.policy.checkpointing and self._writes(w):
            left = NO_DEADLINE_CHECKPOINT_S if deadline is None else (
                deadline - (now + job.wall_offset) - job.policy.deadline_margin_s)
            self.checkpoint_s[w.worker_id] = max(0.0, left)
            self.left_at[w.worker_id] = w.commit_seq

    def _held_elsewhere(self, host: str, seq: int) -> WorkerRecord | None:
        """One that stays (on a host not draining, not a last holder itself) holding commit ``seq`` or newer; never
        for ``host``'s parked leavers: they write what they hold, rank 0 may never return (see :mod:`.completion`)."""
        job, draining = self._job, self._job.hosts.draining
        return None if any(w.returned for w in job.workers.values() if w.slot.host == host) else next((
            o for o in job.alive() if (o.state is S.RUNNING or o.state is S.WAITING) and o.holds_state and o.commit_seq
            >= seq and o.slot.host != host and o.slot.host not in draining and o.worker_id not in self._last_holders),
            None)

    def _writes(self, w: WorkerRecord) -> bool:
        """Whether last holder ``w``, leaving now, writes the checkpoint: exactly one host's do, chosen by the order
        they leave in, not by their last round (host 0 may be gone, or leave first: its successors' cross rank is
        not 0). The first to leave picks its host (and writes alone if the state is a replica's: :attr:`writer`);
        its host-mates write with it (a sharded state: each its shards). Another host is picked only once none of
        that host's writers is left, and only if it holds a newer commit."""
        workers = self._job.workers
        alive = [i for i in self.checkpoint_s if i in workers and workers[i].alive]
        if alive:
            return workers[alive[0]].slot.host == w.slot.host
        if self.left_at and w.commit_seq <= max(self.left_at.values()):
            return False  # that commit's checkpoint was written (or tried) by the host picked before
        self.writer = w.worker_id
        return True

    def final_checkpoint_pending(self) -> bool:
        """Whether a last holder told to checkpoint on its way out (see :meth:`left_round`) is still there: no
        round may resume from a checkpoint before it has exited, or it would load an older one."""
        workers = self._job.workers
        self.checkpoint_s = {i: s for i, s in self.checkpoint_s.items() if i in workers and workers[i].alive}
        return bool(self.checkpoint_s)

    def checkpoint_saved(self, step: int, commit_seq: int | None) -> None:
        """A checkpoint of ``step``, commit ``commit_seq`` of the job, was reported stored (or loaded, by a round
        resuming from it): the steps a drain without a successor loses are counted from the newest (see
        :meth:`release_drained`), and a failing job writes only a newer commit (see :mod:`.ending`)."""
        if commit_seq is None:
            return
        # A newer one, or the one kept is past every commit since the last load: the job resumed from an older
        # checkpoint (the newest was unusable), and its history went on from there.
        if self._checkpoint is None or commit_seq >= self._checkpoint[1] or self._checkpoint[1] > self._job.commit_high:
            self._checkpoint = (step, commit_seq)

    def _last_copy_gone(self, host: str) -> str:
        """What the drain of ``host``, whose workers held the last copy of the state, cost (see :meth:`left_round`)."""
        if not self._job.policy.checkpointing:
            return "the training state is lost (no --checkpoint-dir)"
        if self._checkpoint is None:  # a restarted driver, or none stored yet
            return ("no checkpoint of that commit was reported stored: the next round resumes from the latest "
                    "checkpoint and says how many steps were lost")
        step, seq = self._checkpoint
        if seq >= self._last_hosts[host]:
            return f"the checkpoint of step {step} holds that commit and the next round resumes from it; 0 steps lost"
        return (f"no checkpoint of that commit was written on the way out: the next round resumes from the latest; "
                f"{self._last_hosts[host] - seq} committed step(s) since the checkpoint of step {step} are lost")

    def send_away(self, w: WorkerRecord, why: str, *, returned_leaves: bool = False) -> None:
        """Ask one staying worker to leave: a round member drains (it leaves at its next commit, zero steps
        lost), a worker waiting at rendezvous gets an exit order, one not there yet is stopped. A member whose
        training function returned (parked until rank 0's does) drains too: it still waits for rank 0's return
        (told ``done`` then: the rest of its script runs); only ``returned_leaves`` (the final state's holders
        leaving, see :mod:`.stopping`) tells it to leave in the answer it waits for (``completion_reply``, with its
        checkpoint's time if it is the writer)."""
        job = self._job
        before = w.state
        parked = w.returned and before in (S.RUNNING, S.DRAINING)
        if (before is S.RUNNING and not w.returned) or (parked and not returned_leaves):
            w.to(S.DRAINING, why)  # leaves at its next commit
            self._draining_round = job.round
        else:
            w.to(S.EXITING, why)
            if before is not S.WAITING and not parked:
                # Not at rendezvous yet, so no exit order would reach it soon.
                job.act(Stop(w.worker_id, why))
        self.take_host_along(w)

    def take_host_along(self, w: WorkerRecord) -> None:
        """With ``--whole-hosts``, the staying workers of ``w``'s host leave with it: without ``w`` their host
        is no longer whole (a model sharded across the host's slots is missing a shard)."""
        job = self._job
        if not job.policy.whole_host_slots:
            return
        for other in job.alive():
            if other.slot.host == w.slot.host and other is not w and other.state in _ACTIVE:
                why = (f"worker {w.worker_id} of its host left ({w.why or 'failed'}), "
                       "and a host leaves whole (--whole-hosts)")
                log.info("job %s: worker %s (%s) will leave: %s", job.job_id, other.worker_id, other.label, why)
                self.send_away(other, why)

    def enforce_deadlines(self, now: float) -> None:
        """A draining host whose workers are still in their round close to its deadline is removed by force. A parked
        member there (its training function returned; it waits for rank 0's) leaves first, at its host's leave-by
        time (the hold margins of :meth:`mark` before the deadline), writing the commit it holds."""
        job = self._job
        draining = job.hosts.draining
        if not draining and not self._deadlines:
            return  # no deadline to enforce; spares a scan of every worker each step
        wall = now + job.wall_offset
        margin = job.policy.deadline_margin_s
        force_at = {host: self._force_at(host, drain.deadline, wall, margin)
                    for host, drain in draining.items() if drain.deadline is not None}
        self._deadlines = {h: seen for h, seen in self._deadlines.items() if h in force_at}
        if not force_at:
            return
        hold = (HOLD_MARGINS + (CHECKPOINT_MARGINS if job.policy.checkpointing else 0)) * margin
        for w in job.alive():
            if w.state is S.DRAINING and w.returned and w.slot.host in force_at and (
                    wall + hold >= draining[w.slot.host].deadline):
                # Parked (its training function returned) and still waiting for rank 0's at its host's leave-by
                # time: it leaves now, writing the commit it holds (rank 0 may never return: see .completion).
                self.checkpoint_on_leaving(w, draining[w.slot.host].deadline)
                self.send_away(w, w.why, returned_leaves=True)
                self.left_round(w, now)
        for w in job.alive():
            if w.state is not S.DRAINING or wall < force_at.get(w.slot.host, wall + 1):
                continue
            drain = draining[w.slot.host]
            what = f"had not left by {margin:g}s before its host's deadline ({drain.reason}); removed by force"
            if self._deadlines[w.slot.host][1] + margin > drain.deadline - margin:
                what = (f"had not left {margin:g}s after the driver learned of its host's deadline ({drain.reason}), "
                        "which was past or close; removed by force")
            log.warning("job %s: worker %s (%s) %s", job.job_id, w.worker_id, w.label, what)
            w.to(S.LOST, what)
            job.forget_alive()
            job.act(Stop(w.worker_id, what, immediate=True))
            if self.lost_leaver(w, what, now):
                self._forced[w.slot.host] = "removed by force before its deadline"
                job.abort()

    def _force_at(self, host: str, deadline: float, wall: float, margin: float) -> float:
        """When (wall time) ``host``'s draining workers are removed by force: ``margin`` before its deadline, but
        no sooner than ``margin`` after the driver first saw that deadline; logs the skew once."""
        seen = self._deadlines.get(host)
        if seen is None or seen[0] != deadline:
            seen = self._deadlines[host] = (deadline, wall)
            if deadline - margin < wall + margin:
                job = self._job
                lead = deadline - wall
                when = f"already {-lead:.1f}s past" if lead < 0 else f"only {lead:.1f}s ahead"
                log.warning("job %s: host %s's deadline (%s) was %s when the driver learned of it (clock skew, or "
                            "a late notice): its workers leave at their next commit, and are removed by force only "
                            "if still there %gs from now", job.job_id, host, job.hosts.draining[host].reason, when,
                            margin)
        return max(deadline - margin, seen[1] + margin)

    def lost_leaver(self, w: WorkerRecord, what: str, now: float, *, exit_code: int | None = None) -> bool:
        """A draining worker lost inside its round (removed by force, silent, or its process ended: ``exit_code``,
        negative for a signal): a ``worker_failed`` event, not a graceful leave. True when its peers roll back (the
        caller aborts the round); False when a fixed-size job took it as its attempt's failure (its script cannot
        leave at a commit: see :mod:`.fixed_size`), which ends or restarts the job instead. The slot is not blamed
        for it; one blacklisted when it was sent away (drained by hand, a straggler) has that cooldown left."""
        job = self._job
        if self._fixed_failed(w, what, exit_code=exit_code, was_member=w.round == job.round > 0):
            self.fixed_ended(w, what)
            return False
        self.died_draining(w, what)
        reason = what if w.why in ("", what) else f"{what} while draining ({w.why})"  # given up: why is what
        job.last_failure = f"worker {w.worker_id} ({w.label}) {reason}"
        left = [t for s, t, _ in job.hosts.blacklist.blocked_slots(now) if s == w.slot]
        killed_by = signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None
        job.emit("worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                 reason=reason, exit_code=None if killed_by else exit_code,
                 blacklisted_s=round(left[0], 1) if left else None,
                 **({"round": w.round} if w.round else {}), **({"signal": killed_by} if killed_by else {}))
        return True

    def died_draining(self, w: WorkerRecord, what: str) -> None:
        """Draining member ``w`` ended inside its round (``what``: how) instead of leaving at a commit: its peers
        roll back (the caller aborts the round), and the line of its host says so, with the steps they lost: its
        release when it drains, else once its leaving workers are gone if it left the group (removed from
        discovery, where no release tells of it; a slot the host no longer lists, by that slot's name)."""
        self._note_end(w, f"worker {w.worker_id} ({w.label}) {what} while draining, before leaving at a commit")

    def fixed_ended(self, w: WorkerRecord, what: str) -> None:
        """Draining member ``w`` of a fixed-size job ended (``what``: how; exit 0 is its success, anything else the
        attempt's failure): its script cannot leave at a commit, and its host's line says how it ended instead."""
        self._note_end(w, f"worker {w.worker_id} ({w.label}) {what} while draining (a fixed-size script cannot "
                          "leave at a commit)")

    def _note_end(self, w: WorkerRecord, line: str) -> None:
        job = self._job
        if w.slot.host in job.hosts.draining:
            self._forced.setdefault(w.slot.host, line)
        elif not job.hosts.is_usable(w.slot):
            gone = w.slot.host not in job.hosts.ready and w.slot.host not in job.hosts.missing
            self._gone.setdefault(w.slot.host if gone else w.slot, line)

    def _left(self, slot: Slot) -> str:
        """Why a worker on ``slot``, no longer usable and not draining, leaves: its host left, or only its slot."""
        hosts = self._job.hosts
        listed = hosts.missing[slot.host][0] if slot.host in hosts.missing else hosts.ready.get(slot.host)
        if listed is None:
            return f"host {slot.host} left the group"
        return f"slot {slot} left the group (host {slot.host} now lists {listed} slot(s))"

    def release_drained(self, now: float, rollback_pending: bool) -> None:
        """Once no worker is left on a draining host, the cloud may take it (once per host).

        ``rollback_pending``: an aborted round's survivors have not re-formed yet, so the
        steps lost by a forced drain are logged when they do (:meth:`take_forced_drains`).
        """
        job = self._job
        draining = job.hosts.draining
        busy = {w.slot.host for w in job.alive()} if draining else set()
        if self._gone:  # said once its leaving workers are gone (discovery may list it again, with new workers)
            leaving = [w.slot for w in job.alive() if w.state is S.DRAINING or w.state is S.EXITING]
            busy_gone = {s.host for s in leaving} | set(leaving)
            for key in [k for k in self._gone if k not in busy_gone]:
                what = self._left(key) if isinstance(key, Slot) else f"host {key} left the group"
                self._say_forced(f"job {job.job_id}: {what}: ", self._gone.pop(key), rollback_pending)
        for host, drain in draining.items():
            if host not in busy and host not in self._released:
                self._released.add(host)
                job.act(Release(host, job.hosts.instances.get(host)))
                if host in self._terminating:
                    job.hosts.given_back(host)
                had_workers = any(w.slot.host == host for w in job.workers.values())
                if had_workers:
                    left = "" if drain.deadline is None else (
                        f", {drain.deadline - (now + job.wall_offset):.1f}s before its deadline")
                    what = (f"job {job.job_id}: host {host} drained ({drain.reason}, notice from "
                            f"{self.sources.get(host, 'the provider')}){left}: ")
                    kept = self._held_elsewhere(host, self._last_hosts[host]) if host in self._last_hosts else None
                    if kept is not None:  # its workers left as the last holders, and another came to hold it
                        log.info("%sits workers left at a commit, which worker %s (%s) holds too; 0 steps lost", what,
                                 kept.worker_id, kept.label)
                    elif host in self._last_hosts:
                        log.warning("%sits workers left at a commit, holding the last copy of the training state: %s",
                                    what, self._last_copy_gone(host))
                    elif host in self._started_over:
                        log.warning("%sits workers were stopped before any commit was heard of; the job started over "
                                    "from the initial weights", what)
                    elif host not in self._forced:
                        log.info("%s%s", what, self._how_left(host))
                    else:
                        self._say_forced(what, self._forced[host], rollback_pending)
        self._released &= set(draining)
        self._forced = {h: why for h, why in self._forced.items() if h in draining}
        self._started_over &= set(draining)
        self._last_hosts = {h: seq for h, seq in self._last_hosts.items() if h in draining}
        self._terminating &= set(draining)
        self._noticed = {h: ids for h, ids in self._noticed.items() if h in draining and h not in self._released}

    def _how_left(self, host: str) -> str:
        """How the workers of drained ``host`` went, none lost in their round (the release's line): at a commit, 0
        steps lost; or, as a hand drain's reply said they might (:meth:`.health.Health.drain`), to the end of the
        script with a job that completed (parked, or rank 0 past its loop: members of its last round), as early
        returns (their peers rolled back to their last commit), or stopped before they joined a round."""
        job = self._job
        ws = [job.workers[i] for i in self._noticed.pop(host, ()) if i in job.workers]
        ended = job.phase is Phase.FINISHING or (job.outcome is not None and job.outcome.success)
        early = sum(1 for w in ws if w.returned_early)
        ran = sum(1 for w in ws if ended and w.round == job.round and w.rank is not None and not w.returned_early)
        stopped = sum(1 for w in ws if w.rank is None)
        if not early + ran + stopped:
            return "its workers left at a commit; 0 steps lost"
        kinds = ((ran, "ran to the end of the script with the job, which completed"),
                 (early, "left as early returns (their training function returned while rank 0 still trained; the "
                         "others rolled back to their last commit)"),
                 (stopped, "not yet in a round were stopped"), (len(ws) - early - ran - stopped, "left at a commit"))
        return ", and ".join(f"its {n} worker(s) {what}" for n, what in kinds if n)

    def _say_forced(self, what: str, why: str, rollback_pending: bool) -> None:
        """Log that a leaving host's workers did not leave at a commit: when an aborted round's survivors have not
        re-formed yet (``rollback_pending``), once they do, with the steps they rolled back."""
        if rollback_pending:
            self._forced_drains.append(what + why)
        else:
            log.info("%s%s", what, why)
