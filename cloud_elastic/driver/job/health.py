"""Slow, sick and unwanted workers: found, explained, and sent away without a rollback.

:class:`Health` decides, for the job:

* **stragglers** (:meth:`Health.check`): every worker reports its compute time
  per optimizer step (the time its step spends outside waiting on peers; see
  ``worker.link.progress``). A member whose figure stays at least
  ``straggler_factor`` times the median of the others' (under ``--whole-hosts``, of the
  other hosts' workers) for ``straggler_window_s`` is a
  straggler. It is drained like a spot notice (it leaves at its next commit,
  with zero steps lost) and its slot is blacklisted with the usual cooldown, so
  a replacement is taken where discovery offers one. It is kept when draining
  it would take the job below ``--min-np``, or when the job would not be faster
  without it: synchronous training runs at the speed of its slowest worker, so
  N workers do N / slowest samples per unit of work and N − 1 do
  (N − 1) / slowest-of-the-others; it is drained only when the latter is larger
  (:func:`faster_without`). One straggler leaves at a time.
* **slow networks** (:meth:`Health.heard`, and the scan of :meth:`Health.check`): a
  host whose links are all slow, found by pairwise probes (see :mod:`.links`), is
  drained the same way: its workers leave at their next commit, no rollback, its
  slots blacklisted; kept when that would take the job below ``--min-np``, or when
  the job would not be faster without it (:func:`~.links.faster_without_host`).
  Both watches are off at ``--straggler-factor 0``.
* **hand drains** (:meth:`Health.drain`, ``cloud-elastic drain JOB HOST[:SLOT]``):
  a host drains as on a notice from the operator; a slot's worker drains alone
  and its slot is blacklisted, so it is not refilled at once;
* **sick newcomers** (:meth:`Health.unhealthy`): a worker whose device
  self-test failed (see ``worker.selftest``) is given up with that one-line
  reason and its slot blacklisted, before it ever joined a round.

Cost: the scan looks at the round's members at most once a second.
"""

from __future__ import annotations

import logging
import statistics

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.capacity import Capacity
from cloud_elastic.driver.job.completion import EARLY_RETURN_WAIT_S
from cloud_elastic.driver.job.finishing import finishing_hold
from cloud_elastic.driver.job.hosts import Slot, blocked_for, blocked_s
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.driver.job.links import LinkWatch, SlowHost, faster_without_host
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import LinkReport, ProbeOrder
from cloud_elastic.providers.api import Drain

__all__ = ["Health", "faster_without", "comm_share"]

log = logging.getLogger(__name__)

S = WorkerState
#: How often the straggler scan runs (seconds of the job's clock).
_SCAN_EVERY_S = 1.0


def faster_without(slowest: float, others: list[float], leaving: int = 1) -> bool:
    """Would the job do more work per second without its slowest worker (and the ``leaving - 1`` others that go
    with it: its host's, under ``--whole-hosts``)? Compute times per step.

    Every step waits for the slowest worker: N workers do N / slowest samples per
    second of work, N − leaving do (N − leaving) / slowest-of-the-others.
    """
    if not others or slowest <= 0:
        return False
    n = len(others) + leaving
    return (n - leaving) / max(others) > n / slowest


