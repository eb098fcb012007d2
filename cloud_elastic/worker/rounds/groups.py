"""One round's process group: formed under a deadline, abandoned at once, let go off the training thread.

A :class:`RoundGroup` holds what must live exactly as long as the group:

* the torch process group;
* the round's store: ``ProcessGroupNCCL`` may call it after the formation, and a
  Python ``dist.Store`` subclass (``SignedStore``) with no Python reference left
  fails inside torch then (``fn INTERNAL ASSERT FAILED ... Not implemented``);
* the group's peer connections (Gloo), found when it formed (see ``reclaim``).

:meth:`RoundGroup.abandon` is called the moment a collective of the round fails
or the driver aborts the round: the round is over for this worker, so every
collective still pending in it is failed now (Gloo: its peer connections are
shut down; NCCL: its communicator is aborted). Waiting for the next round to
do it would leave a window in which the group's last reference could be dropped
on the training thread (a traceback kept alive by the failure, a frame
returning) while a collective was still blocked on a live peer: Gloo's
destructor then joins that collective's thread for up to Gloo's timeout (300 s)
while heartbeats go on, and the round hangs. An abandoned group's destructor
returns at once.

:class:`RoundGroupsMixin` is the worker context's side of it: a round's group
is formed on a side thread under a deadline (``CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S``,
at most the collective timeout), so an aborted round is abandoned instead of
waited out; an abandoned formation leaves the store client to a constructor that
may still block in it, so the next round forms on a new one. Every collective
is waited for in 50 ms slices, and fails (``CollectiveError``) the moment the
driver aborts its round; a collective started after the abort fails at once.
The previous round's group is let go off the training thread. :class:`RoundInfo`
is this worker's place in the current round.

NCCL (:func:`new_nccl_group`, made in :mod:`~cloud_elastic.worker.rounds.backends`) is created
non-blocking and connected eagerly (``eager_connect_single_device``, as torch does with ``device_id``), so the
communicator forms inside the formation deadline and can be abandoned with
``abort()`` like a Gloo group (see docs/architecture/gpus.md).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, NoReturn

import torch
import torch.distributed as dist

from cloud_elastic.protocol import RankInfo
from cloud_elastic.worker.exceptions import CollectiveError
# The group makers are re-exported here too: the worker context and the tests import them from this module.
from cloud_elastic.worker.rounds.backends import (abort_nccl, nccl_error_handling_default,
                                                  nccl_nonblocking_timeout_default, new_gloo_group, new_nccl_group,
                                                  quiesce_device)
from cloud_elastic.worker.rounds.flight import FlightRecorder
from cloud_elastic.worker.rounds.on_device import OnDeviceMixin
from cloud_elastic.worker.rounds.peers import Peers, own_addresses
from cloud_elastic.worker.rounds.reclaim import GroupSockets, Reaper, socket_inodes
from cloud_elastic.worker.rounds.signed_store import SignedStore, round_namespace

__all__ = [
    "RoundInfo", "RoundGroup", "RoundStore", "RoundGroupsMixin", "new_gloo_group", "new_nccl_group",
    "nccl_error_handling_default",
    "nccl_nonblocking_timeout_default",
    "quiesce_device",
]

#: How often a wait for a collective or a group's formation looks whether the driver aborted the round.
_ABORT_SLICE_S = 0.05

#: How long the training thread waits for the heartbeat thread's abort of an NCCL communicator to return.
_ABORT_JOIN_S = 30.0

#: How much longer than the formation deadline Gloo's constructor may wait for a peer: the deadline,
#: which names its setting, is what a user sees.
_GLOO_FORM_MARGIN_S = 5.0

#: How many times Gloo tries a connection to a peer that does not answer, each time for the group's
#: timeout (measured on torch 2.13: 52 s for a 10 s timeout). The constructor's timeout is a share of the
#: formation's time, so that a peer which vanished holds an abandoned formation about that long in all.
_GLOO_CONNECT_ATTEMPTS = 5


class RoundGroup:
    """A round's process group and what lives and dies with it (see module docstring)."""

    def __init__(self, pg: Any, store: Any, sockets: GroupSockets | None, backend: str,
                 device: torch.device | None = None, size: int | None = None) -> None:
        self.pg = pg
        #: Members of the group, when known: a group of one has no peer connections to shut down, and none to
        #: wait for either, so it is destroyed like any other (see ``Reaper.retire``).
        self.size = size
        #: Referenced for as long as the group: torch calls back into it (NCCL connects lazily).
        self.store = store
        self.sockets = sockets
        self.backend = backend
        self.device = device
        self.abandoned = False
        #: The round it is the group of (set as it becomes the current group); the heartbeat thread reads it.
        self.round: int | None = None
        #: NCCL: the device finished what was queued on it after the abort (see ``_abandon_round``).
        self.quiesced = False
        #: Collectives launched on it (each reads the context's ``pg``), and how many of them a wait on the host
        #: saw finish whole: what a confirmation after an abort can still vouch for (``on_device``).
        self.queued = self.whole = 0
        #: Set once the heartbeat thread's abort of it (``on_device.abort_lost_round``) has returned; None if none began.
        self.abort_done: threading.Event | None = None
        #: Let go of by the worker (exit, leave): no abort of the heartbeat thread starts any more.
        self.closing = False
        #: Sharded training (``worker/sharded.py``): this round's group over the same local rank of every
        #: host, formed at its first use; it lives and dies with the round's group.
        self.cross: RoundGroup | None = None
        self._lock = threading.Lock()

    def abandon(self) -> bool:
        """Fail every collective still pending in this group; True the first time. Never blocks for long.

        Called when a collective of the round failed or the driver aborted the
        round: nothing will use the group again. Idempotent and thread-safe.
        """
        with self._lock:
            if self.abandoned:
                return False
            self.abandoned = True
        if self.cross is not None:
            self.cross.abandon()
        if self.backend == "nccl":
            abort_nccl(self.pg)
        elif self.sockets is not None:
            self.sockets.shutdown()
        return True

    def abort_in_background(self) -> None:
        """The heartbeat thread's abort (see ``on_device``): :meth:`abandon` on a thread of its own, once."""
        with self._lock:
            if self.abandoned or self.closing or self.abort_done is not None:
                return
            self.abort_done = done = threading.Event()

        def run() -> None:
            try:
                self.abandon()
            finally:
                done.set()

        try:
            threading.Thread(target=run, name="cloud-elastic-nccl-abort", daemon=True).start()
        except RuntimeError:  # no thread to be had (the interpreter exiting): the training thread's next wait aborts it
            done.set()

    def settle_abort(self, timeout_s: float) -> None:
        """No abort of the heartbeat thread starts from now on; wait (``timeout_s`` at most) for one that began:
        it runs in torch's C++, which the interpreter must not finalize under."""
        with self._lock:
            self.closing = True
            done = self.abort_done
        if done is not None:
            done.wait(max(0.0, timeout_s))


