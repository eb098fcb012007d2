"""The worker's connection to its job: rendezvous, process groups, heartbeats.

One :class:`WorkerContext` per worker process, created by ``init()``. It

* registers with the driver and keeps a heartbeat thread long-polling it
  (see ``link.driver_link``); the replies carry the current round, the update generation
  (a graceful membership change is pending) and the highest aborted round;
* joins its first round in ``init()``, or, registering while the job already trains,
  at its first call that needs the round (:meth:`WorkerContext.join_if_pending`), so the
  script's set-up after ``init()`` never stops the running workers;
* forms a fresh ``torch.distributed`` process group per rendezvous round on
  the round's signed namespace of the driver's TCPStore (see ``rounds.signed_store``: keys
  named with HMAC of the job secret, values tagged and checked), Gloo on
  CPU, NCCL with CUDA (``CLOUD_ELASTIC_BACKEND`` overrides; see ``rounds.groups``);
* reclaims the threads and sockets of a group abandoned after a failure
  (see ``rounds.reclaim``) without ever blocking on it;
* waits for every collective in bounded slices, so a round the driver aborted
  is abandoned within ~0.1 s even when a peer is stopped or partitioned and
  Gloo would otherwise wait for its own timeout;
* decides *collectively* whether a pending update interrupts at this commit:
  the flag rides on the gradient allreduce when ``DistributedOptimizer`` ran
  one since the last commit, else it costs one 1-element allreduce;
* holds this worker's :class:`CommitLedger` (``worker.ledger``) and reports it
  to the driver at every rendezvous and heartbeat.

Its settings are read from the environment once (:class:`WorkerSettings`).
Without ``CLOUD_ELASTIC_DRIVER`` in the environment (a script run directly
with ``python``), the context runs standalone: one process, rank 0 of 1.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cloud_elastic.control import Codec
from cloud_elastic.protocol import (
    Assignment,
    CompletedReport,
    CompletionReply,
    ExitOrder,
    ReRegister,
    RendezvousRequest,
    parse_rendezvous_reply,
)
from cloud_elastic.worker import joining, memory, selftest, termination
from cloud_elastic.worker.link.client import DriverClient
from cloud_elastic.worker.exceptions import CollectiveError, WorkerRemoved
from cloud_elastic.worker.interface import exit_if_missing
from cloud_elastic.worker.exiting import ExitingMixin
from cloud_elastic.worker.rounds.groups import (
    RoundGroup,
    RoundGroupsMixin,
    RoundInfo,
    nccl_error_handling_default,
    nccl_nonblocking_timeout_default,
)
from cloud_elastic.worker.ledger import CommitLedger, CommitWindow
from cloud_elastic.worker.link.driver_link import DriverLinkMixin, _survive_output_loss
from cloud_elastic.worker.link.progress import Progress
from cloud_elastic.worker.rounds.next_group import NextGroupMixin
from cloud_elastic.worker.rounds.peers import own_addresses
from cloud_elastic.worker.rounds.reclaim import Reaper
from cloud_elastic.worker.settings import SECRET_ENV, WorkerSettings
from cloud_elastic.worker.steps import count_steps

__all__ = ["RoundInfo", "WorkerContext", "current", "get_context", "init", "is_initialized",
           "slot_before_joining"]

log = logging.getLogger(__name__)


class WorkerContext(NextGroupMixin, DriverLinkMixin, RoundGroupsMixin, ExitingMixin):
    """See module docstring. Constructing it does no I/O; ``start()`` connects.

    Its parts: :mod:`.link.driver_link` (heartbeats and every call to the driver),
    :mod:`.rounds.groups` (the process group per round, abortable waits), :mod:`.exiting`
    (leaving the job, the exit hook) and ``ledger`` (:class:`CommitLedger`: this worker's
    record of its commits, written by ``worker.commit`` and ``worker.optim``); the rest is
    here: start-up, rendezvous, completion, the membership flag each commit agrees on.

    ``settings`` default to :meth:`WorkerSettings.from_environ`, read here once.
    """

    def __init__(self, settings: WorkerSettings | None = None) -> None:
        self.settings = settings if settings is not None else WorkerSettings.from_environ()
        s = self.settings
        self.standalone = s.standalone
        self.worker_id = s.worker_id
        self.job_id = s.job_id
        self.hostname = s.hostname
        self.interface = s.network_interface
        self.heartbeat_timeout_s = s.heartbeat_timeout_s
        self.collective_timeout_s = s.collective_timeout_s
        self.backend = s.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.info: RoundInfo | None = None
        #: The round's follow window (``commit.follow.Window``), and the last round whose window ended unequal.
        self.following: Any = None
        self.follow_ended_round: int | None = None
        #: The size of this worker's round before the current one (0 before its second): whether the current one
        #: grew, or took a spare in a lost or leaving member's place (``commit.follow``).
        self.previous_size = 0
        self._group: RoundGroup | None = None
        #: Sharded training: the host's own process group, formed by ``hvd.shard`` (see ``sharded``).
        self.host_group: Any = None
        #: The commit a sharded checkpoint load gave this worker (``durable.sharded``): no authority over the layout.
        self.loaded_commit: int | None = None
        self._reaper = Reaper()
        #: What the driver's no-progress watch sees of this worker (see ``progress``).
        self.progress = Progress()
        self._stacks_sent = 0
        self._last_reason = "start"
        self._store: Any = None
        self._client: DriverClient | None = None
        self._codec: Codec | None = None
        self._seen_round = 0
        self._attempted_round = 0
        self._seen_update = 0
        self._seen_abort = 0
        #: When the newest heartbeat the driver has answered was sent (monotonic; see ``link.await_current_view``).
        self.view_as_of = time.monotonic()
        #: The driver answered that it no longer counts this worker: every round is over for it.
        self.dismissed = False
        #: Why the driver sends this worker away (``PollReply.leave``), once a heartbeat said so; else None.
        self.sent_away: str | None = None
        #: The seconds an exit order gave this worker to checkpoint the last copy of the state (``ExitOrder``).
        self.checkpoint_before_leaving: float | None = None
        self.checkpoint_writer = False  # the one worker that writes a replica's checkpoint before leaving
        self._carried_update: torch.Tensor | float | None = None
        self._shutdown = threading.Event()
        self._heartbeat: threading.Thread | None = None
        #: Threads forming a round's group (they block in torch until the group forms or times out).
        self._formations: list[threading.Thread] = []
        self.device = torch.device("cpu")
        #: This worker's record of its commits, reported at every rendezvous and heartbeat.
        self.ledger = CommitLedger(s.commit_mode, self.progress, self.worker_id)
        self._notice_watcher: Any = None
        #: (address, port) of the driver's control plane and store: never one of a group's peers.
        self._control_peers: set[tuple[str, int]] = set()
        #: How long this worker keeps training without reaching its driver (``--driver-grace``).
        self.driver_grace_s = s.driver_grace_s
        #: True while the driver cannot be reached (rank 0 then checkpoints at every commit it can).
        self.driver_lost = False
        #: Called (on the heartbeat thread) just before the worker exits at the end of the driver grace.
        self.before_grace_exit: list[Any] = []
        self._reporter: DriverClient | None = None
        self._reporter_lock = threading.Lock()
        #: Serialises re-registering with a restarted driver (heartbeat thread and main thread may both be told).
        self._adopt_lock = threading.Lock()
        #: The store client lost its server with the old driver: reconnect before the next round forms.
        self._store_stale = False
        #: The addresses the group this worker could not form still tried to reach (see groups, peers).
        self.unreachable: tuple[str, ...] = ()
        #: ``hvd.elastic.run`` was entered in this process. A script that ends without it is a fixed-size script,
        #: and says so at exit (:meth:`_report_script_end`); inside it, each round this worker forms is marked
        #: for its newcomers (``joining``).
        self.elastic_entered = False
        #: Joined a round whose other members are inside ``hvd.elastic.run``: refuses collectives before it (``joining``).
        self.joined_running = False
        self._uncaught: BaseException | None = None  # the exception the script ended with (see _note_uncaught)
        #: Registered while the job was running, not joined yet: it joins at its first call that needs the
        #: round (:meth:`join_if_pending`), so the script's set-up after ``init()`` never stops the job.
        self.join_pending = False
        self._joining: int | None = None  # the thread joining now (see join_if_pending)
        #: ``hvd.shutdown()`` was called: the API refuses until ``init()`` again; heartbeats go on to the exit.
        self.shut_down = False
        self._started_pid = os.getpid()

    # What the heartbeat (``link.driver_link``) reports and each collective (``rounds.groups``) tells, of the ledger.
    @property
    def commits(self) -> int:
        """Commits made by this process (``ledger.commits``)."""
        return self.ledger.commits

    @property
    def commit_seq(self) -> int:
        """``ledger.commit_seq``: the position of the state this worker would restore in the job's commits."""
        return self.ledger.commit_seq

    @property
    def holds_commit(self) -> bool:
        """``ledger.holds_commit``: whether it can restore that commit exactly (not while it follows)."""
        return self.ledger.holds_commit

    @property
    def window(self) -> CommitWindow:
        """``ledger.window``: each collective started is shown to it."""
        return self.ledger.window

    @property
    def leaked_groups(self) -> int:
        """Abandoned process groups whose threads and sockets could not be reclaimed."""
        return self._reaper.leaked

    @property
    def reclaimed_groups(self) -> int:
        """Abandoned process groups whose threads and sockets were reclaimed."""
        return self._reaper.reclaimed

    def group(self, what: str) -> Any:
        if self.joined_running and not self.elastic_entered:
            joining.refuse(what)
        return super().group(what)

    def _form_next(self, pending: Any) -> None:
        if self.elastic_entered:  # a running member: the plan's newcomers will meet its state sync
            joining.mark_round(self, pending.offer.round, pending.offer.plan, own_client=True)
        super()._form_next(pending)

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Register with the driver, start heartbeats and join the first round."""
        # Not a failing group each round (see .interface).
        gloo = self.backend == "gloo" and not self.standalone
        exit_if_missing(self.interface, self.worker_id, self.hostname, gloo)
        memory.keep_freed_memory(self.settings.malloc_tuning)
        atexit.register(self._at_exit)
        self.progress.watch_thread()
        if self.backend == "nccl":
            nccl_error_handling_default()
            nccl_nonblocking_timeout_default(min(self.settings.group_form_timeout_s, self.collective_timeout_s))
            if self.interface:
                os.environ.setdefault("NCCL_SOCKET_IFNAME", self.interface)  # --network-interface reaches NCCL too
        if self.standalone:
            self._form_group(RoundInfo(0, 1, 0, 1, 0, 1, round=1, needs_sync=False, update_gen=0))
            return
        self._codec = Codec(self.settings.secret, self.job_id)
        os.environ.pop(SECRET_ENV, None)  # not inherited by the user's own children
        self._note_uncaught()
        _survive_output_loss()
        _stacks_on_signal()
        self._client = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
        reply = self._call("register")
        if not reply.get("ok"):
            raise WorkerRemoved("the driver does not know this worker")
        self._maybe_watch_notices(reply.get("notice_watcher"))
        # A SIGTERM before the first round is a notice as well: the host drains and this worker leaves uncounted.
        with termination.leave_at_commit_on_sigterm(self):
            self._prepare_to_join()
            # A worker that joins a running job (a newcomer, a spare, a replacement) joins at its first call
            # that needs the round, not here: the running workers would otherwise wait, in the round that
            # admits it, for all of the script's set-up after init() (the model, the data, the device).
            if reply.get("running") is True:
                self.join_pending = True
                return
            self._first_rendezvous()

    def join_if_pending(self) -> None:
        """Join the job's next round now, if this worker registered while the job ran and has not joined yet.

        Called by every call that needs the round (``get_context``: ``hvd.rank()``, ``size()``, a collective,
        ``elastic.run``, ``hvd.shard``), once the script's own set-up has run. Told to leave meanwhile (its host
        drains, the job ends), the worker exits 0 as ``init()`` does. A process forked from this one before it
        joined (a data loader's worker) cannot join for it: ValueError, as before ``init()``.
        """
        if not self.join_pending or self._joining == threading.get_ident():
            return  # (the joining thread's own calls, inside the rendezvous, see no round yet, as inside init())
        with _JOIN_LOCK:  # another thread asking meanwhile waits for the round, then sees it
            if not self.join_pending:
                return
            if os.getpid() != self._started_pid:
                raise ValueError("cloud_elastic.torch has not joined the job in this process (it was forked "
                                 "before its parent joined); call hvd.rank() or hvd.size() before forking")
            self._joining = threading.get_ident()
            try:
                with termination.leave_at_commit_on_sigterm(self):
                    self._first_rendezvous()
                self.joined_running = joining.peers_in_round(self, self.info.round, self.info.planned)
                self.join_pending = False
            except WorkerRemoved as exc:
                print(f"cloud-elastic: leaving the job: {exc}", file=sys.stderr, flush=True)
                sys.exit(0)
            finally:
                self._joining = None

    def _prepare_to_join(self) -> None:
        """Start heartbeats, connect to the store and check the device: all a worker does before rendezvous."""
        # Heartbeats start at once: the driver counts silence from registration on,
        # and connecting to the store can wait for the driver's own torch import.
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="cloud-elastic-heartbeat", daemon=True)
        self._heartbeat.start()
        host, _, port = self.settings.store_address.rpartition(":")
        self._store = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=self.collective_timeout_s))
        self._control_peers = _resolved(self.settings.driver_address) | _resolved(self.settings.store_address)
        _preload_lazy_modules()
        if self.backend == "gloo":
            _warm_up_a_step()
        self._check_device()

    def _first_rendezvous(self) -> None:
        reason = "start"
        while True:
            try:
                self.rendezvous(reason)
                return
            except CollectiveError as exc:
                log.warning("worker %s: %s; rejoining", self.worker_id, exc)
                reason = "failure"

    def _check_device(self) -> None:
        """Before asking to be admitted (the running workers keep training meanwhile): is the device sound?

        A failed self-test is reported to the driver in one line, which blacklists
        the slot, and this worker exits: it never joins a round on a sick device.
        """
        device = selftest.device_for_slot(self.backend, self.settings.slot)
        reason = selftest.check_device(device, self.settings.selftest_timeout_s)
        if reason is None:
            return
        print(f"cloud-elastic: worker {self.worker_id}: {reason}; exiting", file=sys.stderr, flush=True)
        try:
            self._call("unhealthy", {"reason": reason}, timeout_s=self.heartbeat_timeout_s + 5)
        finally:
            os._exit(3)

    def rendezvous(self, reason: str) -> RoundInfo:
        """Leave the current round (if any) and join the next one.

        Raises WorkerRemoved when the driver tells this worker to leave, and
        CollectiveError when the new group cannot be formed (a peer died
        meanwhile); the caller then simply comes back to rendezvous.
        """
        if self.standalone:
            assert self.info is not None
            return self.info
        assert self._client is not None
        if reason == "failure":
            self._abandon_round()  # usually done already, by the collective that failed
        last_round = self._attempted_round
        self._last_reason = reason
        ledger = self.ledger
        request = RendezvousRequest(last_round, reason, ledger.commits, ledger.rolled_back, ledger.commit_seq,
                                    ledger.holds_commit, self.unreachable if reason == "failure" else (),
                                    ledger.trained, own_addresses(self.hostname, self.interface),
                                    takes_facts=True).to_wire()
        self.unreachable = ()
        while True:
            reply = parse_rendezvous_reply(self._call("rendezvous", request, timeout_s=60.0))
            if isinstance(reply, Assignment):
                break
            if isinstance(reply, ExitOrder):
                self.checkpoint_before_leaving, self.checkpoint_writer = reply.checkpoint_s, reply.writer
                raise WorkerRemoved(reply.reason)
            if isinstance(reply, ReRegister):
                try:
                    self._reregister(self._client)
                except OSError as exc:  # the driver went again: the next call rides it out like any other
                    log.warning("worker %s: re-registering failed (%s); retrying", self.worker_id, exc)
        info = RoundInfo(**vars(reply.ranks), round=reply.round, needs_sync=reply.needs_sync, update_gen=reply.update_gen,
                         from_checkpoint=reply.from_checkpoint, planned=reply.planned,
                         peers_in_store=reply.peers_in_store)
        ledger.rolled_back, ledger.told_facts = 0, reply.facts
        if self.backend == "nccl" and info.local_rank != self.settings.slot:
            # The GPU is the slot; a driver that disagrees would move this worker's group off its model.
            log.warning("worker %s: the driver assigned local rank %d to slot %d", self.worker_id, info.local_rank, self.settings.slot)
        self._attempted_round = info.round
        if self._store_stale:
            self._reconnect_store()
        if self.elastic_entered and info.needs_sync:  # (a round with a newcomer always syncs)
            joining.mark_round(self, info.round, info.planned)
        if not info.planned:  # a planned group of this round or an older one will not be used
            self._drop_next(f"round {info.round} formed without it", before_round=info.round)
        self._form_group(info)
        log.info("worker %s: joined round %d as rank %d of %d", self.worker_id, info.round, info.rank, info.size)
        return info

    def report_completed(self, error: str | None = None, *, again: bool = False) -> None:
        """Tell the driver the training function returned on this worker; return once the driver agrees.

        Completion is rank 0's to decide (it holds the state). Another rank's
        report is held until rank 0 returns too, normally milliseconds later.
        If rank 0 is found still training (waiting in a collective this worker
        will never join), the driver says ``leave``: WorkerRemoved is raised, and
        ``elastic.run`` makes the worker exit while its peers go on without it.
        ``error`` tells the driver the final durable checkpoint was not written. ``again``: this worker
        entered ``hvd.elastic.run`` again instead (``done``: train on, the job is elastic again).
        """
        if self._client is None:
            return
        report = CompletedReport(self.info.round if self.info else 0, self.ledger.live_commit_seq, self.progress.steps,
                                 error, again=again).to_wire()
        while True:
            reply = CompletionReply.from_wire(self._call("completed", report, timeout_s=70.0))
            if reply.decision == "done":
                self.progress.mark()
                self.training_done = not again  # a restarted driver is told (see DriverLinkMixin._reregister)
                return
            if reply.decision == "leave":
                self.checkpoint_before_leaving, self.checkpoint_writer = reply.checkpoint_s, reply.writer
                raise WorkerRemoved(reply.reason or "returned from its training function before rank 0")

    def close(self) -> None:
        self._shutdown.set()
        if self._notice_watcher is not None:
            self._notice_watcher.close()

    # ------------------------------------------------- membership agreement
    def update_pending(self) -> bool:
        """Whether the driver has asked for a membership change since this round formed."""
        return self.info is not None and self._seen_update > self.info.update_gen

    def carry_update_flag(self, total: torch.Tensor) -> None:
        """DistributedOptimizer reports the summed flag that rode on its allreduce (a one-element
        tensor, read only by the next commit: see ``Bucket.finish``)."""
        self._carried_update = total

    def read_update_flag(self) -> None:
        """Read the carried flag now, before a commit queues its copies to host memory.

        On a GPU the read waits for the flag's copy to the host, which would
        otherwise queue behind a kept commit's gigabytes on the copy engine.
        """
        if isinstance(self._carried_update, torch.Tensor):
            self._carried_update = float(self._carried_update.item())

    def updates_agreed(self) -> bool:
        """Collectively: does every worker interrupt at this commit? Same answer on all ranks."""
        if self.standalone:
            return False
        if self._carried_update is not None:
            total, self._carried_update = self._carried_update, None
            return float(total) > 0  # a one-element tensor, or what read_update_flag made of it
        flag = torch.full((1,), 1.0 if self.update_pending() else 0.0, device=self.device)  # no host copy
        self.wait(self.group("membership check").allreduce([flag]), "membership check")
        return float(flag.item()) > 0

def _resolved(address: str) -> set[tuple[str, int]]:
    """Every (ip, port) that ``HOST:PORT`` resolves to."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), proto=socket.IPPROTO_TCP)
    except (OSError, ValueError):
        return set()
    return {(info[4][0], info[4][1]) for info in infos}


def _stacks_on_signal() -> None:
    """SIGUSR1 prints every thread's Python stack on stderr (the driver's log), unless the script handles it;
    so does a fatal signal, unless the script enabled ``faulthandler`` itself.

    The driver sends it before it kills a worker it gives up as silent or stuck:
    ``faulthandler`` answers from its C handler, even when the interpreter is stuck
    holding its lock and the heartbeat thread cannot ask for them.
    """
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    if not faulthandler.is_enabled():
        # A worker killed by a fatal signal (SIGSEGV; SIGABRT from "terminate called" in torch's C++,
        # which can come after the training returned) says where each thread was, once.
        faulthandler.enable(all_threads=True)


def _preload_lazy_modules() -> None:
    """Import what torch loads lazily on a job's first optimizer step, before joining.

    ``torch.optim`` imports ``torch._dynamo`` on the first ``step()`` (seconds).
    A worker joining a running job would otherwise do that while everyone else
    waits for it in the first allreduce; done here, it happens before the
    running workers are even asked to admit it. With the garbage collector
    paused (``memory.collector_paused``): about half the import's CPU was the
    collector's passes over torch's objects, on the script's thread, GIL held.
    Then one full pass, here: left to the collector, the passes over what the
    import made came in the worker's first steps instead, among them its first
    sync with its peers waiting (a clean clone's SSH worker was found in one
    there when its heartbeats ran past the 1.5 s limit). Import and pass took
    0.89-0.93 CPU-s against 1.08-1.11 with the collector on (2026-12-02).
    """
    with memory.collector_paused():
        try:
            import torch._dynamo  # noqa: F401
        except ImportError:  # a build without dynamo has nothing to preload
            pass
        gc.collect()


def _warm_up_a_step() -> None:
    """One tiny training step on the CPU, on this (the script's) thread, before joining (Gloo only: on a GPU the
    first step's cost is the device's, and autograd's first backward starts a thread per GPU, which a process
    that forks afterwards, the forkserver, must not have).

    A process's first forward, backward and optimizer step set up what later ones reuse (autograd's
    graph machinery, the optimizer's kernels, the allocator's first blocks): the first step of the
    benchmark's small model cost 4 ms against 1 ms. A worker joining a running job takes that first
    step at its admission, with the running workers waiting for it in the first allreduce (issue 41:
    the admission's stall). Built from constants, it draws no random numbers (the script's seeded
    stream stays its own) and leaves nothing behind.
    """
    try:
        with torch.enable_grad():  # an init() inside the script's no_grad() (its mode is restored on the way out)
            # On the CPU whatever the script's default device (a GPU's context is not this step's to open).
            w = torch.full((8, 8), 0.01, requires_grad=True, device="cpu")
            b = torch.zeros(8, requires_grad=True, device="cpu")
            opt = torch.optim.SGD([w, b], lr=0.1, momentum=0.9)
            for _ in range(2):
                x = torch.nn.functional.relu(torch.nn.functional.linear(torch.ones(4, 8, device="cpu"), w, b))
                loss = torch.nn.functional.mse_loss(torch.nn.functional.linear(x, w, b), torch.zeros(4, 8, device="cpu"))
                opt.zero_grad()
                loss.backward()
                opt.step()
    except Exception as exc:  # a speed-up only: never a reason not to join
        log.debug("the warm-up step failed: %s", exc)


_CONTEXT: WorkerContext | None = None
_LOCK = threading.Lock()
_JOIN_LOCK = threading.Lock()


def init() -> WorkerContext:
    """Create and start this process's context (idempotent)."""
    global _CONTEXT
    with _LOCK:
        if _CONTEXT is None:
            ctx = WorkerContext()
            ctx.start()
            _CONTEXT = ctx
            # Every optimizer step of the process, once it returns, counts (steps/s, steps_lost), whether the script
            # steps a DistributedOptimizer or averages gradients itself (hvd.allreduce_) and steps a plain one.
            count_steps(ctx.ledger.note_step)
        _CONTEXT.shut_down = False  # after hvd.shutdown(): the same registration, round and heartbeats serve again
        return _CONTEXT


def is_initialized() -> bool:
    """True after ``init()``, False before it and after ``hvd.shutdown()`` (as Horovod's)."""
    return _CONTEXT is not None and not _CONTEXT.shut_down


def get_context() -> WorkerContext:
    """The started context, joined to its round (:meth:`WorkerContext.join_if_pending`); raises ValueError
    (Horovod's behaviour) before ``init()`` and after ``hvd.shutdown()``."""
    ctx = _CONTEXT
    if ctx is not None and ctx.shut_down:
        raise ValueError("cloud_elastic.torch was shut down (hvd.shutdown()); call hvd.init() to use it again")
    if ctx is not None and ctx.join_pending:
        ctx.join_if_pending()
    if ctx is None or ctx.info is None:
        raise ValueError("cloud_elastic.torch has not been initialized; call init() first")
    return ctx


def slot_before_joining() -> int | None:
    """This worker's slot (its local rank, its GPU) while it has not joined its first round yet; else None."""
    ctx = _CONTEXT
    return ctx.settings.slot if ctx is not None and ctx.join_pending and ctx.info is None else None


def current() -> WorkerContext | None:
    """This process's context as it is, joined or not (None before ``init()``): for code that must not join."""
    return _CONTEXT