def _medians_of_others(figures: dict[str, float], host_of: dict[str, str] | None = None) -> dict[str, float | None]:
    """Each worker's reference: the median of the others' figures (with ``host_of``, of the other hosts' workers);
    None when there are no others. One sort, then O(removed) per worker, not a median per worker."""
    ranked = sorted(figures, key=lambda wid: figures[wid])
    values = [figures[wid] for wid in ranked]
    position = {wid: i for i, wid in enumerate(ranked)}
    groups: dict[str, list[int]] = {}
    if host_of is not None:
        for wid in ranked:
            groups.setdefault(host_of[wid], []).append(position[wid])

    def nth(removed: list[int], r: int) -> float:  # the r-th smallest of values without the removed positions
        for i in removed:  # ascending
            if i <= r:
                r += 1
        return values[r]

    out: dict[str, float | None] = {}
    for wid in ranked:
        removed = groups[host_of[wid]] if host_of is not None else [position[wid]]
        m = len(values) - len(removed)
        if m <= 0:
            out[wid] = None
        elif m % 2:
            out[wid] = nth(removed, m // 2)
        else:
            out[wid] = (nth(removed, m // 2 - 1) + nth(removed, m // 2)) / 2
    return out


def comm_share(w: WorkerRecord) -> float | None:
    """The share of ``w``'s step time spent in collectives (None until both of its figures are known)."""
    if w.comm_s is None or w.compute_s is None or w.comm_s + w.compute_s <= 0:
        return None
    return w.comm_s / (w.comm_s + w.compute_s)


def _rounded(share: float | None) -> float | None:
    return None if share is None else round(share, 3)


class Health:
    """Stragglers, hand drains and failed self-tests, for one job (see module docstring)."""

    def __init__(self, job: JobView, leavers: Leavers, capacity: Capacity | None = None) -> None:
        self._job = job
        self._leavers = leavers
        #: The job's counts of what stays (:meth:`.capacity.Capacity.room`, :meth:`~.capacity.Capacity.drained_stay`)
        #: and of what a fixed host list may still offer (:meth:`~.capacity.Capacity.fixed_slots_left`): the hand
        #: drain's reply says what the job does by the counts its rules read.
        self._capacity = capacity
        self._slow_since: dict[str, float] = {}  # worker id -> running time it was first seen slow
        self._kept: set[str] = set()  # slow workers (and slow-link hosts) already said to be kept
        self._next_scan = 0.0
        #: Pairwise link probes and the slow-network rule (see :mod:`.links`).
        self.links = LinkWatch()

    # ------------------------------------------------------------ heartbeats
    def heard(self, w: WorkerRecord, link: LinkReport | None, running: float) -> ProbeOrder | None:
        """``w``'s heartbeat carried ``link`` (its probe's port and figures): the probe it is to run now, if any."""
        if self._job.policy.straggler_factor <= 0:
            return None
        return self.links.heard(w.worker_id, w.slot.host, link, running)

    # ----------------------------------------------------------- stragglers
    def check(self, now: float) -> None:
        """Drain a member that stayed a straggler for the window (see module docstring)."""
        job, policy = self._job, self._job.policy
        if policy.straggler_factor <= 0 or job.phase is not Phase.RUNNING or job.adopting:
            return
        running = job.running(now)
        if running < self._next_scan:
            return
        self._next_scan = running + _SCAN_EVERY_S
        self._check_links(running, now)
        members = [w for w in job.members() if w.state is S.RUNNING and not w.returned]
        figures = {w.worker_id: w.compute_s for w in members if w.compute_s is not None and w.compute_s > 0}
        if job.abort_round >= job.round or len(figures) < 2 or len(figures) < len(members):
            self._slow_since.clear()  # a round changing, or not every member measured yet
            return
        # Each worker against the others (under --whole-hosts, the other hosts): a median that counts the worker
        # itself never finds one of two, nor a slow host among two.
        host_of = ({wid: job.workers[wid].slot.host for wid in figures} if policy.whole_host_slots else None)
        others = _medians_of_others(figures, host_of)
        slow = {wid for wid, s in figures.items() if others[wid] is not None and s >= policy.straggler_factor * others[wid]}
        for wid in list(self._slow_since):
            if wid not in slow:
                del self._slow_since[wid]
        for wid in slow:
            self._slow_since.setdefault(wid, running)
        due = [wid for wid, since in self._slow_since.items() if running - since >= policy.straggler_window_s]
        if not due:
            return
        worst = max(due, key=lambda wid: figures[wid])
        self._consider(job.workers[worst], figures, others[worst], now)

    def _consider(self, w: WorkerRecord, figures: dict[str, float], median: float, now: float) -> None:
        job, policy = self._job, self._job.policy
        slowest = figures[w.worker_id]
        # Under --whole-hosts its host's other workers leave with it.
        gone = ({wid for wid in figures if job.workers[wid].slot.host == w.slot.host} if policy.whole_host_slots
                else {w.worker_id})
        leaving = policy.whole_host_slots or 1
        others = [s for wid, s in figures.items() if wid not in gone]
        staying = sum(1 for x in job.active())
        keep = ""
        if staying - leaving < policy.min_np:
            keep = f"draining it would leave {staying - leaving} worker(s), below --min-np {policy.min_np}"
        elif not faster_without(slowest, others, leaving):
            keep = (f"the job would not be faster without it ({len(others)} worker(s) at a slowest "
                    f"{max(others, default=0):.3f} s/step against {len(others) + leaving} at {slowest:.3f} s/step)")
        if keep:
            if w.worker_id not in self._kept:
                self._kept.add(w.worker_id)
                log.warning("job %s: worker %s (%s) is slow (%.3f s of compute per step, %.1fx the other workers' "
                            "median %.3f s) but is kept: %s", job.job_id, w.worker_id, w.label, slowest,
                            slowest / median, median, keep)
            return
        self._slow_since.clear()
        why = (f"straggler: {slowest:.3f} s of compute per step, {slowest / median:.1f}x the other workers' median "
               f"{median:.3f} s for {policy.straggler_window_s:g}s (--straggler-factor {policy.straggler_factor:g})")
        delay = job.hosts.blacklist.record_failure(w.slot, now)
        log.warning("job %s: worker %s (%s) is a %s; it leaves at its next commit and slot %s is blacklisted %s",
                    job.job_id, w.worker_id, w.label, why, w.slot, blocked_for(delay))
        job.emit("straggler", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                 compute_s=round(slowest, 4), median_s=round(median, 4), factor=policy.straggler_factor,
                 window_s=policy.straggler_window_s, **blocked_s(delay), comm_share=_rounded(comm_share(w)))
        self._leavers.send_away(w, why)

    # ------------------------------------------------------- slow networks
    def _check_links(self, running: float, now: float) -> None:
        job = self._job
        present = [(w.worker_id, w.slot.host) for w in job.active() if not w.returned]
        shares = [s for s in (comm_share(w) for w in job.members()) if s is not None]
        median = statistics.median(shares) if shares else None
        self.links.plan(present, running, median)
        if job.abort_round >= job.round:
            return  # a round changing: decide once it has formed
        found = self.links.verdict(running)
        if found is not None:
            self._drain_host(found, now, median)

    def _drain_host(self, found: SlowHost, now: float, share: float | None) -> None:
        job, policy = self._job, self._job.policy
        gone = [w for w in job.active() if w.slot.host == found.host]
        if not gone:
            return
        figures = (f"its fastest link {_mb(found.mb_s)} MB/s against a median of {_mb(found.peers_mb_s)} MB/s between "
                   f"the other hosts (measured with {', '.join(found.peers)})")
        staying = len(job.active())
        keep = ""
        if any(w.state is S.RUNNING for w in gone):  # a newcomer not admitted yet costs the job nothing to refuse
            members = [w for w in job.members() if w.compute_s is not None and w.comm_s is not None]
            compute = statistics.median([w.compute_s for w in members]) if members else None
            comm = statistics.median([w.comm_s for w in members]) if members else None
            ratio = found.mb_s / found.peers_mb_s
            if staying - len(gone) < policy.min_np:
                keep = f"draining it would leave {staying - len(gone)} worker(s), below --min-np {policy.min_np}"
            elif compute is not None and comm is not None and not faster_without_host(
                    len(job.members()), len(gone), compute, comm, ratio):
                keep = (f"the job would not be faster without it (steps of {compute:.3f} s of compute and "
                        f"{comm:.3f} s in collectives)")
        if keep:
            if found.host not in self._kept:
                self._kept.add(found.host)
                log.warning("job %s: host %s has a slow network (%s) but is kept: %s", job.job_id, found.host,
                            figures, keep)
            return
        why = f"slow network: host {found.host}, {figures}"
        log.warning("job %s: %s; its %d worker(s) leave at their next commit and their slots are blacklisted",
                    job.job_id, why, len(gone))
        delays = [job.hosts.blacklist.record_failure(w.slot, now) for w in gone]
        job.emit("slow_link", host=found.host, workers=[w.worker_id for w in gone], mb_s=round(found.mb_s, 2),
                 peers_mb_s=round(found.peers_mb_s, 2), peers=list(found.peers), factor=self.links.factor,
                 **blocked_s(max(delays)), comm_share=_rounded(share))
        for w in gone:
            if w.alive and w.state not in (S.DRAINING, S.EXITING):
                self._leavers.send_away(w, why)

    # ---------------------------------------------------------- hand drains
    def drain(self, host: str, slot: int | None, now: float) -> tuple[bool, str]:
        """``cloud-elastic drain``: (done, what the operator is told)."""
        job = self._job
        if job.phase not in (Phase.STARTING, Phase.RUNNING):
            return False, f"the job is {job.phase.value}"
        on_host = [w for w in job.active() if w.slot.host == host]
        drain = Drain(None, "drained by hand (cloud-elastic drain)")
        if slot is None:
            if host not in job.hosts.ready and not on_host:
                if host not in job.hosts.draining:
                    return False, f"no host {host} in this job"
                # Drained already (a first drain, a cloud's notice): its workers are leaving. Held from now on.
                self._leavers.notice(host, drain, now, source="operator")
                return True, self._already_draining(host)
            # Read before the notice sends them away: what each kind of worker does differs (see _leave_how).
            outside = sum(1 for w in on_host if w.state is not S.RUNNING)
            parked = sum(1 for w in on_host if w.state is S.RUNNING and w.returned)
            members = len(on_host) - outside - parked
            going = sum(1 for w in job.alive() if w.slot.host == host) - len(on_host)  # its slots drained already
            parts = ([self._members_leave(f"its {members} worker(s)", one=False)] if members or not (on_host or going)
                     else [])
            if going:
                parts.append(f"its {going} worker(s) already leaving")
            if parked:
                parts.append(self._parked_stay(f"its {parked} worker(s)", one=False))
            if outside:
                parts.append(self._outside_leave(outside))
            how = ", and ".join(parts)
            self._leavers.notice(host, drain, now, source="operator", how=how)
            job.tick(now)
            return True, (f"host {host} drains: {how}; no new worker is placed there until it leaves "
                          f"discovery{self._below_min_np(now)}")
        mine = [w for w in on_host if w.slot.index == slot]
        if not mine:
            going = [w for w in job.alive() if w.slot.host == host and w.slot.index == slot]
            if going:  # drained already (its host, the slot), a straggler, an early return: it is on its way
                w = going[0]
                doing = "draining" if w.state is S.DRAINING else "leaving"
                how = f": {self._draining_how([w], 'it', one=True)}" if w.state is S.DRAINING else ""
                why = w.why or "told to exit"
                return True, f"worker {w.worker_id} on {host}[{slot}] is already {doing} ({why}){how}"
            return False, f"no worker on {host}[{slot}]"
        w = mine[0]
        why = f"drained by hand (cloud-elastic drain {host}:{slot})"
        # Nothing failed: the slot waits the shortest cooldown and its failure count (which doubles the next real
        # failure's cooldown, and status shows) stays as it was.
        delay = job.hosts.blacklist.retry_soon(Slot(host, slot), now)
        log.warning("job %s: worker %s (%s) %s; %s; its slot is blacklisted %s", job.job_id, w.worker_id, w.label,
                    why, self._leave_how(w, "it"), blocked_for(delay))
        how = self._leave_how(w, f"worker {w.worker_id}")  # read before send_away changes its state
        self._leavers.send_away(w, why)
        job.tick(now)
        whole = job.policy.whole_host_slots and len(on_host) > 1
        mates = " with its host's other workers (--whole-hosts)" if whole else ""
        return True, f"{how}{mates}; slot {host}[{slot}] blacklisted {blocked_for(delay)}"

    def _already_draining(self, host: str) -> str:
        """The reply to a drain of ``host`` while it drains already: what its workers do, per kind as the first reply
        says (:meth:`_draining_how`), or that they are gone."""
        job = self._job
        going = [w for w in job.alive() if w.slot.host == host]
        since = f"{job.hosts.draining[host].reason}, notice from {self._leavers.sources.get(host, 'the provider')}"
        state = (f"is already draining ({since}): {self._draining_how(going, f'its {len(going)} worker(s)', one=False)}"
                 if going else f"was already drained ({since}): its workers have left")
        return f"host {host} {state}; no new worker is placed there until it leaves discovery"

    def _draining_how(self, going: list[WorkerRecord], who: str, *, one: bool) -> str:
        """What drained workers ``going`` (alive, called ``who`` when all of one kind) do, for a drain of what drains
        already: parked members stay until rank 0 returns (:meth:`_parked_stay`: review s59 rvO finding 3, a second
        drain of a parked member's host said it was leaving; it ran to the end of the script), members still
        training leave at their next commit (:meth:`_members_leave`), the others (told to exit) are leaving."""
        parked = sum(1 for w in going if w.state is S.DRAINING and w.returned)
        members = sum(1 for w in going if w.state is S.DRAINING and not w.returned)
        kinds = [(n, how) for n, how in ((members, self._members_leave), (parked, self._parked_stay),
                                         (len(going) - members - parked, None)) if n]
        one = one and len(kinds) == 1
        parts = []
        for n, how in kinds:
            them = who if len(kinds) == 1 else f"its {n} worker(s)"
            parts.append(how(them, one=one) if how is not None else f"{them} {'is' if one else 'are'} leaving")
        return ", and ".join(parts)

    def _leave_how(self, w: WorkerRecord, who: str) -> str:
        """What drained worker ``w`` (called ``who``) does, read before it is sent away, for the reply and the log
        alike: one not yet in a round leaves now; a parked member as :meth:`_parked_stay` says, a training one as
        :meth:`_members_leave` says."""
        if w.state is not S.RUNNING:
            return f"{who}, not yet in a round, leaves now (stopped in its set-up, or told to exit at rendezvous)"
        if w.returned:
            return self._parked_stay(who, one=True)
        return self._members_leave(who, one=True)

    @staticmethod
    def _parked_stay(who: str, *, one: bool) -> str:
        """What drained parked members (``who``: their training function returned, and they wait for rank 0's) do.
        A drain has no deadline to cut that wait short (:meth:`.leaving.Leavers.send_away`): if they returned at the
        end of training they stay until rank 0 returns, and are told ``done`` then (the rest of their script runs).
        Until rank 0 returns or waits :data:`~.completion.EARLY_RETURN_WAIT_S` in a collective (which needs them:
        they returned early), the driver cannot tell which; an early return leaves the job then, and the others roll
        back to their last commit (:meth:`.completion.Completion.check_early_returns`). The reply says both."""
        stay, run, leave, it = ("stays", "runs", "leaves", "it") if one else ("stay", "run", "leave", "them")
        comma = "," if one else ""
        return (f"{who}{comma} whose training function returned{comma} {stay} until rank 0 returns from its own, then "
                f"{run} to the end of the script, or {leave} the job if that return proves early (rank 0 still in its "
                f"loop waits {EARLY_RETURN_WAIT_S:g}s in a collective that needs {it}; the others then roll back to "
                "their last commit)")

    def _members_leave(self, who: str, *, one: bool) -> str:
        """What drained round members (``who``; ``one``: a single worker) do: leave at their next commit. While the
        job may still be fixed-size (:meth:`.capacity.Capacity.drained_stay`: no worker has entered
        ``hvd.elastic.run``, a worker of an elastic script still in its set-up after ``hvd.init()`` included), the
        driver cannot tell yet which it is, and says both: they leave at their first commit if the script enters
        ``hvd.elastic.run``, and run to the end of the script with the others if it never does (a fixed-size script
        cannot leave at a commit). While the round may be finishing (:func:`.finishing.finishing_hold`: a member
        returned at the last commit), rank 0 may be past its loop, never to commit again: it then runs to the end of
        the script, and the job completes when it returns; the driver cannot tell that either, and says both."""
        its = "its" if one else "their"
        leave, run = ("leaves", "runs") if one else ("leave", "run")
        hold = finishing_hold(self._job)
        if hold is not None:  # rank 0 may be past its loop (an evaluation, a final save), never to commit again
            return (f"{who} {leave} at {its} next commit if rank 0 is still in its training loop, or {run} to the end "
                    f"of the script with the others if it is past it (rank {hold[1].rank} returned from its training "
                    "function at the last commit: the round is likely finishing)")
        if self._capacity is None or not self._capacity.drained_stay():
            return f"{who} {leave} at {its} next commit"
        return (f"{who} {leave} at {its} first commit if the script enters hvd.elastic.run, or {run} to the end of the "
                "script with the others if it never does (none has entered it yet; a fixed-size script cannot leave "
                "at a commit)")

    @staticmethod
    def _outside_leave(n: int) -> str:
        """What ``n`` drained workers not yet in a round do, a fixed-size script's too
        (:meth:`.leaving.Leavers.send_away`): leave now, one still in its set-up (before ``hvd.init()``) stopped, one
        waiting at rendezvous told to exit."""
        return (f"its {n} worker(s) not yet in a round leave now (stopped in their set-up, or told to exit at "
                "rendezvous)")

    def _below_min_np(self, now: float) -> str:
        """The hand drain's warning when it leaves room for fewer workers than ``--min-np`` (else ""): what the job
        does then. The room (:meth:`.capacity.Capacity.room`) is the workers that stay, on a host with a soft notice
        too, and the free available slots (under ``--whole-hosts``, of whole hosts). While the job may still be
        fixed-size its drained workers stay (:meth:`.capacity.Capacity.drained_stay`); the warning then says what
        happens if the script enters ``hvd.elastic.run`` after all, when they leave at a commit, unless those not yet
        in a round (stopped in their set-up, told to exit at rendezvous) leave too few already. A fixed list ends
        only when the slots it may still use (:func:`~.capacity.slots_left`, the rule
        :meth:`.capacity.Capacity.check` ends it by) are fewer; slots cooling down or on a host with a notice may
        serve again, and the job waits for them. A job with discovery waits for more."""
        policy, capacity = self._job.policy, self._capacity
        if capacity is None:
            return ""
        room = capacity.room(now, drained_stay=False)
        if room >= policy.min_np:
            return ""
        warn = "; WARNING: "
        if capacity.drained_stay():
            staying = capacity.room(now)  # with the drained members that run to the script's end, not those set-up
            if staying >= policy.min_np:
                warn = "; WARNING: if the script enters hvd.elastic.run, "
            else:
                room = staying  # workers stopped in their set-up or at rendezvous: short now, elastic.run or not
        hold = finishing_hold(self._job)  # no --min-np wait while the round finishes (Capacity._round_finishing)
        if hold is not None:
            return (f"; rank {hold[1].rank} returned from its training function at the last commit: the job completes "
                    f"when rank 0 returns from its own, however few workers are left")
        wait = f"up to --elastic-timeout ({policy.elastic_timeout_s:g}s), then fails"
        if policy.hosts_fixed:  # a drained host of a fixed list never comes back (driver.job.capacity)
            found = capacity.fixed_slots_left()
            if found is not None and not found.certain(policy.min_np):
                return (f"{warn}that leaves {found.left} slot(s), below --min-np {policy.min_np}, and a fixed -H "
                        f"list cannot grow: the job ends once its workers have left (its newest commit written "
                        f"first with --checkpoint-dir)")
            if found is not None and found.left > room:
                return (f"{warn}that leaves room for {room} worker(s), below --min-np {policy.min_np}, and "
                        f"{found.left - room} more slot(s) cooling down after a failure or on a host with a notice: "
                        f"the job waits for them {wait}")
        return (f"{warn}that leaves room for {room} worker(s), below --min-np {policy.min_np}: the job waits for "
                f"more {wait}")

    # ------------------------------------------------------- sick newcomers
    def unhealthy(self, w: WorkerRecord, reason: str, now: float) -> None:
        """``w``'s device self-test failed: give it up with that reason (its slot is blacklisted)."""
        if not w.alive:
            return
        self._job.give_up(w, reason, now, stacks=False)  # it explained itself


def _mb(mb_s: float) -> str:
    """A link's MB/s for a log line: one decimal; below 1, up to three (0.02, not 0.0), and below 0.001 said so."""
    if mb_s >= 1:
        return f"{mb_s:.1f}"
    return f"{mb_s:.3f}".rstrip("0") if mb_s >= 0.001 else "under 0.001"
