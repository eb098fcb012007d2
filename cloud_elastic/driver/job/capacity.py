"""Capacity: which slots get a new worker, and how long the job may wait for enough of them.

:class:`Capacity` decides, for the job:

* launches (:meth:`Capacity.plan_launches`): up to ``max_np`` staying workers (and ``--spares``
  beyond them, see :mod:`.spares`; the last holders of the state on leaving hosts,
  draining or kept missing, and spares on doubtful hosts hold no place),
  on the free usable slots in host order (a slot whose last worker was given
  up stays taken until its process is gone). At start-up nothing launches
  until ``num_proc`` slots are free; past ``start_timeout_s`` the job fails
  naming the slots it found (or discovery's last error, when it never answered);
* with ``--whole-hosts``, launches fill whole hosts only: a host gets its
  ``whole_host_slots`` workers at once when every one of those slots is free
  and usable, and only while the job has room for all of them;
* the ``min_np`` watch (:meth:`Capacity.check`): below ``min_np`` workers for
  ``elastic_timeout_s`` the job fails (the only end of a job whose discovery fails once it has
  answered: see :mod:`.discovery_edge`; the line then says so); with a host source that never grows (a fixed
  ``-H`` list, ``Policy.hosts_fixed``) it fails at once when the slots of its hosts ready,
  draining for a notice (which may lapse) or missing, less those blacklisted for the rest
  of the job and the hosts an operator drained, are fewer than ``min_np`` (no wait can
  bring more), naming them and the last failure. While the job is, or may still be,
  fixed-size (no worker entered ``hvd.elastic.run``, see :mod:`.fixed_size`), a member
  draining counts as staying: a script without ``elastic.run`` cannot leave at a commit,
  and it runs to its end with the others (:meth:`Capacity.drained_stay`). Outside start-up a worker counts only once
  it reached rendezvous, so a slot that crashes on every launch does not restart
  the timeout each time. Before the first round, once a worker failed (its host
  not reachable yet, a booting VM; or its process exited: a script missing on one
  host), a worker counts only once it reached rendezvous too, the wait is bounded
  by ``start_timeout_s`` from the driver's start instead, and the job fails naming
  the last failure (its worker, so its slot).

Worker ids are ``host[slot]#seq`` with ``seq`` never reused, an adopted
predecessor's included (:meth:`Capacity.seen`). A long wait prints a progress
line every :data:`PROGRESS_EVERY_S` saying how long it has lasted.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

from cloud_elastic.driver.job.actions import Launch, Phase
from cloud_elastic.driver.job.finishing import finishing_hold
from cloud_elastic.driver.job.hosts import HostManager, Slot, blocked_for, some_hosts
from cloud_elastic.driver.job.plan import whole_host_groups
from cloud_elastic.driver.job.sourcing import Sourcing
from cloud_elastic.driver.job.spares import doubtful, launch_room
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

if TYPE_CHECKING:
    from cloud_elastic.driver.job.fixed_size import FixedSize

__all__ = ["Capacity", "PROGRESS_EVERY_S", "SlotsLeft", "slots_left", "whole_hosts"]

log = logging.getLogger(__name__)

S = WorkerState
#: Workers that stay in the job (not draining, exiting or done): ``JobView.active``'s states.
_STAYING = (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING)

#: How often a long wait (slots for -np, below --min-np) prints a progress line.
PROGRESS_EVERY_S = 15.0


class Capacity:
    """Launch planning and the ``min_np`` watch of one job (see module docstring)."""

    def __init__(self, job: JobView, send_away: Callable[[WorkerRecord, str], None] | None = None,
                 fixed: FixedSize | None = None) -> None:
        self._job = job
        #: Whether the job runs a script without ``hvd.elastic.run`` (:mod:`.fixed_size`; None: an elastic job).
        self._fixed = fixed
        #: Which sources slots come from (several sources; see :mod:`.sourcing`): it orders and limits launches,
        #: and sends fallback workers away (``send_away``: :meth:`.leaving.Leavers.send_away`) once cheaper slots return.
        self.sourcing = Sourcing(job, send_away) if job.policy.sources and send_away is not None else None
        #: The highest worker sequence number used (ids are never reused).
        self.seq = 0
        #: When the driver started (``ElasticJob.start``): the start timeout counts from it.
        self.started_at: float | None = None
        self._below_min_since: float | None = None
        self._finishing_logged = False  # the round's finishing hold was logged (see _round_finishing)
        self._waits: dict[str, tuple[float, float]] = {}  # progress lines: key -> (since, last)
        #: Host -> its slots, as last seen ready or missing (a fixed list's draining host keeps them), and the
        #: ``hosts.version`` they were read at.
        self._slots: dict[str, int] = {}
        self._slots_version = -1

    def seen(self, seq: int) -> None:
        """A worker numbered ``seq`` exists (adopted from a predecessor): later ids follow it."""
        self.seq = max(self.seq, seq)

    def plan_launches(self, now: float) -> None:
        """Queue a :class:`Launch` for each free slot the job may fill now."""
        job = self._job
        if self.sourcing is not None:
            self.sourcing.step(now)
        if job.adopting:
            return  # the predecessor's workers are being taken back (Adoption.open): no slot is known free yet
        starting = job.phase is Phase.STARTING and not job.workers
        policy = job.policy
        replaced = self.sourcing.replacing if self.sourcing is not None else 0
        room = launch_room(self._placed() - replaced, max_np=policy.max_np, spares=policy.spares,
                           host_slots=policy.whole_host_slots)
        if room <= 0 and not starting:
            return  # a full job need not look for free slots (a scan of every slot of the group)
        # A worker given up (LOST) may still be running on its GPU until its process is gone.
        occupied = {(w.slot.host, w.slot.index) for w in job.workers.unexited()}
        free = [s for s in job.hosts.available_slots(now) if (s.host, s.index) not in occupied]
        only = self._fixed.plain_retries() if self._fixed is not None else None
        if only is not None:  # a plain command's run: its booting hosts' slots alone, tried again (.fixed_size)
            free = [s for s in free if (s.host, s.index) in only]
        if self.sourcing is not None:
            free = self.sourcing.order(free)
        if job.policy.whole_host_slots:
            free = whole_hosts(free, job.policy.whole_host_slots)
            room -= room % job.policy.whole_host_slots
        if starting:
            if len(free) < job.policy.num_proc:
                self._too_few_to_start(now, len(free))
                return
        for slot in free[: max(room, 0)]:
            self.seq += 1
            worker_id = f"{slot.host}[{slot.index}]#{self.seq}"
            job.workers[worker_id] = WorkerRecord(worker_id, slot, self.seq, launched_at=now,
                                                  last_seen=job.running(now))
            job.forget_alive()
            job.act(Launch(slot, worker_id))
            job.emit("worker_started", worker=worker_id, host=slot.host, slot=slot.index, **self._source_of(slot))

    def _placed(self) -> int:
        """The staying workers that hold a place for launches: not the last holders of the state training on a
        leaving host (a draining one, or one missing past the grace that the job keeps: a new worker takes their
        place; see :meth:`.leaving.Leavers.mark`, :mod:`.discovery_edge`), nor, with ``--spares``, a worker
        outside the rounds on a doubtful host (a healthy spare replaces it; see :mod:`.spares`)."""
        job = self._job
        hosts, spares = job.hosts, job.policy.spares
        active = job.active()
        if not hosts.draining and not hosts.notices and not hosts.kept and not (
                spares and (hosts.soft or hosts.provider_soft or hosts.missing)):
            return len(active)  # nothing to leave out: spares a scan of every worker each step
        placed = 0
        for w in active:
            if w.state is S.RUNNING and not hosts.stays(w.slot):
                continue
            if spares and w.rank is None and doubtful(hosts, w.slot.host):
                continue
            placed += 1
        return placed

    def _source_of(self, slot) -> dict:
        """The ``source`` and ``price`` fields of a worker's events, where the job has several sources."""
        if self.sourcing is None or not self.sourcing.active:
            return {}
        hosts = self._job.hosts
        price = hosts.prices.get(slot.host)
        return {"source": hosts.sources.get(slot.host, ""), **({} if price is None else {"price": price})}

    def _too_few_to_start(self, now: float, free: int) -> None:
        job, policy = self._job, self._job.policy
        self._progress(now, "start", f"waiting for -np {policy.num_proc} slot(s): {free} available")
        if self.started_at is not None and now - self.started_at > policy.start_timeout_s:
            if not job.discovered_once and job.last_discovery_error:
                why = f"host discovery kept failing for {policy.start_timeout_s:g}s (--start-timeout): "
                job.end(False, why + job.last_discovery_error, 1)
                return
            hosts = job.hosts
            none = (job.discovered_once and not hosts.ready and not hosts.draining and not hosts.missing
                    and not job.discovery_failing_since)
            job.end(False, f"only {free} slot(s) available after {policy.start_timeout_s:g}s; "
                           f"-np {policy.num_proc} needed to start{self._discovery_failing(now)}"
                           f"{'; host discovery found no hosts at all' if none else ''}", 1)

    def _round_finishing(self) -> bool:
        """A member of the current round returned from its training function at the job's newest commit while rank 0
        is still in its own (:func:`.finishing.finishing_hold`): rank 0's return completes the job however few
        workers are left, and no wait for more can end it (an evaluation on rank 0 longer than ``--elastic-timeout``
        failed a healthy job). The hold has no limit of its own, as ``horovodrun`` waits: ``--finish-timeout`` counts
        from rank 0's return, and only the no-progress and silence watches bound rank 0 before it. Once the round is
        aborted or rank 0 is lost or back at rendezvous (it returned early: it trains on), the wait for ``min_np``
        starts."""
        job = self._job
        hold = finishing_hold(job)  # below min_np only: a scan of every worker, as check's count
        if hold is None:
            self._finishing_logged = False
            return False
        if not self._finishing_logged:
            self._finishing_logged = True
            rank0, holder = hold
            log.info("job %s: rank %s (%s) returned at commit %d and rank 0 (%s) is still in its training function: "
                     "the job waits for rank 0 to return, however few workers are left (--min-np %d)", job.job_id,
                     holder.rank, holder.worker_id, holder.commit_seq, rank0.worker_id, job.policy.min_np)
        return True

    def check(self, now: float) -> None:
        """Fail the job after ``elastic_timeout_s`` below ``min_np`` workers (before the first round, after a
        failure: past ``start_timeout_s`` from the driver's start); not while the round finishes
        (:meth:`_round_finishing`)."""
        job, policy = self._job, self._job.policy
        if (job.phase is Phase.STARTING and job.round == 0 and not job.workers) or job.phase is Phase.DONE:
            return  # nothing launched yet, or the job ended this step (too few slots to start): nothing to wait for
        if policy.hosts_fixed and job.hosts.version != self._slots_version:
            self._remember_slots()
        failed_start = self._failed_start()
        # Once a worker failed, one counts only when it reaches rendezvous: a slot that crashes or cannot be
        # reached on every launch must not restart the timeout each time. At start-up before any failure
        # the workers still starting count (each one's set-up is bounded by --start-timeout: .liveness).
        if job.phase is Phase.STARTING and not failed_start:
            counted, what = len(job.active()), "available"
        else:
            counted, what = 0, "ready"
            draining = self.drained_stay()  # a fixed-size script's draining member never leaves at a commit
            for w in job.alive():  # a count, not a list: this runs over every worker each step
                if w.state is S.WAITING or w.state is S.RUNNING or (draining and w.state is S.DRAINING):
                    counted += 1
        if counted >= policy.min_np:
            self._finishing_logged = False  # a later hold (the next hvd.elastic.run function's) is logged again
        if counted >= policy.min_np or self._round_finishing():
            self._below_min_since = None
            self._waits.pop("min_np", None)
            return
        if policy.hosts_fixed and self._never_enough(counted):
            return
        # The line says the count it compares (a worker still starting does not count here: see above).
        starting = len(job.active()) - counted
        what += f" ({starting} more starting)" if starting else ""
        if self._below_min_since is None:
            self._below_min_since = now
            wait, limit = policy.elastic_timeout_s, ""
            if failed_start:
                wait, limit = max(0.0, self.started_at + policy.start_timeout_s - now), " (--start-timeout)"
            log.warning("job %s: %d worker(s) %s, below --min-np %d; waiting up to %gs%s for more%s", job.job_id,
                        counted, what, policy.min_np, round(wait), limit, self._discovery_failing(now))
        else:
            self._progress(now, "min_np", f"below --min-np {policy.min_np}: {counted} worker(s) {what}",
                           lambda: self._held_back(now))
        if failed_start:
            if now - self.started_at > policy.start_timeout_s:  # rather than relaunching the failing slots for good
                who = "no worker" if counted == 0 else f"only {counted} of --min-np {policy.min_np} worker(s)"
                job.end(False, f"{who} could be started within {policy.start_timeout_s:g}s (--start-timeout): "
                               f"last: {job.last_failure}", 1)
            return
        if now - self._below_min_since > policy.elastic_timeout_s:
            last = f"; last failure: {job.last_failure}" if job.last_failure else ""
            job.end(
                False,
                f"fewer than --min-np {policy.min_np} worker(s) for {policy.elastic_timeout_s:g}s "
                f"(elastic timeout){last}{self._discovery_failing(now)}",
                1,
            )

    def _discovery_failing(self, now: float) -> str:
        """What a wait for slots says of discovery failing since it answered ('' if it is not): while it fails the
        job keeps its hosts (see :mod:`.discovery_edge`), and no new host can end the wait."""
        job = self._job
        since = job.discovery_failing_since
        if since is None or not job.discovered_once:
            return ""
        return (f"; host discovery has failed for {now - since:.0f}s, so no new host can be seen: "
                f"{job.last_discovery_error}")

    def _remember_slots(self) -> None:
        """Note each host's slots while ready or missing: a draining host's are no longer in ``hosts.ready``."""
        hosts = self._job.hosts
        self._slots_version = hosts.version
        self._slots.update(hosts.ready)
        self._slots.update((host, slots) for host, (slots, _) in hosts.missing.items())

    def fixed_slots_left(self) -> SlotsLeft | None:
        """The slots a fixed host list may still use (:func:`slots_left`, over the slots last seen of each host);
        None when a host's slots are unknown. Both the ``min_np`` watch and the hand drain's reply read it."""
        if self._job.hosts.version != self._slots_version:
            self._remember_slots()
        return slots_left(self._job.hosts, self._slots, self._job.policy.whole_host_slots)

    def drained_stay(self) -> bool:
        """The job is, or may still be, fixed-size (:mod:`.fixed_size`): no worker has entered ``hvd.elastic.run``
        (its heartbeats say so) and none committed (commits are made inside it; a resumed job holds committed
        state). A member draining then may never leave: a fixed-size script cannot leave at a commit, so it runs
        to its end with the others, and counts as staying (the ``min_np`` watch, the fixed list's end, the hand
        drain's reply). Once a worker enters ``elastic.run`` it leaves at its next commit, and counts as gone."""
        fixed = self._fixed
        return fixed is not None and not fixed.elastic and not self._job.state_committed

    def room(self, now: float, *, drained_stay: bool | None = None) -> int:
        """How many workers the job may hold now without waiting for a slot: its workers that stay (those on a host
        with a soft notice too: they train on; while :meth:`drained_stay`, unless ``drained_stay`` says otherwise,
        its draining members too), plus its free available slots (under ``--whole-hosts`` those of whole hosts only,
        as launches take them: :func:`whole_hosts`). The hand drain's reply compares it with ``min_np``."""
        job = self._job
        hosts, whole = job.hosts, job.policy.whole_host_slots
        draining = self.drained_stay() if drained_stay is None else drained_stay
        occupied, staying = set(), 0
        for w in job.workers.unexited():
            occupied.add((w.slot.host, w.slot.index))  # a worker given up may still run until its process is gone
            if (w.state in _STAYING and hosts.stays(w.slot)) or (draining and w.state is S.DRAINING):
                staying += 1
        free = [s for s in hosts.available_slots(now) if (s.host, s.index) not in occupied]
        if whole:
            free = whole_hosts(free, whole)
        return staying + len(free)

    def _never_enough(self, counted: int) -> bool:
        """A fixed host list (``Policy.hosts_fixed``) with fewer slots than ``min_np`` left once those blacklisted
        for the rest of the job and the hosts an operator drained (``hosts.held``) are set aside
        (:func:`slots_left`): no round can form again, so the job ends now through the failing end (its newest
        commit checkpointed first) instead of waiting for hosts that never come."""
        job, policy = self._job, self._job.policy
        found = self.fixed_slots_left()
        if found is None or found.certain(policy.min_np):
            return False
        blocked, held = found.blocked, found.held
        named = ", ".join(str(s) for s in blocked[:8]) + (f" and {len(blocked) - 8} more" if len(blocked) > 8 else "")
        why = [f"{named} blacklisted for the rest of the job"] if blocked else []
        if held:
            why.append(f"host(s) {', '.join(held[:8])}{f' and {len(held) - 8} more' if len(held) > 8 else ''} "
                       "drained by an operator")
        last = f"; last failure: {job.last_failure}" if job.last_failure else ""
        job.end(False, f"{counted} worker(s) ready and {found.left} slot(s) left for --min-np {policy.min_np}: "
                       f"{', '.join(why)}, and a fixed host list never grows{last}", 1)
        return True

    def _failed_start(self) -> bool:
        """Before the first round, a worker failed: its host not reachable yet (a booting VM, retried: see
        :mod:`.failures`), or its process exited (code or a package missing on one host: relaunched after each
        cooldown). --start-timeout, counted from the driver's start, bounds the wait rather than
        --elastic-timeout: its help promises a bound on the workers' start."""
        job = self._job
        return (bool(job.last_failure) and job.round == 0 and (not job.state_committed or job.resumed)
                and self.started_at is not None)

    def _held_back(self, now: float) -> str:
        """Why listed hosts take no new worker, for the wait's progress line ('' for none): a notice pending, a
        drain by hand, a soft notice, slots cooling down. After every worker left on a notice, the wait said nothing
        of it for minutes (review s63 rvU finding 8)."""
        hosts = self._job.hosts
        why: dict[str, str] = {}
        for host in hosts.draining:
            lapses = hosts.notice_lapses_in(host, now)
            if host in hosts.held:
                why[host] = "drained by hand"
            elif lapses is not None:
                why[host] = f"notice pending, lapses in {lapses:.0f}s if still listed"
        for host in hosts.ready:
            if host in hosts.soft or host in hosts.provider_soft:
                why[host] = "soft notice"
        cooling: dict[str, list[float]] = {}
        for slot, left, _ in hosts.blacklist.blocked_slots(now):
            cooling.setdefault(slot.host, []).append(left)
        for slot, _ in hosts.blacklist.for_good_slots():
            cooling.setdefault(slot.host, []).append(math.inf)
        for host, lefts in cooling.items():
            if host in hosts.ready and host not in why:
                why[host] = f"{len(lefts)} slot(s) blacklisted {blocked_for(max(lefts))}"
        if not why:
            return ""
        ordered = sorted(why.items(), key=lambda item: hosts.order_of(item[0]))
        return "; held back: " + some_hosts([f"{host} ({reason})" for host, reason in ordered])

    def _progress(self, now: float, key: str, what: str, why: Callable[[], str] = lambda: "") -> None:
        """A progress line for a long wait, every PROGRESS_EVERY_S, saying how long it has lasted, then ``why()``
        (asked only when the line is due)."""
        since, last = self._waits.get(key, (now, now))
        if key not in self._waits:
            self._waits[key] = (now, now)
        elif now - last >= PROGRESS_EVERY_S:
            self._waits[key] = (since, now)
            log.info("job %s: %s (waiting for %.0fs)%s", self._job.job_id, what, now - since, why())



