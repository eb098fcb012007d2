"""The planned next round's process group, formed in the background while this worker trains on.

The driver may plan the next round before it asks the running round to change
(see ``driver.job.next_round``): each member gets the plan in its heartbeat
reply (:class:`~cloud_elastic.protocol.NextRound`). :class:`NextGroupMixin`
(the worker context's) then forms the plan's group on a thread of its own, on
the round's namespace with the suffix ``-p<plan>`` and on a store client of its
own (a TCPStore client runs one operation at a time; the training thread's must
stay free for a round that forms as usual meanwhile), runs one allreduce on it
(so that *formed* means every member reached every other), and reports it to
the driver (kind ``next_round``). The running round is not touched: its
collectives go on in their own group.

The switch happens at a commit: the members rendezvous, and an assignment that
names the plan (``Assignment.planned``) makes ``RoundGroupsMixin._form_group``
take this group instead of forming one. The group is retired (abandoned and
reclaimed by the :class:`~.reclaim.Reaper`, so no thread or descriptor stays)
when the driver stops offering the plan before its round formed (it dropped
it, or the job is finishing), when a round forms without it, when a restarted
driver adopts this worker, when the worker is sent away (unless the driver formed
the plan's round already: the worker leaves at that round's first commit, and
its peers' sync needs it there), and at exit. A plan
whose group cannot be formed is reported as such: the driver drops it and the
round changes as usual. A worker adopted by a restarted driver also forgets the
dead driver's plan numbers (:meth:`NextGroupMixin._forget_plans`): the new
driver numbers its plans from 1 again.

Retiring a plan cancels its formation: a wait for a peer's key fails at once
(``RoundStore.give_up``), so the thread ends a slice later. Once the worker
leaves or exits (:meth:`NextGroupMixin._close_next`) no formation starts again:
the heartbeats go on through the exit hooks, and an offer still in a reply then
started one after the exit hook had dropped it, which the interpreter finalized
under, inside torch's C++ (SIGABRT after a job that had succeeded). A plan's
check still waiting on a peer then is ended by shutting its connections down
(the current round is let go of at the same time). A formation blocked in
Gloo's own connection to a peer that vanished cannot be cancelled; the exit
hook does not let the interpreter finalize under it (``worker.exiting``).

Gloo only: a worker on another backend reports at once that it cannot form the
group in the background, and the job admits as usual. (An NCCL communicator
formed on a second thread while the training thread uses the device is not
exercised on hardware.)
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cloud_elastic.protocol import NextRound, NextRoundReport, RankInfo
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.link.client import DriverClient
from cloud_elastic.worker.rounds.groups import RoundGroup, RoundInfo, _size_of
from cloud_elastic.worker.rounds.reclaim import GroupSockets, socket_inodes

__all__ = ["NextGroupMixin"]

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    offer: NextRound
    store: Any = None
    group: RoundGroup | None = None
    failed: bool = False
    dropped: bool = False
    #: The training thread joins the plan's round as its current one (a newcomer): the report that it formed
    #: waits for its first collective there, so that the running round switches once it is set up.
    joined: bool = False
    reported: bool = False
    #: When it was made (monotonic): only replies to heartbeats sent later can say the plan is gone.
    since: float = field(default_factory=time.monotonic)
    #: Set when its formation ended (formed or not).
    done: threading.Event = field(default_factory=threading.Event)


class NextGroupMixin:
    """The worker context's planned next round (see module docstring). Its state is guarded by one lock:
    the heartbeat thread starts and drops plans, a formation thread fills them, the training thread takes one."""

    def _next_lock(self) -> threading.Lock:
        lock = self.__dict__.get("_next_lock_")
        if lock is None:
            lock = self.__dict__.setdefault("_next_lock_", threading.Lock())
        return lock

    @property
    def next_plan(self) -> int:
        """The plan this worker acts on (for its heartbeat; the driver answers at once when it offers another),
        0 when none: the one it forms, or the one whose round it joined before the driver formed it."""
        pending = self.__dict__.get("_next_pending")
        if pending is not None:
            return pending.offer.plan
        info = self.info
        return info.planned if info is not None and info.planned and self._seen_round < info.round else 0

    # -------------------------------------------------------- heartbeat thread
    def _next_offered(self, offer: NextRound | None, round_now: int, round_plan: int, sent: float) -> None:
        """What a heartbeat reply (to a poll ``sent`` then) says of the planned next round: ``offer``, the
        driver's current round ``round_now`` and the plan it formed from, ``round_plan``."""
        info = self.info
        if info is not None and info.planned:
            if offer is not None and offer.plan == info.planned:
                return  # this worker is in the plan's round already (a newcomer answered at once)
            if (sent > self.__dict__.get("_planned_at", float("inf")) and round_now <= info.round
                    and not (round_now == info.round and round_plan == info.planned)):
                self.__dict__["_gone_plan"] = info.planned  # its collectives fail now: see _plan_given_up
        pending = self.__dict__.get("_next_pending")
        if getattr(self, "dismissed", False):
            self._drop_next("the worker is dismissed")  # its rounds are over: no plan of it forms
            return
        if getattr(self, "sent_away", None) is not None:
            # It leaves at its next commit: no plan of it forms, except one whose round the driver formed already.
            # That round is this worker's until that commit, and its peers' first collective waits for it there
            # (a drain noticed between the round's forming and this worker's switch dropped the group: the round
            # was aborted, and its survivors synced again and reported a rollback).
            if pending is None or not (round_now == pending.offer.round and round_plan == pending.offer.plan):
                self._drop_next("the worker is sent away")
            return
        if offer is not None:
            if pending is None or pending.offer.plan != offer.plan:
                self._start_next(offer)  # retires the plan it held, if another
        elif (pending is not None and sent > pending.since
              and not (round_now == pending.offer.round and round_plan == pending.offer.plan)):
            # No longer offered, and not the round the driver formed: the plan was dropped.
            self._drop_next("the driver dropped the plan")

    def _plan_given_up(self, round_: int) -> bool:
        """Whether ``round_`` is a planned round this worker joined and the driver has since dropped."""
        info = self.info
        return (info is not None and info.round == round_ and info.planned != 0
                and self.__dict__.get("_gone_plan") == info.planned)

    def _start_next(self, offer: NextRound, *, joined: bool = False,
                    why: str = "the driver planned another round") -> _Pending:
        """Form ``offer``'s group, unless its formation is under way already; retire another plan's. The heartbeat
        thread (an offer) and the training thread (an assignment naming the plan) are answered at the same moment
        when a plan is made: whichever comes second takes the first one's formation, so that this worker never
        forms the same rank of the plan's group twice (peers would connect to one of the two, and the other one,
        perhaps the one the round uses, wait out the formation deadline)."""
        with self._next_lock():
            if self.__dict__.get("_next_closed"):  # leaving or exiting: a formation now would outlive the process
                pending = _Pending(offer, failed=True, dropped=True)
                pending.done.set()
                return pending
            old = self.__dict__.get("_next_pending")
            if old is not None and _same(old.offer, offer):
                old.joined = old.joined or joined
                return old
            taken = self.__dict__.get("_taken_offer")
            if old is None and not joined and taken is not None and _same(taken, offer):
                return _Pending(offer, dropped=True)  # the training thread holds its group already: nothing to do
            pending = self.__dict__["_next_pending"] = _Pending(offer, joined=joined)
            retired = None if old is None else _detach(old)
            if self.backend == "gloo":
                # Started and listed under the lock: the exit hook, which closes under it, then waits for it
                # (listed after the lock, it could miss one that then ran in torch as the interpreter finalized).
                former = threading.Thread(target=self._form_next, args=(pending,), name=f"form-plan-{offer.plan}",
                                          daemon=True)
                self._formations = [t for t in self._formations if t.is_alive()] + [former]  # joined at exit
                former.start()
        if old is not None:
            self._retired(old, *retired, why)
        if self.backend != "gloo":
            pending.failed = True
            pending.done.set()
            self._report_next(pending, False, f"the {self.backend} backend forms no group in the background")
        return pending

    def _form_next(self, pending: _Pending) -> None:
        offer = pending.offer
        info = RoundInfo(**vars(offer.ranks), round=offer.round, needs_sync=True, update_gen=0,
                         peers_in_store=offer.peers_in_store)
        started = time.monotonic()
        group = None
        try:
            host, _, port = self.settings.store_address.rpartition(":")
            client = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=self.collective_timeout_s))
            with self._next_lock():
                if pending.dropped:
                    return
                pending.store = store = self._round_store(info, f"-p{offer.plan}", client)
            before = socket_inodes()
            pg = self._new_group(store, info)
            group = RoundGroup(pg, store, GroupSockets(before, socket_inodes(), self._control_peers,
                                                      self._member_addresses(store)), self.backend, self.device,
                               _size_of(pg))
            del pg
            with self._next_lock():  # the check's connections, for _close_next to cut (see there)
                if self.__dict__.get("_next_closed"):
                    raise CollectiveError("the worker leaves or exits")
                checking = self.__dict__.setdefault("_checking", {})
                checking[id(pending)] = group.sockets
            try:
                flag = torch.zeros(1)
                group.pg.allreduce([flag]).wait(timedelta(seconds=self._form_limit_s()))
            finally:
                with self._next_lock():
                    checking.pop(id(pending), None)
        except Exception as exc:  # reported to the driver, which drops the plan; text only (see groups._formed)
            reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            with self._next_lock():
                pending.failed = True
                dropped = pending.dropped or bool(self.__dict__.get("_next_closed"))
            pending.done.set()
            if group is not None:
                # Released, never retired: its connections are what this process opened while it formed, and those of
                # a round formed meanwhile on the training thread are among them; shut down, that round failed at its
                # next collective (review s59 rvP finding 2). Sparing the round's own connections (4ed0c9b) was not
                # enough: a clean-clone run under load still cut it. If its check still waits on a peer, the group is
                # destroyed on the reaper's thread once Gloo's timeout ends that wait; the peer's check has its own
                # deadline. At exit the reaper shuts its connections down (cut_at_exit): every round is let go of
                # then, and the exit would otherwise wait out Gloo's timeout or finalize under it (review s60 rvR).
                self._reaper.release(group, cut_at_exit=True)
            if not dropped:
                log.warning("worker %s: could not form round %d's group in the background (plan %d): %s",
                            self.worker_id, offer.round, offer.plan, reason)
                self._report_next(pending, False, reason)
            return
        with self._next_lock():
            keep = not pending.dropped
            if keep:
                pending.group = group
            report = keep and not pending.joined
            pending.reported = pending.reported or report
        pending.done.set()
        if not keep:
            # Formed and checked, never used: released, not retired. Its connections are what this process opened
            # while it formed, and a round formed meanwhile on the training thread (the plan was dropped) opened its
            # own then: shut down with it, that round failed at once (see groups._formed).
            self._reaper.release(group)
            return
        log.info("worker %s: formed round %d's group in the background (plan %d, rank %d of %d) in %.0f ms",
                 self.worker_id, offer.round, offer.plan, offer.ranks.rank, offer.ranks.size,
                 1000 * (time.monotonic() - started))
        if report:
            self._report_next(pending, True)

    def _report_next(self, pending: _Pending, formed: bool, reason: str = "") -> None:
        if self._codec is None:
            return
        try:
            DriverClient(self.settings.driver_address, self._codec, self.worker_id).call(
                "next_round", NextRoundReport(pending.offer.plan, formed, reason).to_wire(),
                timeout_s=self.heartbeat_timeout_s)
        except Exception as exc:  # the plan then times out on the driver, which admits as usual
            log.warning("worker %s: could not report plan %d to the driver: %s", self.worker_id, pending.offer.plan, exc)

    # ---------------------------------------------------------- any thread
    def _close_next(self, why: str) -> None:
        """The worker leaves or exits: retire the plan it holds, and start no formation from now on.

        A plan's check still running (its allreduce waits on a peer until the formation deadline, 60 s by default)
        is ended at once: its connections are shut down. The caller lets go of its current round right after, so
        a connection of that round among them is cut no sooner than it would be anyway; left running, the check
        outlasted the exit hook's 10 s (review s60 rvR). A formation that finishes constructing from now on runs
        no check."""
        with self._next_lock():
            self.__dict__["_next_closed"] = True
            checking = list(self.__dict__.get("_checking", {}).values())
        self._drop_next(why)
        for sockets in checking:
            if sockets is not None:
                sockets.shutdown()

    def _drop_next(self, why: str, *, before_round: int | None = None) -> None:
        """Retire the planned group (if any; with ``before_round``, only a plan of a round up to it)."""
        with self._next_lock():
            pending = self.__dict__.get("_next_pending")
            if pending is None or (before_round is not None and pending.offer.round > before_round):
                return
            self.__dict__["_next_pending"] = None
            group, store = _detach(pending)
        self._retired(pending, group, store, why)

    def _retired(self, pending: _Pending, group: RoundGroup | None, store: Any, why: str) -> None:
        """``pending`` is no longer this worker's plan (see :func:`_detach`): its formation ends, its group goes."""
        pending.done.set()
        give_up = getattr(store, "give_up", None)
        if give_up is not None:
            give_up()  # ends a formation still waiting for a peer's key (see groups.RoundStore)
        if group is not None:
            self._reaper.release(group)  # formed and checked, never used: nothing to abandon (see _form_next)
        del group
        log.info("worker %s: dropped the group of planned round %d (plan %d): %s", self.worker_id,
                 pending.offer.round, pending.offer.plan, why)

    # ---------------------------------------------------------- training thread
    def _planned_group(self, info: RoundInfo) -> RoundGroup:
        """The group of the plan ``info`` names, formed in the background: at once for a running member (it
        formed it before the driver asked for the switch); a newcomer, answered at rendezvous as soon as the
        plan was made, forms it now (or waits for the formation its heartbeat started), under the formation
        deadline. CollectiveError when it cannot: the round then fails here, and is given up as any other."""
        ranks = RankInfo(info.rank, info.size, info.local_rank, info.local_size, info.cross_rank, info.cross_size)
        self.__dict__["_planned_at"] = time.monotonic()
        # A member of the round before switches once the driver formed the round; a newcomer joins it earlier.
        self.__dict__["_plan_was_member"] = self.info is not None and self.info.round == info.round - 1
        # The formation its heartbeat started for this plan, if any (else one of its own; another plan's retired).
        pending = self._start_next(NextRound(info.planned, info.round, ranks, info.peers_in_store), joined=True,
                                   why="its round formed from another plan")
        deadline = time.monotonic() + self._form_limit_s()
        with self.progress.waiting():
            while not pending.done.wait(0.05):
                if self._aborted(info.round) or time.monotonic() > deadline:
                    self._drop_next("the planned round was given up while its group formed")
                    raise CollectiveError(f"the process group of planned round {info.round} did not form")
        with self._next_lock():
            group, pending.group = pending.group, None
            if self.__dict__.get("_next_pending") is pending:
                self.__dict__["_next_pending"] = None
            if group is not None:
                self.__dict__["_taken_offer"] = pending.offer  # an offer of it the heartbeat brings now is stale
            if group is not None and not pending.reported:
                pending.reported = True
                self.__dict__["_report_deferred"] = pending
        if group is None:
            raise CollectiveError(f"could not form the process group of planned round {info.round} (plan "
                                  f"{info.planned})")
        log.info("worker %s: round %d uses the group formed in the background (plan %d)", self.worker_id,
                 info.round, info.planned)
        return group

    def _forget_plans(self) -> None:
        """A restarted driver adopted this worker: forget every plan number of the dead driver. Each driver numbers
        its plans from 1, so an old number compared with the new driver's plans meant another plan: the round
        formed from the old plan P passed for plan P given up (the new driver reports none), which aborted the
        adopted round at once, and the new driver's own plan P passed for the one already joined, which left its
        newcomer waiting for a group nobody formed. The adopted round goes on as a round formed at rendezvous
        (the new driver's record of it names no plan either); its group stays. (Forgetting here, not numbering
        the new driver's plans above the old ones, keeps the rule on the side that holds the old numbers.)"""
        with self._next_lock():
            for key in ("_gone_plan", "_planned_at", "_taken_offer", "_plan_was_member", "_report_deferred"):
                self.__dict__.pop(key, None)
            info = self.info
            if info is not None and info.planned:
                self.info = replace(info, planned=0)

    def _joined_unformed_plan(self) -> bool:
        """A newcomer in a planned round the driver has not formed yet, as far as it knows: a restarted driver,
        which knows no plan, must take it for a newcomer (see ``link.driver_link._reregister``)."""
        info = self.info
        return (info is not None and info.planned != 0 and not self.__dict__.get("_plan_was_member")
                and self._seen_round < info.round)

    def _first_collective_of_plan(self) -> None:
        """A newcomer reports its planned round's group formed at its first collective there (its state sync):
        its script has set up by then, and the running members, who switch once every member has reported,
        do not wait for that."""
        pending = self.__dict__.pop("_report_deferred", None)
        if pending is not None:
            self._report_next(pending, True)


def _same(a: NextRound, b: NextRound) -> bool:
    """Whether two offers are the same plan of this worker (the same group to form)."""
    return (a.plan, a.round, a.ranks) == (b.plan, b.round, b.ranks)


def _detach(pending: _Pending) -> tuple[RoundGroup | None, Any]:
    """Mark ``pending`` dropped and take its group and store (under the plan lock)."""
    pending.dropped = True
    group, pending.group = pending.group, None
    return group, pending.store
