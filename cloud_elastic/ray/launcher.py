"""``RayLauncher``: the driver's launcher seam, with one Ray actor per worker.

Each worker is a :class:`~cloud_elastic.ray.actor.WorkerActor` pinned to its
host's node (``NodeAffinitySchedulingStrategy``, not soft; a host named by IP
address or hostname, as an ``override_discovery`` may name it, is the alive node
with that address), reserving the slot's resources (``cpus_per_slot`` CPUs, and
``gpus_per_slot`` GPUs with ``use_gpu``; without ``use_gpu`` the worker sees no
GPU: ``CUDA_VISIBLE_DEVICES`` is empty unless the job's environment sets it). It runs either a Python training function (serialised by Ray,
sent once through the object store) inside the actor, or, for
:func:`~cloud_elastic.ray.build_ray_run` (a command job, as the CLI runs), the job's command as a child of the actor.

How the launcher guarantees of :mod:`cloud_elastic.driver.launch.api` hold here:

* ``launch`` only submits the actor; it never waits for it to be placed.
* The secret travels as an argument of the call that starts the worker (Ray's
  RPC, inside the cluster), never on a command line, in the actor's creation
  arguments or in a ``runtime_env`` (both of which Ray stores in its GCS).
* ``kill`` is ``ray.kill`` and returns at once; ``terminate`` asks a command's
  wrapper to TERM the worker, waits up to the grace, then kills the actor. A
  training function running inside the actor cannot be interrupted politely, so
  for it ``terminate`` waits up to the grace for it to end and then kills.
* Output: the workers' stdout and stderr reach the caller through Ray's own log
  streaming (``ray.init(log_to_driver=True)``, the default), prefixed by Ray
  with the actor's pid and node. ``on_output`` receives the launcher's own
  lines (a training function's traceback, an actor that died).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cloud_elastic.driver.launch.api import ExitStatus, OutputSink, WorkerSpec
from cloud_elastic.errors import ConfigError, LaunchError
from cloud_elastic.ray._deps import require_ray

__all__ = ["FunctionPayload", "RayLauncher", "RayWorker", "WorkerResult", "node_for", "ray_node_id"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FunctionPayload:
    """A training function to run in every worker actor, with its arguments."""

    fn: Callable[..., Any]
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerResult:
    """What one worker's training function returned, with its rank in the final round."""

    worker_id: str
    rank: int | None
    value: Any


