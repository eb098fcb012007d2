"""``SparkTaskLauncher``: starts each worker inside the Spark task its host key names.

The launcher queues orders in the :class:`~cloud_elastic.spark.registry.TaskRegistry`,
which answers the task's held poll with them at once; the task runs the
worker through the SSH launcher's wrapper (:mod:`cloud_elastic.driver.launch.ssh_remote`),
which gives the worker its own process group and stops it when the task ends.

Launcher guarantees (:mod:`cloud_elastic.driver.launch.api`) as they hold here:
``launch``, ``poll`` and ``kill`` return at once; ``terminate`` sends TERM,
waits up to the grace, then KILL. The secret and the worker's environment
travel sealed under the registry key (:func:`~cloud_elastic.spark.registry.seal`);
``TERM``/``KILL`` name their worker, so one meant for a worker that already
left never reaches the next worker of the same task. A task that stops
polling (its executor died) makes ``poll`` report a transport error; the
driver's worker heartbeats usually notice first. Workers' output goes to the
Spark executors' stdout (the executor logs), not to ``on_output``.
"""

from __future__ import annotations

import json
import threading
import time

from cloud_elastic.driver.launch.api import ExitStatus, OutputSink, WorkerSpec
from cloud_elastic.errors import LaunchError
from cloud_elastic.spark.registry import TaskRegistry, seal

__all__ = ["SparkTaskLauncher", "SparkWorker"]


class SparkWorker:
    """A worker running in a Spark task (the ``WorkerProcess`` protocol)."""

    def __init__(self, spec: WorkerSpec, registry: TaskRegistry) -> None:
        self.spec = spec
        self._registry = registry
        self._lock = threading.Lock()

    def poll(self) -> ExitStatus | None:
        code = self._registry.exit_code(self.spec.host, self.spec.worker_id)
        if code is not None:
            return ExitStatus(code)
        if self._registry.is_stale(self.spec.host):
            return ExitStatus(255, transport_error=f"spark task {self.spec.host} stopped polling (executor lost?)")
        return None

    def terminate(self, grace_s: float = 5.0) -> None:
        with self._lock:
            if self.poll() is not None:
                return
            self._registry.order(self.spec.host, {"order": "TERM", "grace_s": grace_s,
                                                  "worker_id": self.spec.worker_id})
            deadline = time.monotonic() + grace_s + 2.0  # the task needs a poll to pick the order up
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.poll() is None:
                self.kill()

    def kill(self) -> None:
        self._registry.order(self.spec.host, {"order": "KILL", "worker_id": self.spec.worker_id})


class SparkTaskLauncher:
    """Starts workers in registered Spark tasks (host key = task key)."""

    def __init__(self, registry: TaskRegistry) -> None:
        self._registry = registry

    def launch(self, spec: WorkerSpec, on_output: OutputSink) -> SparkWorker:
        order = {
            "order": "start", "worker_id": spec.worker_id,
            "env": seal(self._registry.key, json.dumps(dict(spec.env))),  # may hold the user's tokens
            "secret": seal(self._registry.key, spec.secret), "cwd": spec.cwd,
        }
        if self._registry.is_stale(spec.host) or not self._registry.order(spec.host, order):
            raise LaunchError(f"spark task {spec.host} is gone; cannot start {spec.worker_id} there")
        return SparkWorker(spec, self._registry)

    def close(self) -> None:
        pass