_STORE_ERROR = getattr(dist, "DistStoreError", RuntimeError)


class RoundStore(SignedStore):
    """A round's store: a wait for a peer's key can be given up when the round's formation is.

    A peer that dies or stops before it writes its address leaves the group's
    constructor waiting in the store (torch's ``wait`` and ``get`` block) until
    the collective timeout, 300 s by default; an abandoned formation kept its
    thread, the group's device (a thread, a listening socket, an epoll
    descriptor) and the store client that long. Here every wait looks for its
    keys (``check``) in slices of 1 to 20 ms, and fails at once after
    :meth:`give_up`, so that thread ends, and what the constructor opened closes,
    a slice after the formation is abandoned. A wait for keys already there
    costs one look. Every wait is bounded by ``timeout_s`` (the formation's
    deadline and a margin), whatever timeout the caller passes.

    Each value carries its writer's rank and addresses (``peers``: this member's, and what it learned of the others).
    """

    MAX_SLICE_S = 0.02

    def __init__(self, inner: Any, namespace: str, secret: str, timeout_s: float, peers: Peers | None = None) -> None:
        super().__init__(inner, namespace, secret)
        self._timeout_s = timeout_s
        self._given_up = threading.Event()
        self.peers = Peers() if peers is None else peers

    def give_up(self) -> None:
        """Fail every wait for keys, now and later (the formation that uses this store was abandoned)."""
        self._given_up.set()

    def _await(self, keys: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while not self._store.check(keys):
            if self._given_up.is_set():
                raise _STORE_ERROR(f"the round's formation was given up while waiting for keys {keys}")
            if time.monotonic() >= deadline:
                raise _STORE_ERROR(f"timed out after {timeout_s:g}s waiting for keys {keys}")
            self._given_up.wait(pause)
            pause = min(2 * pause, self.MAX_SLICE_S)

    def set(self, key: str, value: Any) -> None:
        super().set(key, self.peers.wrap(value.encode() if isinstance(value, str) else bytes(value)))

    def get(self, key: str) -> bytes:
        self._await([key], self._timeout_s)
        try:
            return self.peers.unwrap(super().get(key))
        except ValueError as exc:  # signed, so written with the job secret: a bug, named with its key
            raise _STORE_ERROR(f"rendezvous store key {key!r}: {exc}") from None

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        # The formation's time, not the caller's: Gloo passes its connection timeout, a share of it.
        self._await(keys, self._timeout_s)


@dataclass(frozen=True)
class RoundInfo(RankInfo):
    """This worker's place in the current rendezvous round: its ranks, plus the round's facts."""

    round: int
    needs_sync: bool
    update_gen: int
    from_checkpoint: bool = False
    #: The plan whose group, formed in the background, this round uses (0: formed when the round forms).
    planned: int = 0
    #: Every member reads its peers' addresses in the round's store: this one writes its own there (see ``peers``).
    peers_in_store: bool = False


class RoundGroupsMixin(OnDeviceMixin):
    """The worker context's process group per round, and its collectives' waits (see module docstring)."""

    @property
    def pg(self) -> Any:
        """The current round's process group (None before the first round and after leaving)."""
        group = self._group
        if group is None:
            return None
        group.queued += 1  # every collective is launched on what this returns (see on_device)
        return group.pg

    @pg.setter
    def pg(self, value: Any) -> None:
        """Put a wrapper in front of the current round's group (tests count the bytes a step sends)."""
        if self._group is None:
            raise ValueError("no round's group to wrap")
        self._group.pg = value

    @property
    def flight(self) -> FlightRecorder:
        """This worker's record of its last collectives (see ``flight``); its newest entry rides on heartbeats."""
        recorder = self.__dict__.get("_flight")
        if recorder is None:
            recorder = self.__dict__["_flight"] = FlightRecorder()
        return recorder

    # --------------------------------------------------------- process groups
    def _form_group(self, info: RoundInfo) -> None:
        self._carried_update = None
        if self.backend == "nccl":
            self.device = torch.device("cuda", info.local_rank)
            torch.cuda.set_device(self.device)
        if info.planned:  # formed in the background while the previous round trained (see next_group)
            group = self._planned_group(info)
        else:
            store = self._round_store(info, "")
            # confirm: wait for every member's side (outside elastic.run no sync follows, and one exiting cut the rest)
            group = self._formed(info, store, lambda publish: self._new_group(store, info, publish), "process group",
                                 confirm=not getattr(self, "elastic_entered", True))
        group.round = info.round  # first: the heartbeat thread may abort the current group (abort_lost_round)
        old, self._group = self._group, group
        self.previous_size = 0 if self.info is None else self.info.size
        self.info = info
        self.flight.new_round(info.round)
        self._round_steps0 = self.progress.steps  # its first step may compile: see link.pauses
        self.progress.mark()
        self.progress.new_round()  # compute times are of this round's steps
        if old is not None:
            self._retire(old)
        del old  # the reaper drops the last reference, on its own thread (see Reaper.retire)

    def _round_store(self, info: RoundInfo, suffix: str, client: Any = None) -> Any:
        """The store of a group of round ``info.round`` (``suffix`` names a second group of the round), on the
        context's store client unless ``client`` is given; ``info``: this member's place in that group."""
        if self.standalone:
            return dist.HashStore()
        namespace = round_namespace(self.settings.secret, self.job_id, info.round) + suffix
        return RoundStore(self._store if client is None else client, namespace, self.settings.secret,
                          self._form_limit_s() + _GLOO_FORM_MARGIN_S,
                          Peers(info.rank if info.peers_in_store else None, info.size,
                                own_addresses(self.hostname, self.interface)))

    def _formed(self, info: RoundInfo, store: Any, make: Callable[[Callable[[Any], None]], Any],
                what: str, *, confirm: bool = False) -> RoundGroup:
        """Form round ``info.round``'s group (``make(publish)``) on a side thread under the formation deadline."""
        limit_s = self._form_limit_s()
        done = threading.Event()
        lock = threading.Lock()
        result: dict[str, Any] = {}

        def publish(pg: Any) -> None:  # an NCCL group being connected: abortable from now on
            with lock:
                result["forming"] = pg

        def create() -> None:
            before = socket_inodes()
            try:
                pg = make(publish)
            except Exception as exc:  # as text only: its traceback holds the constructor's frames (the device's
                # thread and sockets), which reach ``result``: a cycle kept an abandoned formation's device open.
                result["error"] = str(exc)
                done.set()
                return
            sockets = GroupSockets(before, socket_inodes(), self._control_peers, self._member_addresses(store))
            group = RoundGroup(pg, store, sockets, self.backend, self.device, _size_of(pg))
            try:  # through the store, not the group: only members with ``confirm`` wait, whatever the others do
                store.set(f"formed/{info.rank}", b"1")
                if confirm:
                    store.wait([f"formed/{rank}" for rank in range(info.size)], timedelta(seconds=limit_s))
            except Exception as exc:  # as a failed formation (text only: see above); the group goes
                result["error"], result["abandoned"] = str(exc), True
            with lock:
                if result.get("abandoned"):  # the round was given up while this group formed: nobody will use it
                    self._let_go_unused(group)
                else:
                    result["group"] = group
            done.set()

        # Forming blocks in C++ until every peer arrives: on a side thread, so an aborted round is abandoned, not
        # waited out. A group that never forms while its members heartbeat is given up at a deadline far below
        # Gloo's own timeout: this worker then rejoins with a failure, which aborts the round for its peers too.
        former = threading.Thread(target=create, name=f"form-round-{info.round}", daemon=True)
        self._formations = [t for t in getattr(self, "_formations", ()) if t.is_alive()] + [former]  # joined at exit
        former.start()
        deadline = time.monotonic() + limit_s
        with self.progress.waiting():
            while not done.wait(_ABORT_SLICE_S):
                aborted = self._aborted(info.round)
                if aborted or time.monotonic() > deadline:
                    with lock:
                        result["abandoned"] = True
                        forming = result.pop("forming", None)
                    if forming is not None and "group" not in result:
                        abort_nccl(forming)  # ends its eager connect on the formation thread
                    if getattr(store, "give_up", None) is not None:
                        store.give_up()  # ends a wait of the constructor for a peer's key: see RoundStore
                    if "group" in result:  # formed in the very last slice (never used, as above)
                        self._let_go_unused(result.pop("group"))
                    # The abandoned constructor may still block in a store wait, and a TCPStore client runs
                    # one operation at a time: the next round's formation would wait behind it. It gets its own.
                    self._store_stale = True
                    # The peers still unanswered now are the driver's evidence of a partition (driver.job.partitions).
                    peers = getattr(store, "peers", None)
                    self.unreachable = () if aborted or peers is None else peers.unreached()
                    if aborted:
                        raise CollectiveError(f"round {info.round} was aborted while forming its {what}")
                    raise CollectiveError(f"the {what} of round {info.round} did not form within "
                                          f"{limit_s:g} s (CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S); giving the round up")
        if "error" in result:
            # The store client may be what failed (its server restarted on the same port with a restarted driver:
            # "Broken pipe"), and nothing else renews it: every later round failed the same way (review s59 rvP).
            # A new client for the next round costs a connection.
            self._store_stale = True
            reason = str(result.pop("error")).splitlines()[0][:300]
            raise CollectiveError(f"could not form the {what} of round {info.round}: {reason}")
        return result.pop("group")

    def _let_go_unused(self, group: RoundGroup) -> None:
        """A group formed after its round was given up: no collective ever ran in it.

        Gloo's is released, not retired: its connections are what this process opened while it formed, and
        those of a round formed meanwhile are among them; shut down, they failed that round too. NCCL's is
        retired (aborted) as any other: its connections are not the process's sockets, and its ``shutdown()``
        (torch >= 2.5: ``ncclCommFinalize``, then a wait for the communicator to be quiescent, bounded only by
        the group's timeout) would wait on peers that gave the round up.
        """
        if group.backend == "nccl":
            self._reaper.retire(group)
        else:
            self._reaper.release(group)

    def _form_limit_s(self) -> float:
        """How long a group may take to form before the round is given up (the formation deadline)."""
        return min(self.settings.group_form_timeout_s, self.collective_timeout_s)

    def _retire(self, group: RoundGroup) -> None:
        """Let go of the previous round's group without ever blocking on it.

        A group left after a failure was abandoned when its collective failed
        (see ``groups``): its pending work has failed, so destroying it is quick,
        and it is destroyed off this thread. A group left gracefully has no
        pending work; its destructor still joins Gloo's threads (20-30 ms of the
        training thread's time at every scale-up), so it is released on a
        short-lived thread.
        """
        if group.abandoned or self._last_reason == "failure":
            self._reaper.retire(group)
        else:
            self._reaper.release(group)

    def _member_addresses(self, store: Any) -> set[str] | None:
        """The IP addresses of the members of the group formed on ``store`` (see ``peers``), or None when they
        cannot all be known (with ``--network-interface``, whose addresses are not the hosts' names'; a member
        that wrote none): every connection the formation opened counts then."""
        peers = getattr(store, "peers", None)
        return None if self.interface or peers is None else peers.addresses()

    def _new_group(self, store: Any, info: RoundInfo, published: Callable[[Any], None] = lambda pg: None) -> Any:
        timeout = timedelta(seconds=self.collective_timeout_s)
        if self.backend == "nccl":
            return new_nccl_group(store, info.rank, info.size, timeout, self.device, published)
        if self.backend != "gloo":
            raise RuntimeError(f"unsupported backend {self.backend!r} (use gloo or nccl)")
        return new_gloo_group(store, info.rank, info.size, timeout, hostname=self.hostname, interface=self.interface,
                              form_timeout=timedelta(seconds=(self._form_limit_s() + _GLOO_FORM_MARGIN_S)
                                                     / _GLOO_CONNECT_ATTEMPTS))

    def _abandon_round(self) -> None:
        """A collective of the current round failed or was abandoned: fail the rest of its work now.

        After an NCCL abort the device must finish what was queued on it before
        the state is restored from it; a device that does not is wedged, and
        this worker exits rather than train on from a state it cannot trust.
        """
        group = self._group
        if group is None:
            return
        group.abandon()  # False when the heartbeat thread aborted it first: the device is still to be waited for
        if group.backend != "nccl" or group.quiesced:
            return
        group.quiesced = True
        if group.abort_done is not None:
            group.abort_done.wait(_ABORT_JOIN_S)  # the heartbeat thread's abort() first: the queue drains after it
        if not quiesce_device(group.device):
            print(f"cloud-elastic: worker {self.worker_id}: the GPU did not become idle after aborting the NCCL "
                  "communicator of a failed round; exiting", file=sys.stderr, flush=True)
            os._exit(70)

    # ------------------------------------------------------------ collectives
    def group(self, what: str) -> Any:
        """The round's process group, to start a collective on; CollectiveError once the round is aborted.

        A collective started after the driver aborted the round could only fail,
        and sending into a group whose peers have moved on can meet their next
        collective instead (Gloo then aborts the process on the size mismatch).
        """
        self.await_current_view()
        if self.info is not None and self._aborted(self.info.round):
            self._abandon_round()
            raise CollectiveError(f"{what} not started: the driver aborted round {self.info.round} (a peer was lost)")
        self._first_collective_of_plan()
        self.window.collective(what)
        return self.pg

    def point_to_point(self, what: str, start: Callable[[Any], Any], *, cross: bool = False) -> Any:
        """``start(group)``'s send or receive on the round's (or cross-host) group. Gloo raises at once when the
        peer's connection is closed (a receiver died): the round's failure, handled as :meth:`wait` handles it."""
        try:
            return start(self.cross_group(what) if cross else self.group(what))
        except RuntimeError as exc:
            self._failed(exc, what)

    def _failed(self, exc: RuntimeError, what: str, slot: int | None = None) -> NoReturn:
        if slot is not None:
            self.flight.completed(slot, ok=False)
        self._abandon_round()
        reason = str(exc).splitlines()[0].split(" This is typically")[0]
        raise CollectiveError(f"{what} failed: {reason}") from exc

    def cross_group(self, what: str) -> Any:
        """Sharded training: the round's group over this local rank of every host (rank = host index),
        formed at its first use in the round; CollectiveError once the round is aborted."""
        self.group(what)
        group = self._group
        assert group is not None and self.info is not None
        if group.cross is None:
            info = self.info
            cross = RoundInfo(info.cross_rank, info.cross_size, 0, 1, info.cross_rank, info.cross_size,
                              round=info.round, needs_sync=info.needs_sync, update_gen=info.update_gen,
                              peers_in_store=info.peers_in_store)
            store = self._round_store(cross, f"-x{info.local_rank}")
            group.cross = self._formed(info, store, lambda publish: self._new_group(store, cross, publish),
                                       "cross-host group")
            if group.abandoned:  # aborted while it formed
                group.cross.abandon()
        return group.cross.pg

    def wait(self, work: Any, what: str, *, host: bool = True) -> None:
        """Wait for ``work``; abandon it when the driver aborts this round.

        Either way out by failure abandons the round's group at once (see
        ``groups``), so nothing of it stays blocked on a peer. A collective that
        completes in a round the driver had already aborted when the wait began
        fails too: the driver may abort a round whose members are all alive (one
        returned early, an adopted round it cannot use), and they must roll back
        and rendezvous, not train on with the gradient allreduce (started on the
        group directly) never asking whether the round still counts. An abort that
        arrives during the wait is left to the next collective: this one's result
        is whole, and the step it completes may still be committed.

        NCCL's futures complete as the work is queued, not done. With ``host``
        (the result is read on the host next: a membership check, the sync's
        facts, a user's ``hvd.allreduce``) the host waits until the GPU has
        finished it (``_await_on_device``); without (the gradients, the sync's
        transfers), the wait is the GPU's alone, and what depends on it is
        confirmed where it must be (:meth:`confirm_on_device`).
        """
        assert self.info is not None
        round_ = self.info.round
        self.await_current_view()
        aborted_before = self._aborted(round_)
        nccl = self._nccl_group() if host else None
        if nccl is not None:
            slot = self.flight.entered(what)
            self._await_on_device(work, what, round_, slot, nccl)
            fut, waited = None, False
        else:
            fut, waited = _future(work, self.collective_timeout_s)
            # Point-to-point work (no future: a thread waits for it) is not numbered: not every rank takes part.
            slot = -1 if waited else self.flight.entered(what)
        if fut is not None and not fut.done():
            event = threading.Event()
            fut.add_done_callback(lambda _f: event.set())
            with self.progress.waiting():
                while not event.wait(_ABORT_SLICE_S):
                    if self._aborted(round_):
                        self.flight.completed(slot, ok=False)
                        self._abandon_round()
                        raise CollectiveError(f"{what} abandoned: the driver aborted round {round_} (a peer was lost)")
        try:
            fut.wait() if waited else work.wait()  # NCCL: what is on the current stream next waits for it
        except RuntimeError as exc:
            self._failed(exc, what, slot)
        self.flight.completed(slot)
        if aborted_before:
            self._abandon_round()
            raise CollectiveError(f"{what} completed, but the driver aborted round {round_} before it was waited for")
        self.progress.mark()

    def _aborted(self, round_: int) -> bool:
        return self.dismissed or self._seen_abort >= round_ or self._plan_given_up(round_)

    def _plan_given_up(self, round_: int) -> bool:
        """A planned round the driver dropped (see ``next_group``); none without a driver."""
        return False

    def _first_collective_of_plan(self) -> None:
        """A newcomer's report that its planned round's group formed, deferred to here (see ``next_group``)."""

    def await_current_view(self) -> None:
        """Overridden by the driver link (see ``link``): a group on its own has no driver to ask."""



def _size_of(pg: Any) -> int | None:
    """A process group's size, or None when it cannot tell."""
    try:
        return int(pg.size())
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None


def _future(work: Any, timeout_s: float) -> tuple[Any, bool]:
    """``work``'s future, and whether it already waited for the work: Gloo's point-to-point ``send`` and
    ``recv`` have none, so a thread of their own waits for them (and, after an abort, until Gloo's timeout).
    They wait ``timeout_s`` at most: left to Gloo, they would wait its context's timeout, which is the
    formation's (see ``new_gloo_group``)."""
    try:
        return work.get_future(), False
    except RuntimeError:
        fut = torch.futures.Future()

        def wait() -> None:
            try:
                work.wait(timedelta(seconds=timeout_s))
                fut.set_result(None)
            except BaseException as exc:  # noqa: BLE001 (handed to the waiter)
                fut.set_exception(exc)

        threading.Thread(target=wait, name="cloud-elastic-p2p-wait", daemon=True).start()
        return fut, True