@dataclass(frozen=True)
class SlotsLeft:
    """What a fixed host list may still offer a round (:func:`slots_left`)."""

    #: Slots of hosts ready, draining for a notice (which may lapse) or missing (which may be listed again),
    #: cooling down or not, less those blacklisted for the rest of the job and the hosts an operator drained.
    left: int
    #: Slots blacklisted for the rest of the job.
    blocked: tuple[Slot, ...] = ()
    #: Hosts an operator drained (``cloud-elastic drain``): never usable again on a fixed list.
    held: tuple[str, ...] = ()

    def certain(self, min_np: int) -> bool:
        """Whether a round of ``min_np`` may still form (False: the fixed list's job cannot go on)."""
        return (not self.blocked and not self.held) or self.left >= min_np


def slots_left(hosts: HostManager, known: Mapping[str, int], whole: int = 0) -> SlotsLeft | None:
    """The slots a fixed host list may still use, its hosts' slot counts taken from ``known`` (host -> slots, as
    last seen ready or missing: a draining host's are no longer in ``hosts.ready``); None when a host's count is
    unknown (nothing is then certain). Under ``--whole-hosts`` (``whole`` slots) a host counts whole or not at
    all. A slot cooling down, a host with a soft notice and one draining for a notice all count: each may serve
    again. Pure: it reads ``hosts`` and ``known`` only."""
    blacklist = hosts.blacklist
    left, blocked = 0, []
    for host in [*hosts.ready, *hosts.draining, *hosts.missing]:
        if host in hosts.held:
            continue
        slots = known.get(host)
        if slots is None:
            return None
        gone = [Slot(host, i) for i in range(slots) if blacklist.for_good(Slot(host, i))]
        blocked += gone
        if whole:
            left += whole if slots >= whole and not any(s.index < whole for s in gone) else 0
        else:
            left += slots - len(gone)
    return SlotsLeft(left, tuple(blocked), tuple(hosts.held))


def whole_hosts(free: list, slots: int) -> list:
    """The slots of ``free`` on hosts whose slots ``0..slots-1`` are all in it, host by host, in ``free``'s order."""
    return [slot for host in whole_host_groups(free, slots, lambda s: (s.host, s.index)) for slot in host]
