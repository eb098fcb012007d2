"""The worker's connection to its job: rendezvous, process groups, heartbeats.

One :class:`WorkerContext` per worker process, created by ``init()``. It

* registers with the driver and keeps a heartbeat thread long-polling it;
  the replies carry the current round, the update generation (a graceful
  membership change is pending) and the highest aborted round;
* forms a fresh ``torch.distributed`` process group per rendezvous round on
  the round's signed namespace of the driver's TCPStore (see ``store``: keys
  named with HMAC of the job secret, values tagged and checked), Gloo on
  CPU, NCCL with CUDA (``CLOUD_ELASTIC_BACKEND`` overrides);
* reclaims the threads and sockets of a group abandoned after a failure
  (see ``reclaim``) without ever blocking on it;
* waits for every collective in bounded slices, so a round the driver aborted
  is abandoned within ~0.1 s even when a peer is stopped or partitioned and
  Gloo would otherwise wait for its own timeout;
* decides *collectively* whether a pending update interrupts at this commit:
  the flag rides on the gradient allreduce when ``DistributedOptimizer`` ran
  one since the last commit, else it costs one 1-element allreduce.

Its settings are read from the environment once (:class:`WorkerSettings`).
Without ``CLOUD_ELASTIC_DRIVER`` in the environment (a script run directly
with ``python``), the context runs standalone: one process, rank 0 of 1.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from cloud_elastic.control import Codec
from cloud_elastic.protocol import (
    Assignment,
    CompletedReport,
    CompletionReply,
    ExitOrder,
    PollReply,
    AdoptRequest,
    PollRequest,
    RankInfo,
    ReRegister,
    RendezvousRequest,
    StacksReport,
    parse_rendezvous_reply,
)
from cloud_elastic.worker import memory
from cloud_elastic.worker.client import DriverClient
from cloud_elastic.worker.exceptions import CollectiveError, WorkerRemoved
from cloud_elastic.worker.groups import (
    RoundGroup,
    nccl_error_handling_default,
    new_gloo_group,
    new_nccl_group,
    quiesce_device,
)
from cloud_elastic.worker.progress import Progress, format_stacks
from cloud_elastic.worker.reclaim import GroupSockets, Reaper, socket_inodes
from cloud_elastic.worker.settings import WorkerSettings
from cloud_elastic.worker.store import SignedStore, round_namespace
from cloud_elastic.worker.window import CommitWindow

__all__ = ["RoundInfo", "WorkerContext", "get_context", "init", "is_initialized"]

log = logging.getLogger(__name__)

_ABORT_SLICE_S = 0.05


@dataclass(frozen=True)
class RoundInfo(RankInfo):
    """This worker's place in the current rendezvous round: its ranks, plus the round's facts."""

    round: int
    needs_sync: bool
    update_gen: int
    from_checkpoint: bool = False


class WorkerContext:
    """See module docstring. Constructing it does no I/O; ``start()`` connects.

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
        self._group: RoundGroup | None = None
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
        self._carried_update: float | None = None
        self._shutdown = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.device = torch.device("cpu")
        #: Commits made by this process (its progress, for the driver's status and events).
        self.commits = 0
        #: Position in the job's history of commits of the state this worker would restore: each commit
        #: adds one, a sync takes rank 0's. Reported to the driver, which makes the holder of the newest
        #: commit rank 0 (a collective may complete on some ranks and fail on others).
        self.commit_seq = 0
        self._live_seq = 0  # the same for the live state, ahead of commit_seq between a commit and a restore
        #: Whether this worker can restore its last commit exactly (False after a failure inside an
        #: update's window that kept nothing; see ``window``). Reported at rendezvous: the driver then
        #: never takes the state from it.
        self.holds_commit = True
        #: The commit window: may an update run in place, keeping nothing?
        self.window = CommitWindow(s.commit_mode)
        #: ``commit_seq`` of the state the running (or last) sync broadcasts from rank 0.
        self.sync_root_seq: int | None = None
        #: Called with the state after each commit (e.g. rank 0's durable checkpoint schedule).
        self.after_commit: list[Any] = []
        #: DistributedOptimizer steps since the last commit: what a rollback undoes.
        self.steps_since_commit = 0
        self._rolled_back = 0
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

    @property
    def pg(self) -> Any:
        """The current round's process group (None before the first round and after leaving)."""
        return None if self._group is None else self._group.pg

    @property
    def leaked_groups(self) -> int:
        """Abandoned process groups whose threads and sockets could not be reclaimed."""
        return self._reaper.leaked

    @property
    def reclaimed_groups(self) -> int:
        """Abandoned process groups whose threads and sockets were reclaimed."""
        return self._reaper.reclaimed

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Register with the driver, start heartbeats and join the first round."""
        memory.keep_freed_memory(self.settings.malloc_tuning)
        self.progress.watch_thread()
        if self.backend == "nccl":
            nccl_error_handling_default()
            if self.interface:
                os.environ.setdefault("NCCL_SOCKET_IFNAME", self.interface)  # --network-interface reaches NCCL too
        if self.standalone:
            self._form_group(RoundInfo(0, 1, 0, 1, 0, 1, round=1, needs_sync=False, update_gen=0))
            return
        self._codec = Codec(self.settings.secret, self.job_id)
        os.environ.pop("CLOUD_ELASTIC_SECRET", None)  # not inherited by the user's own children
        _survive_output_loss()
        self._client = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
        reply = self._call("register")
        if not reply.get("ok"):
            raise WorkerRemoved("the driver does not know this worker")
        self._maybe_watch_notices(reply.get("notice_watcher"))
        # Heartbeats start at once: the driver counts silence from registration on,
        # and connecting to the store can wait for the driver's own torch import.
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="cloud-elastic-heartbeat", daemon=True)
        self._heartbeat.start()
        host, _, port = self.settings.store_address.rpartition(":")
        self._store = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=self.collective_timeout_s))
        self._control_peers = _resolved(self.settings.driver_address) | _resolved(self.settings.store_address)
        _preload_lazy_modules()
        reason = "start"
        while True:
            try:
                self.rendezvous(reason)
                return
            except CollectiveError as exc:
                log.warning("worker %s: %s; rejoining", self.worker_id, exc)
                reason = "failure"

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
        request = RendezvousRequest(last_round, reason, self.commits, self._rolled_back, self.commit_seq,
                                    self.holds_commit).to_wire()
        while True:
            reply = parse_rendezvous_reply(self._call("rendezvous", request, timeout_s=60.0))
            if isinstance(reply, Assignment):
                break
            if isinstance(reply, ExitOrder):
                raise WorkerRemoved(reply.reason)
            if isinstance(reply, ReRegister):
                try:
                    self._reregister(self._client)
                except OSError as exc:  # the driver went again: the next call rides it out like any other
                    log.warning("worker %s: re-registering failed (%s); retrying", self.worker_id, exc)
        info = RoundInfo(**vars(reply.ranks), round=reply.round, needs_sync=reply.needs_sync, update_gen=reply.update_gen,
                         from_checkpoint=reply.from_checkpoint)
        self._rolled_back = 0
        if self.backend == "nccl" and info.local_rank != self.settings.slot:
            # The GPU is the slot; a driver that disagrees would move this worker's group off its model.
            log.warning("worker %s: the driver assigned local rank %d to slot %d", self.worker_id, info.local_rank, self.settings.slot)
        self._attempted_round = info.round
        if self._store_stale:
            self._reconnect_store()
        self._form_group(info)
        log.info("worker %s: joined round %d as rank %d of %d", self.worker_id, info.round, info.rank, info.size)
        return info

    def report_completed(self, error: str | None = None) -> None:
        """Tell the driver the training function returned on this worker; return once the driver agrees.

        Completion is rank 0's to decide (it holds the state). Another rank's
        report is held until rank 0 returns too, normally milliseconds later.
        If rank 0 is found still training (waiting in a collective this worker
        will never join), the driver says ``leave``: WorkerRemoved is raised, and
        ``elastic.run`` makes the worker exit while its peers go on without it.
        ``error`` tells the driver the final durable checkpoint was not written.
        """
        if self._client is None:
            return
        report = CompletedReport(self.info.round if self.info else 0, self.live_commit_seq, self.progress.steps,
                                 error).to_wire()
        while True:
            reply = CompletionReply.from_wire(self._call("completed", report, timeout_s=70.0))
            if reply.decision == "done":
                self.progress.mark()
                return
            if reply.decision == "leave":
                raise WorkerRemoved(reply.reason or "returned from its training function before rank 0")

    def _call(self, kind: str, payload: dict[str, Any] | None = None, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """A control-plane call that rides out a network blip (these calls are idempotent on the driver)."""
        assert self._client is not None
        # Within the driver grace the heartbeat thread decides when to give up; here, just keep trying.
        deadline = time.monotonic() + max(3 * self.heartbeat_timeout_s, self.driver_grace_s + 5)
        while True:
            try:
                return self._client.call(kind, payload, timeout_s=timeout_s)
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("worker %s: %s to the driver failed (%s); retrying", self.worker_id, kind, exc)
                time.sleep(0.2)

    def report_checkpoint(self, event: str, **fields: Any) -> None:
        """Tell the driver a checkpoint was ``saved``, ``loaded`` or could not be loaded (``failed``).

        Best effort: while the driver is away the report is skipped (the
        checkpoint itself is what matters), and a failed call is logged.
        """
        if self._codec is None or (self.driver_lost and event != "failed"):
            return
        with self._reporter_lock:
            if self._reporter is None:
                self._reporter = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
            try:
                self._reporter.call("checkpoint", dict(fields, event=event, round=self.info.round if self.info else 0),
                                    timeout_s=self.heartbeat_timeout_s + 5)
            except Exception as exc:  # the driver may be gone; the checkpoint is on storage either way
                log.warning("worker %s: could not report checkpoint %s to the driver: %s", self.worker_id, event, exc)

    def close(self) -> None:
        self._shutdown.set()
        if self._notice_watcher is not None:
            self._notice_watcher.close()

    def note_commit(self, state: Any = None) -> None:
        """A commit of ``state`` finished on this worker (``State.commit``); runs the after-commit hooks."""
        self.holds_commit = True
        self.commits += 1
        self._live_seq += 1
        self.commit_seq = self._live_seq
        self.steps_since_commit = 0
        self.progress.mark()
        for hook in self.after_commit:
            hook(state)

    def note_step(self) -> None:
        """An optimizer step finished (``DistributedOptimizer.step``)."""
        self.steps_since_commit += 1
        self.progress.step()

    def note_rollback(self) -> None:
        """The state was just restored to the last commit: the steps since then are lost (told to the driver)."""
        self._rolled_back, self.steps_since_commit = self.steps_since_commit, 0
        self._live_seq = self.commit_seq

    def note_restored(self) -> None:
        """The state was restored to the last commit without losing steps (e.g. after a cut-short sync)."""
        self._live_seq = self.commit_seq

    @property
    def live_commit_seq(self) -> int:
        """``commit_seq`` of the live state (what a sync from this worker gives the others)."""
        return self._live_seq

    def hold_commit(self, seq: int) -> None:
        """The state (live and saved) is now commit ``seq`` of the job: after a sync or a checkpoint load."""
        self._live_seq = self.commit_seq = max(0, int(seq))
        self.holds_commit = True

    def lost_commit(self, why: str) -> None:
        """The live state is not the last commit and nothing kept can bring it back (see ``window``)."""
        if self.holds_commit:
            log.warning("worker %s: cannot restore the last commit exactly (%s); the next round takes the state "
                        "from a worker that can", self.worker_id, why)
        self.holds_commit = False

    def leave(self, timeout_s: float = 5.0) -> None:
        """This worker leaves the job for good (told to exit).

        Acknowledges the notices it watched, stops its heartbeats, and releases its
        process group now (its peers have moved on to a new group): left to the
        interpreter's shutdown, destroying a Gloo group blocked the exit until the
        driver killed the worker.
        """
        if self._notice_watcher is not None:
            try:
                self._notice_watcher.acknowledge()
            finally:
                self._notice_watcher.close()
                self._notice_watcher = None
        # Heartbeats go on until the process ends: a leaver that went silent would be given up.
        group, self._group = self._group, None
        if group is None:
            return
        done = self._reaper.reclaimed + self._reaper.leaked
        self._reaper.retire(group)
        del group
        deadline = time.monotonic() + timeout_s
        while self._reaper.reclaimed + self._reaper.leaked == done and time.monotonic() < deadline:
            time.sleep(0.02)

    # ---------------------------------------------------------------- notices
    def _maybe_watch_notices(self, cloud: Any) -> None:
        """Start this host's metadata notice watcher when the driver picks this worker for it (once).

        Never raises: a watcher that cannot start costs the notice's lead time, not the training.
        """
        if not isinstance(cloud, str) or self._notice_watcher is not None or self._codec is None:
            return
        try:
            self._start_notice_watcher(cloud)
        except Exception:  # noqa: BLE001 - logged with its traceback; training goes on without a watcher
            log.exception("worker %s: could not start the %s notice watcher", self.worker_id, cloud)

    def _start_notice_watcher(self, cloud: str) -> None:
        from cloud_elastic.errors import ConfigError
        from cloud_elastic.notices import watcher_for

        try:
            watcher = watcher_for(cloud, self.hostname)  # its endpoint overrides come from this process's environment
        except ConfigError as exc:
            log.warning("worker %s: no %s notice watcher: %s", self.worker_id, cloud, exc)
            return
        if watcher is None:
            return
        self._notice_watcher = watcher
        assert self._codec is not None
        client = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
        watcher.start(notice_reporter(client, self.heartbeat_timeout_s + 10))
        log.info("worker %s: watching %s instance metadata for notices on host %s", self.worker_id, cloud, self.hostname)

    # --------------------------------------------------------- process groups
    def _form_group(self, info: RoundInfo) -> None:
        self._carried_update = None
        if self.backend == "nccl":
            self.device = torch.device("cuda", info.local_rank)
            torch.cuda.set_device(self.device)
        if self.standalone:
            store: Any = dist.HashStore()
        else:
            namespace = round_namespace(self.settings.secret, self.job_id, info.round)
            store = SignedStore(self._store, namespace, self.settings.secret)
        done = threading.Event()
        lock = threading.Lock()
        result: dict[str, Any] = {}

        def create() -> None:
            before = socket_inodes()
            try:
                pg = self._new_group(store, info)
            except Exception as exc:  # reported to the waiting thread below
                result["error"] = exc
                done.set()
                return
            sockets = GroupSockets(before, socket_inodes(), self._control_peers)
            group = RoundGroup(pg, store, sockets, self.backend, self.device)
            with lock:
                if result.get("abandoned"):
                    # The round was given up while this group formed: nobody will use it.
                    self._reaper.retire(group)
                else:
                    result["group"] = group
            done.set()

        # Forming a group blocks in C++ until every peer arrives; do it on a
        # side thread so an aborted round can be abandoned instead of waited out.
        # A group that never forms while every member still heartbeats is given up at a
        # deadline far below Gloo's own timeout: this worker then rejoins with a failure,
        # which aborts the round for its peers too.
        threading.Thread(target=create, name=f"form-round-{info.round}", daemon=True).start()
        limit_s = min(self.settings.group_form_timeout_s, self.collective_timeout_s)
        deadline = time.monotonic() + limit_s
        with self.progress.waiting():
            while not done.wait(_ABORT_SLICE_S):
                aborted = self._aborted(info.round)
                if aborted or time.monotonic() > deadline:
                    with lock:
                        result["abandoned"] = True
                    if "group" in result:  # formed in the very last slice
                        self._reaper.retire(result.pop("group"))
                    # The abandoned constructor may still block in a store wait, and a TCPStore
                    # client runs one operation at a time: the next round's formation on this
                    # client would wait behind it up to the collective timeout. It gets its own.
                    self._store_stale = True
                    if aborted:
                        raise CollectiveError(f"round {info.round} was aborted while forming its process group")
                    raise CollectiveError(f"the process group of round {info.round} did not form within "
                                          f"{limit_s:g} s (CLOUD_ELASTIC_GROUP_FORM_TIMEOUT_S); giving the round up")
        if "error" in result:
            reason = str(result.pop("error")).splitlines()[0][:300]
            raise CollectiveError(f"could not form the process group of round {info.round}: {reason}")
        old, self._group = self._group, result.pop("group")
        self.info = info
        self.progress.mark()
        if old is not None:
            self._retire(old)
        del old  # this frame must not be what keeps the old group alive

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
            Reaper.release(group)

    def _new_group(self, store: Any, info: RoundInfo) -> Any:
        timeout = timedelta(seconds=self.collective_timeout_s)
        if self.backend == "nccl":
            return new_nccl_group(store, info.rank, info.size, timeout, self.device)
        if self.backend != "gloo":
            raise RuntimeError(f"unsupported backend {self.backend!r} (use gloo or nccl)")
        return new_gloo_group(store, info.rank, info.size, timeout, hostname=self.hostname, interface=self.interface)

    def _abandon_round(self) -> None:
        """A collective of the current round failed or was abandoned: fail the rest of its work now.

        After an NCCL abort the device must finish what was queued on it before
        the state is restored from it; a device that does not is wedged, and
        this worker exits rather than train on from a state it cannot trust.
        """
        group = self._group
        if group is None or not group.abandon():
            return
        if group.backend == "nccl" and not quiesce_device(group.device):
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
        if self.info is not None and self._aborted(self.info.round):
            self._abandon_round()
            raise CollectiveError(f"{what} not started: the driver aborted round {self.info.round} (a peer was lost)")
        self.window.collective(what)
        return self.pg

    def wait(self, work: Any, what: str) -> None:
        """Wait for ``work``; abandon it when the driver aborts this round.

        Either way out by failure abandons the round's group at once (see
        ``groups``), so nothing of it stays blocked on a peer.
        """
        assert self.info is not None
        fut = work.get_future()
        if not fut.done():
            event = threading.Event()
            fut.add_done_callback(lambda _f: event.set())
            round_ = self.info.round
            with self.progress.waiting():
                while not event.wait(_ABORT_SLICE_S):
                    if self._aborted(round_):
                        self._abandon_round()
                        raise CollectiveError(f"{what} abandoned: the driver aborted round {round_} (a peer was lost)")
        try:
            work.wait()
        except RuntimeError as exc:
            self._abandon_round()
            reason = str(exc).splitlines()[0].split(" This is typically")[0]
            raise CollectiveError(f"{what} failed: {reason}") from exc
        self.progress.mark()

    def _aborted(self, round_: int) -> bool:
        return self._seen_abort >= round_

    # ------------------------------------------------- membership agreement
    def update_pending(self) -> bool:
        """Whether the driver has asked for a membership change since this round formed."""
        return self.info is not None and self._seen_update > self.info.update_gen

    def carry_update_flag(self, total: float) -> None:
        """DistributedOptimizer reports the summed flag that rode on its allreduce."""
        self._carried_update = total

    def updates_agreed(self) -> bool:
        """Collectively: does every worker interrupt at this commit? Same answer on all ranks."""
        if self.standalone:
            return False
        if self._carried_update is not None:
            total, self._carried_update = self._carried_update, None
            return total > 0
        flag = torch.tensor([1.0 if self.update_pending() else 0.0], device=self.device)
        self.wait(self.group("membership check").allreduce([flag]), "membership check")
        return float(flag.item()) > 0

    # -------------------------------------------------------------- heartbeat
    def _heartbeat_loop(self) -> None:
        assert self._codec is not None
        client = DriverClient(self.settings.driver_address, self._codec, self.worker_id)
        last_ok = time.monotonic()
        while not self._shutdown.is_set():
            try:
                progress = self.progress
                reply = PollReply.from_wire(client.call(
                    "poll",
                    PollRequest(self._seen_round, self._seen_update, self._seen_abort, self.commits,
                                self.commit_seq, progress.sample(), progress.steps,
                                round(progress.waiting_s(), 2)).to_wire(),
                    timeout_s=self.heartbeat_timeout_s + 10,
                ))
                if reply.reregister:
                    self._reregister(client)
                    reply = None
                last_ok = time.monotonic()
                if self.driver_lost:
                    self.driver_lost = False
                    log.warning("worker %s: the driver answers again", self.worker_id)
            except Exception as exc:  # any failure to reach the driver counts toward giving up
                # Counted from the last answer, so a worker never outlives its driver by more than the grace.
                silent = time.monotonic() - last_ok
                if not self.driver_lost and silent > self.heartbeat_timeout_s:
                    self.driver_lost = True
                    print(f"cloud-elastic: worker {self.worker_id} cannot reach the driver ({exc}); training on "
                          f"for up to {self.driver_grace_s:g}s (--driver-grace)", file=sys.stderr, flush=True)
                if silent > self.driver_grace_s:
                    self._grace_exit(exc)
                time.sleep(0.2)
                continue
            if reply is None:
                continue  # adopted; the next poll brings the restarted driver's view
            self._seen_round = reply.round
            self._seen_update = max(self._seen_update, reply.update_gen)
            self._seen_abort = max(self._seen_abort, reply.abort_round)
            self._maybe_watch_notices(reply.notice_watcher)
            if reply.stacks > self._stacks_sent:
                self._send_stacks(client, reply.stacks)
            if reply.shutdown:
                return

    def _send_stacks(self, client: DriverClient, request: int) -> None:
        """The driver asked for this worker's stacks (its round looks stuck): send every thread's."""
        self._stacks_sent = request
        try:
            client.call("stacks", StacksReport(request, format_stacks()).to_wire(),
                        timeout_s=self.heartbeat_timeout_s + 10)
        except Exception as exc:  # the heartbeat goes on; the driver stops waiting for them
            log.warning("worker %s: could not send its stacks to the driver: %s", self.worker_id, exc)


    # ------------------------------------------------------------- adoption
    def _reregister(self, client: DriverClient) -> None:
        """A driver restarted within the grace does not know this worker yet: tell it where we stand.

        The worker keeps its process group and its step: the driver takes it over in
        its current round. Only the store client is renewed (its server died with the
        old driver), before the next round forms. A driver that refuses (it resumed
        the job without this worker) makes the worker exit: its training would now
        be a second copy of the job.
        """
        with self._adopt_lock:
            info = self.info if self._attempted_round else None
            ranks = None if info is None else RankInfo(info.rank, info.size, info.local_rank, info.local_size,
                                                       info.cross_rank, info.cross_size)
            request = AdoptRequest(0 if info is None else info.round, ranks, 0 if info is None else info.update_gen,
                                   self._seen_update, self._seen_abort, self.commits, self.settings.slot, os.getpid(),
                                   self.commit_seq)
            reply = client.call("adopt", request.to_wire(), timeout_s=self.heartbeat_timeout_s + 10)
            if not reply.get("ok"):
                print(f"cloud-elastic: worker {self.worker_id}: the restarted driver refused to adopt it "
                      f"({str(reply.get('reason') or 'no reason given')[:300]}); exiting", file=sys.stderr, flush=True)
                os._exit(75)
            self._store_stale = True
            if self.driver_lost:
                self.driver_lost = False
            log.warning("worker %s: adopted by the restarted driver in round %d", self.worker_id,
                        request.round)

    def _reconnect_store(self) -> None:
        host, _, port = self.settings.store_address.rpartition(":")
        self._store = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=self.collective_timeout_s))
        self._store_stale = False

    def _grace_exit(self, exc: BaseException) -> None:
        """The driver stayed away past the grace: run the exit hooks (rank 0's last checkpoint), then exit."""
        for hook in self.before_grace_exit:
            try:
                hook()
            except Exception:  # exiting is what matters now
                log.warning("worker %s: an exit hook failed", self.worker_id, exc_info=True)
        print(
            f"cloud-elastic: worker {self.worker_id} lost contact with the driver for more than "
            f"{self.driver_grace_s:g}s (--driver-grace; last error: {exc}); exiting",
            file=sys.stderr, flush=True,
        )
        os._exit(75)


class _SurvivingStream:
    """``sys.stdout``/``sys.stderr`` that outlive their reader.

    A local worker's output is a pipe to its driver. When the driver dies the
    pipe breaks, and the next ``print`` would raise BrokenPipeError inside the
    training loop, although workers are meant to train on for the driver
    grace. The first write that finds the pipe broken points the file
    descriptor at /dev/null and carries on.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _lost(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except BrokenPipeError:
            self._lost()
            return len(data)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._lost()
            try:
                self._stream.flush()  # drains the buffered bytes into /dev/null
            except OSError:
                pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _survive_output_loss() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _SurvivingStream):
            setattr(sys, name, _SurvivingStream(stream))


def _resolved(address: str) -> set[tuple[str, int]]:
    """Every (ip, port) that ``HOST:PORT`` resolves to."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), proto=socket.IPPROTO_TCP)
    except (OSError, ValueError):
        return set()
    return {(info[4][0], info[4][1]) for info in infos}


def _preload_lazy_modules() -> None:
    """Import what torch loads lazily on a job's first optimizer step, before joining.

    ``torch.optim`` imports ``torch._dynamo`` on the first ``step()`` (seconds).
    A worker joining a running job would otherwise do that while everyone else
    waits for it in the first allreduce; done here, it happens before the
    running workers are even asked to admit it.
    """
    try:
        import torch._dynamo  # noqa: F401
    except ImportError:  # a build without dynamo has nothing to preload
        pass


_CONTEXT: WorkerContext | None = None
_LOCK = threading.Lock()


def init() -> WorkerContext:
    """Create and start this process's context (idempotent)."""
    global _CONTEXT
    with _LOCK:
        if _CONTEXT is None:
            ctx = WorkerContext()
            ctx.start()
            _CONTEXT = ctx
        return _CONTEXT


def is_initialized() -> bool:
    return _CONTEXT is not None


def get_context() -> WorkerContext:
    """The started context; raises ValueError (Horovod's behaviour) before ``init()``."""
    if _CONTEXT is None or _CONTEXT.info is None:
        raise ValueError("cloud_elastic.torch has not been initialized; call init() first")
    return _CONTEXT


def notice_reporter(client: DriverClient, timeout_s: float) -> Callable[[Any], None]:
    """The report callback of a host's notice watcher: sends each notice to the driver.

    The callback raises (ControlPlaneError, OSError) unless the driver took the
    notice, an ``{"ok": false}`` reply included, so that the watcher reports
    it again at its next sighting instead of losing it.
    """
    from cloud_elastic.errors import ControlPlaneError

    def report(notice: Any) -> None:
        reply = client.call("notice", {
            "source": notice.source, "notice": notice.kind, "reason": notice.reason, "deadline": notice.deadline,
        }, timeout_s=timeout_s)
        if reply.get("ok") is not True:
            raise ControlPlaneError(f"the driver did not take the {notice.kind} notice ({notice.reason})")

    return report