class RayWorker:
    """A worker running in a Ray actor (the :class:`~cloud_elastic.driver.launch.api.WorkerProcess` protocol)."""

    def __init__(self, spec: WorkerSpec, actor: Any, ref: Any, on_output: OutputSink, owner: RayLauncher) -> None:
        self.spec = spec
        self._actor = actor
        self._ref = ref
        self._on_output = on_output
        self._owner = owner
        self._status: ExitStatus | None = None
        self._done = threading.Event()
        self._killed = False
        self._thread = threading.Thread(target=self._wait, name=f"ray-{spec.worker_id}", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        ray = require_ray()
        try:
            reply = ray.get(self._ref)
        except ray.exceptions.RayTaskError as exc:  # the training function raised
            self._owner._record_error(self.spec.worker_id, exc)
            for line in str(exc).splitlines():
                self._on_output(line)
            self._finish(ExitStatus(1))
            return
        except ray.exceptions.RayError as exc:  # the actor died, was killed, or could not be placed
            self._finish(self._lost(exc))
            return
        if reply.get("kind") == "result":
            self._owner._record_result(WorkerResult(self.spec.worker_id, reply.get("rank"), reply.get("value")))
            self._finish(ExitStatus(0))
        else:
            self._finish(ExitStatus(int(reply.get("code", 1))))

    def _lost(self, exc: Exception) -> ExitStatus:
        if self._killed:
            return ExitStatus(-9)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        ray = require_ray()
        unschedulable = getattr(ray.exceptions, "ActorUnschedulableError", ())
        if unschedulable and isinstance(exc, unschedulable):
            return ExitStatus(255, transport_error=f"ray could not place the worker on node {self.spec.host}: {first}")
        self._on_output(f"cloud-elastic: the worker's Ray actor died: {first}")
        return ExitStatus(-9)

    def _finish(self, status: ExitStatus) -> None:
        self._status = status
        self._done.set()
        # The actor's process holds the worker library's state; never reuse it.
        self._kill_actor()

    def _kill_actor(self) -> None:
        try:
            require_ray().kill(self._actor, no_restart=True)
        except Exception:  # already dead, or Ray is shutting down: nothing left to stop
            log.debug("ray.kill of %s failed", self.spec.worker_id, exc_info=True)

    def poll(self) -> ExitStatus | None:
        """The exit status once the actor's call ended, else ``None``. Never blocks."""
        return self._status if self._done.is_set() else None

    def terminate(self, grace_s: float = 5.0) -> None:
        """TERM a command's worker, wait up to ``grace_s``, then kill the actor. Idempotent; blocks up to grace_s."""
        if self._done.is_set():
            return
        if self._owner.payload is None:
            try:
                self._actor.order.remote(f"TERM {grace_s:g}")
            except Exception:  # the actor is gone: the kill below is a no-op then
                log.debug("TERM order to %s failed", self.spec.worker_id, exc_info=True)
        if not self._done.wait(grace_s):
            self.kill()
            self._done.wait(5.0)

    def kill(self) -> None:
        """Kill the actor (and with it a command's whole process group); return at once. Idempotent."""
        self._killed = True
        self._kill_actor()


class RayLauncher:
    """Starts each worker as a Ray actor on the node its host key names (see module docstring).

    ``payload`` is the training function for :class:`~cloud_elastic.ray.ElasticRayExecutor`;
    ``None`` runs each spec's command instead (:func:`~cloud_elastic.ray.build_ray_run`).
    Results and errors of training functions are collected for the caller.
    """

    def __init__(
        self,
        payload: FunctionPayload | None = None,
        *,
        use_gpu: bool = False,
        cpus_per_slot: float = 1.0,
        gpus_per_slot: float = 1.0,
        terminate_grace_s: float = 5.0,
    ) -> None:
        self.payload = payload
        self.use_gpu = use_gpu
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot
        self.terminate_grace_s = terminate_grace_s
        self._lock = threading.Lock()
        self._results: list[WorkerResult] = []
        self._errors: list[tuple[str, BaseException]] = []
        self._fn_ref: Any = None
        self._actor_cls: Any = None

    @property
    def results(self) -> list[WorkerResult]:
        """Results of the workers whose training function returned, in the order they returned."""
        with self._lock:
            return list(self._results)

    @property
    def errors(self) -> list[tuple[str, BaseException]]:
        """``(worker id, Ray's task error)`` of each training function that raised, in order."""
        with self._lock:
            return list(self._errors)

    def _record_result(self, result: WorkerResult) -> None:
        with self._lock:
            self._results.append(result)

    def _record_error(self, worker_id: str, exc: BaseException) -> None:
        with self._lock:
            self._errors.append((worker_id, exc))

    def launch(self, spec: WorkerSpec, on_output: OutputSink) -> RayWorker:
        """Submit the worker's actor pinned to node ``spec.host``; return at once."""
        ray = require_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from cloud_elastic.ray.actor import WorkerActor

        try:
            if self._actor_cls is None:
                self._actor_cls = ray.remote(WorkerActor)
            if self.payload is not None and self._fn_ref is None:
                self._fn_ref = ray.put(self.payload.fn)  # serialised once, shared by every worker
            actor = self._actor_cls.options(
                num_cpus=self.cpus_per_slot,
                num_gpus=self.gpus_per_slot if self.use_gpu else 0,
                max_concurrency=2,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_for(spec.host), soft=False),
            ).remote()
            env = dict(spec.env)
            if not self.use_gpu:
                # Ray leaves an actor without GPUs every GPU of its node (it no longer clears the variable):
                # the worker would take NCCL and cuda:<slot>, on GPUs Ray gave to others.
                env.setdefault("CUDA_VISIBLE_DEVICES", "")
            if self.payload is not None:
                ref = actor.run_function.remote(
                    env, spec.secret, self._fn_ref, tuple(self.payload.args), dict(self.payload.kwargs), self.use_gpu
                )
            else:
                ref = actor.run_command.remote(
                    env, spec.secret, spec.cwd, tuple(spec.command), self.terminate_grace_s, self.use_gpu
                )
        except Exception as exc:  # Ray not connected, a bad node id, a payload Ray cannot serialise
            raise LaunchError(f"cannot start {spec.worker_id} as a Ray actor on node {spec.host}: {exc}") from exc
        return RayWorker(spec, actor, ref, on_output, self)

    def close(self) -> None:
        """Nothing to release: the driver stops every worker before closing its launcher."""


#: A Ray node id: 28 bytes, in hex.
_NODE_ID = re.compile(r"[0-9a-f]{56}")


def node_for(host: str) -> str:
    """The id of the alive node ``host`` names (RayHostDiscovery's hosts are node ids already); ConfigError
    when it names none."""
    if _NODE_ID.fullmatch(host):
        return host
    node = ray_node_id(host, require_ray().nodes())
    if node is None:
        raise ConfigError(f"host {host!r} is no alive node of this Ray cluster (name hosts by Ray node id, "
                          f"IP address or hostname)")
    return node


def ray_node_id(host: str, nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """The id of the alive node of ``nodes`` (``ray.nodes()``) that ``host`` names by node id, IP address or
    hostname; None when none does. ConfigError when it names several (nodes sharing an address, as on one
    machine): only their node ids tell them apart."""
    alive = [n for n in nodes if n.get("Alive")]
    if any(n.get("NodeID") == host for n in alive):
        return host
    named = [str(n["NodeID"]) for n in alive if host in (n.get("NodeManagerAddress"), n.get("NodeManagerHostname"))]
    if len(named) > 1:
        raise ConfigError(f"host {host!r} names {len(named)} Ray nodes; name them by node id")
    return named[0] if named else None
