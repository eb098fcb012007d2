"""The worker's connection to its job: rendezvous, process groups, heartbeats.

One :class:`WorkerContext` per worker process, created by ``init()``. It

* registers with the driver and keeps a heartbeat thread long-polling it;
  the replies carry the current round, the update generation (a graceful
  membership change is pending) and the highest aborted round;
* forms a fresh ``torch.distributed`` process group per rendezvous round on
  a fresh ``PrefixStore`` namespace of the driver's TCPStore (Gloo on CPU,
  NCCL with CUDA; ``CLOUD_ELASTIC_BACKEND`` overrides);
* waits for every collective in bounded slices, so a round the driver aborted
  is abandoned within ~0.1 s even when a peer is stopped or partitioned and
  Gloo would otherwise wait for its own timeout;
* decides *collectively* whether a pending update interrupts at this commit:
  the flag rides on the gradient allreduce when ``DistributedOptimizer`` ran
  one since the last commit, else it costs one 1-element allreduce.

Without ``CLOUD_ELASTIC_DRIVER`` in the environment (a script run directly
with ``python``), the context runs standalone: one process, rank 0 of 1.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cloud_elastic.control import Codec
from cloud_elastic.driver.planner import RankInfo
from cloud_elastic.worker import memory
from cloud_elastic.worker.client import DriverClient
from cloud_elastic.worker.exceptions import CollectiveError, WorkerRemoved

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
    """See module docstring. Constructing it does no I/O; ``start()`` connects."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.standalone = "CLOUD_ELASTIC_DRIVER" not in env
        self.worker_id = env.get("CLOUD_ELASTIC_WORKER_ID", "standalone")
        self.job_id = env.get("CLOUD_ELASTIC_JOB_ID", "standalone")
        self.hostname = env.get("CLOUD_ELASTIC_HOSTNAME", "127.0.0.1")
        self.interface = env.get("CLOUD_ELASTIC_NETWORK_INTERFACE")
        self._environ = env
        self.heartbeat_timeout_s = float(env.get("CLOUD_ELASTIC_HEARTBEAT_TIMEOUT_S", "5"))
        self.collective_timeout_s = float(env.get("CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S", "300"))
        self.backend = env.get("CLOUD_ELASTIC_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
        self._driver_addr = env.get("CLOUD_ELASTIC_DRIVER", "")
        self._store_addr = env.get("CLOUD_ELASTIC_STORE", "")
        self._secret = env.get("CLOUD_ELASTIC_SECRET", "")
        if not self.standalone and not self._secret:
            raise RuntimeError("CLOUD_ELASTIC_SECRET is not set; workers must be started by 'cloud-elastic run'")
        self.info: RoundInfo | None = None
        self.pg: Any = None
        self.leaked_groups = 0
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
        #: Commits made by this process; reported to the driver, which keeps rank 0 on a worker that has some.
        self.commits = 0
        #: DistributedOptimizer steps since the last commit: what a rollback undoes.
        self.steps_since_commit = 0
        self._rolled_back = 0
        self._notice_watcher: Any = None

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Register with the driver, start heartbeats and join the first round."""
        memory.keep_freed_memory(self._environ)
        if self.standalone:
            self._form_group(RoundInfo(0, 1, 0, 1, 0, 1, round=1, needs_sync=False, update_gen=0))
            return
        self._codec = Codec(self._secret, self.job_id)
        os.environ.pop("CLOUD_ELASTIC_SECRET", None)  # not inherited by the user's own children
        self._client = DriverClient(self._driver_addr, self._codec, self.worker_id)
        reply = self._call("register")
        if not reply.get("ok"):
            raise WorkerRemoved("the driver does not know this worker")
        self._maybe_watch_notices(reply.get("notice_watcher"))
        # Heartbeats start at once: the driver counts silence from registration on,
        # and connecting to the store can wait for the driver's own torch import.
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="cloud-elastic-heartbeat", daemon=True)
        self._heartbeat.start()
        host, _, port = self._store_addr.rpartition(":")
        self._store = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=self.collective_timeout_s))
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
        last_round = self._attempted_round
        self._last_reason = reason
        while True:
            reply = self._call(
                "rendezvous",
                {"last_round": last_round, "reason": reason, "commits": self.commits, "rolled_back": self._rolled_back},
                timeout_s=60.0,
            )
            status = reply.get("status")
            if status == "assigned":
                break
            if status == "exit":
                raise WorkerRemoved(str(reply.get("reason", "told to exit")))
        info = RoundInfo(**{k: reply[k] for k in RoundInfo.__dataclass_fields__ if k in reply})
        self._rolled_back = 0
        self._attempted_round = info.round
        self._form_group(info)
        log.info("worker %s: joined round %d as rank %d of %d", self.worker_id, info.round, info.rank, info.size)
        return info

    def report_completed(self) -> None:
        """Tell the driver the training function returned on this worker."""
        if self._client is not None:
            self._call("completed", {"round": self.info.round if self.info else 0})

    def _call(self, kind: str, payload: dict[str, Any] | None = None, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """A control-plane call that rides out a network blip (these calls are idempotent on the driver)."""
        assert self._client is not None
        deadline = time.monotonic() + 3 * self.heartbeat_timeout_s
        while True:
            try:
                return self._client.call(kind, payload, timeout_s=timeout_s)
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("worker %s: %s to the driver failed (%s); retrying", self.worker_id, kind, exc)
                time.sleep(0.2)

    def close(self) -> None:
        self._shutdown.set()
        if self._notice_watcher is not None:
            self._notice_watcher.close()

    def note_commit(self) -> None:
        """A commit finished on this worker (``State.commit``)."""
        self.commits += 1
        self.steps_since_commit = 0

    def note_step(self) -> None:
        """An optimizer step finished (``DistributedOptimizer.step``)."""
        self.steps_since_commit += 1

    def note_rollback(self) -> None:
        """The state was just restored to the last commit: the steps since then are lost (told to the driver)."""
        self._rolled_back, self.steps_since_commit = self.steps_since_commit, 0

    def leave(self) -> None:
        """This worker leaves the job for good (told to exit): acknowledge notices it watched, stop watching."""
        if self._notice_watcher is not None:
            try:
                self._notice_watcher.acknowledge()
            finally:
                self._notice_watcher.close()
                self._notice_watcher = None

    # ---------------------------------------------------------------- notices
    def _maybe_watch_notices(self, cloud: Any) -> None:
        """Start this host's metadata notice watcher when the driver picks this worker for it (once)."""
        if not isinstance(cloud, str) or self._notice_watcher is not None or self._codec is None:
            return
        from cloud_elastic.errors import ConfigError
        from cloud_elastic.notices import watcher_for

        try:
            watcher = watcher_for(cloud, self.hostname, self._environ)
        except ConfigError as exc:
            log.warning("worker %s: no %s notice watcher: %s", self.worker_id, cloud, exc)
            return
        if watcher is None:
            return
        self._notice_watcher = watcher
        client = DriverClient(self._driver_addr, self._codec, self.worker_id)

        def report(notice: Any) -> None:
            try:
                client.call("notice", {
                    "source": notice.source, "notice": notice.kind, "reason": notice.reason,
                    "deadline": notice.deadline,
                }, timeout_s=self.heartbeat_timeout_s + 10)
            except Exception as exc:  # reported again by the watcher's next sighting, or lost with the host
                log.warning("worker %s: could not report a %s notice to the driver: %s", self.worker_id, notice.kind, exc)

        watcher.start(report)
        log.info("worker %s: watching %s instance metadata for notices on host %s", self.worker_id, cloud, self.hostname)

    # --------------------------------------------------------- process groups
    def _form_group(self, info: RoundInfo) -> None:
        self._carried_update = None
        if self.backend == "nccl":
            self.device = torch.device("cuda", info.local_rank)
            torch.cuda.set_device(self.device)
        if self.standalone:
            store = dist.HashStore()
        else:
            store = dist.PrefixStore(f"round/{info.round}", self._store)
        done = threading.Event()
        result: dict[str, Any] = {}

        def create() -> None:
            try:
                result["pg"] = self._new_group(store, info)
            except Exception as exc:  # reported to the waiting thread below
                result["error"] = exc
            finally:
                done.set()

        # Forming a group blocks in C++ until every peer arrives; do it on a
        # side thread so an aborted round can be abandoned instead of waited out.
        threading.Thread(target=create, name=f"form-round-{info.round}", daemon=True).start()
        while not done.wait(_ABORT_SLICE_S):
            if self._aborted(info.round):
                raise CollectiveError(f"round {info.round} was aborted while forming its process group")
        if "error" in result:
            raise CollectiveError(f"could not form the process group of round {info.round}: {result['error']}")
        self._retire(self.pg, abandoned=self._last_reason == "failure")
        self.pg = result["pg"]
        self.info = info

    def _retire(self, pg: Any, abandoned: bool) -> None:
        """Let go of the previous round's group without ever blocking on it.

        Destroying a Gloo group joins its worker threads, and a collective
        abandoned on a lost peer holds one of them until Gloo's own timeout. A
        group left after a failure is therefore deliberately leaked (one extra
        reference that is never dropped, not even at interpreter exit); the OS
        reclaims it with the process. Groups left gracefully have no pending
        work and are released normally.
        """
        if pg is not None and abandoned:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))
            self.leaked_groups += 1

    def _new_group(self, store: Any, info: RoundInfo) -> Any:
        timeout = timedelta(seconds=self.collective_timeout_s)
        if self.backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            return dist.ProcessGroupNCCL(store, info.rank, info.size, opts)
        if self.backend != "gloo":
            raise RuntimeError(f"unsupported backend {self.backend!r} (use gloo or nccl)")
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        if self.interface:
            opts._devices = [dist.ProcessGroupGloo.create_device(interface=self.interface)]
        else:
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self.hostname)]
        return dist.ProcessGroupGloo(store, info.rank, info.size, opts)

    # ------------------------------------------------------------ collectives
    def wait(self, work: Any, what: str) -> None:
        """Wait for ``work``; abandon it when the driver aborts this round."""
        assert self.info is not None
        fut = work.get_future()
        if not fut.done():
            event = threading.Event()
            fut.add_done_callback(lambda _f: event.set())
            round_ = self.info.round
            while not event.wait(_ABORT_SLICE_S):
                if self._aborted(round_):
                    if self.backend == "nccl":
                        self._abort_nccl()
                    raise CollectiveError(f"{what} abandoned: the driver aborted round {round_} (a peer was lost)")
        try:
            work.wait()
        except RuntimeError as exc:
            reason = str(exc).splitlines()[0].split(" This is typically")[0]
            raise CollectiveError(f"{what} failed: {reason}") from exc

    def _abort_nccl(self) -> None:
        try:
            self.pg.abort()
        except (RuntimeError, AttributeError):
            log.debug("NCCL abort failed", exc_info=True)

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
        self.wait(self.pg.allreduce([flag]), "membership check")
        return float(flag.item()) > 0

    # -------------------------------------------------------------- heartbeat
    def _heartbeat_loop(self) -> None:
        assert self._codec is not None
        client = DriverClient(self._driver_addr, self._codec, self.worker_id)
        failing_since: float | None = None
        while not self._shutdown.is_set():
            try:
                reply = client.call(
                    "poll",
                    {"round": self._seen_round, "update_gen": self._seen_update, "abort_round": self._seen_abort,
                     "commits": self.commits},
                    timeout_s=self.heartbeat_timeout_s + 10,
                )
                failing_since = None
            except Exception as exc:  # any failure to reach the driver counts toward giving up
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > 3 * self.heartbeat_timeout_s:
                    print(
                        f"cloud-elastic: worker {self.worker_id} lost contact with the driver ({exc}); exiting",
                        file=sys.stderr, flush=True,
                    )
                    os._exit(75)
                time.sleep(0.2)
                continue
            self._seen_round = int(reply.get("round", 0))
            self._seen_update = max(self._seen_update, int(reply.get("update_gen", 0)))
            self._seen_abort = max(self._seen_abort, int(reply.get("abort_round", 0)))
            self._maybe_watch_notices(reply.get("notice_watcher"))
            if reply.get("shutdown"):
                return


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
