"""The Spark task registry and its helpers, over real HTTP where a socket is involved (no Spark needed)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from cloud_elastic.control import Codec
from cloud_elastic.driver.launch.api import WorkerSpec
from cloud_elastic.errors import ConfigError, ControlPlaneError
from cloud_elastic.spark import spark_defaults
from cloud_elastic.spark.discovery import SparkTaskDiscovery
from cloud_elastic.spark.launcher import SparkTaskLauncher
from cloud_elastic.spark.registry import ORDER_POLL_S, TaskRegistry, seal, unseal
from cloud_elastic.worker.link.client import DriverClient

pytestmark = pytest.mark.timeout(60)


def test_sizes_default_from_the_dynamic_allocation_settings_only_when_it_is_enabled():
    on = {"spark.dynamicAllocation.enabled": "true"}
    dyn = {"spark.dynamicAllocation.minExecutors": "2", "spark.dynamicAllocation.maxExecutors": "8",
           "spark.dynamicAllocation.initialExecutors": "4"}
    assert spark_defaults({**on, **dyn}, 16, None, None, None) == (4, 2, 8)
    assert spark_defaults({**on, "spark.dynamicAllocation.minExecutors": "3"}, 16, None, None, None) == (3, 3, 3)
    assert spark_defaults({"spark.dynamicAllocation.enabled": " TRUE "}, 6, None, None, None) == (6, 6, 6)
    assert spark_defaults({**on, **dyn}, 16, 5, 1, 9) == (5, 1, 9)
    with pytest.raises(ConfigError, match="spark.dynamicAllocation.maxExecutors must be an integer"):
        spark_defaults({**on, "spark.dynamicAllocation.maxExecutors": "many"}, 2, None, None, None)
    # Switched off (Spark's default), its executor counts say nothing of this job: a fixed-size job stays at
    # num_proc workers, as in Horovod, instead of growing to maxExecutors (global batch and cost with it).
    off = {"spark.dynamicAllocation.enabled": "false", "spark.dynamicAllocation.minExecutors": "2",
           "spark.dynamicAllocation.maxExecutors": "50"}
    assert spark_defaults(off, 8, 4, None, None) == (4, 4, 4)
    assert spark_defaults({**dyn, "spark.dynamicAllocation.maxExecutors": "many"}, 6, None, None, None) == (6, 6, 6)


def test_a_sealed_secret_opens_only_under_its_key_and_does_not_show_in_clear():
    sealed = seal("k1", "the-job-secret")
    assert b"the-job-secret".hex() not in sealed
    assert unseal("k1", sealed) == "the-job-secret"
    assert seal("k1", "the-job-secret") != sealed  # a fresh nonce every time
    with pytest.raises(ValueError, match="does not verify"):
        unseal("k2", sealed)


def test_the_start_order_carries_the_worker_environment_sealed():
    registry = TaskRegistry("job1")
    registry.start()
    try:
        client = DriverClient(f"127.0.0.1:{registry.port}", Codec(registry.key, "job1"), "spark-task-0")
        key = client.call("register", {"index": 0, "attempt": 0, "ip": "127.0.0.1"})["key"]
        spec = WorkerSpec("w1", key, 0, ("x",), {"WANDB_API_KEY": "sk-live-123"}, "S" * 64, "/tmp")
        SparkTaskLauncher(registry).launch(spec, print)
        order = client.call("order", {"key": key})  # as anyone on the path reads it: signed, not encrypted
        assert order["order"] == "start"
        assert "sk-live-123" not in json.dumps(order) and "S" * 64 not in json.dumps(order)
    finally:
        registry.close()


def test_tasks_register_poll_get_orders_and_leave_discovery_when_their_worker_exits():
    registry = TaskRegistry("job1", stale_s=5.0)
    registry.start()
    try:
        client = DriverClient(f"127.0.0.1:{registry.port}", Codec(registry.key, "job1"), "spark-task-0")
        key = client.call("register", {"index": 0, "attempt": 1, "ip": "10.1.2.3"})["key"]
        assert key == "10.1.2.3/task0.1"
        discovery = SparkTaskDiscovery(registry)
        assert dict(discovery.find().ready) == {key: 1}
        assert client.call("order", {"key": key})["order"] == "none"
        registry.order(key, {"order": "start", "worker_id": "w1", "env": {}, "secret": "s", "cwd": "/"})
        assert client.call("order", {"key": key})["order"] == "start"
        client.call("exited", {"key": key, "code": -9})
        assert registry.exit_code(key, "w1") == -9
        assert dict(discovery.find().ready) == {}
        registry.finish()
        late = client.call("register", {"index": 1, "attempt": 0, "ip": "10.1.2.4"})
        assert late["order"] == "exit"  # queued tasks exit at once once training is over
    finally:
        registry.close()


def test_a_task_without_the_registry_key_is_refused():
    registry = TaskRegistry("job1")
    registry.start()
    try:
        stranger = DriverClient(f"127.0.0.1:{registry.port}", Codec("w" * 64, "job1"), "spark-task-0")
        with pytest.raises(ControlPlaneError, match="HTTP 401"):
            stranger.call("register", {"index": 0, "attempt": 0, "ip": "10.0.0.9"})
        assert registry.alive() == {}
    finally:
        registry.close()


class _PollingTask(threading.Thread):
    """A Spark task's side of the registry, as run_task does it: register, then poll for orders until exit."""

    def __init__(self, port: int, key: str, index: int, polled: threading.Condition) -> None:
        super().__init__(name=f"task-{index}", daemon=True)
        self._client = DriverClient(f"127.0.0.1:{port}", Codec(key, "job1"), f"spark-task-{index}")
        self._index = index
        self._polled = polled
        self.key: str | None = None
        self.registered = threading.Event()
        self.polls = 0
        self.news: dict[str, float] = {}  # order kind -> when it arrived
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.key = self._client.call("register", {"index": self._index, "attempt": 0, "ip": "10.0.0.1"})["key"]
            self.registered.set()
            while "exit" not in self.news:
                kind = self._client.call("order", {"key": self.key})["order"]
                with self._polled:
                    self.polls += 1
                    if kind != "none":
                        self.news[kind] = time.monotonic()
                    self._polled.notify_all()
        except BaseException as exc:  # handed to the test
            self.error = exc
            self.registered.set()
        finally:
            self._client.close()


def test_sixteen_idle_tasks_polling_at_once_register_promptly_stay_alive_and_hear_orders_at_once():
    # The control-plane server answers every connection from one thread: a poll that waited
    # in the handler queued the others behind it, and idle tasks were declared dead.
    registry = TaskRegistry("job1")  # the default stale_s (5 s), as run_elastic uses it
    registry.start()
    polled = threading.Condition()
    tasks = [_PollingTask(registry.port, registry.key, i, polled) for i in range(16)]
    try:
        started = time.monotonic()
        for task in tasks:
            task.start()
        for task in tasks:
            assert task.registered.wait(max(0.0, started + 3.0 - time.monotonic())), "registration was not prompt"
            assert task.error is None, task.error
        keys = {task.key for task in tasks}
        discovery = SparkTaskDiscovery(registry)
        # Every task polls (idle) for longer than stale_s; none may look dead meanwhile.
        polls_needed = int(registry.stale_s / ORDER_POLL_S) + 2
        deadline = time.monotonic() + 30.0
        with polled:
            while min(task.polls for task in tasks) < polls_needed:
                assert time.monotonic() < deadline, f"polls: {[task.polls for task in tasks]}"
                assert set(discovery.find().ready) == keys, "a polling task was declared gone"
                assert not any(registry.is_stale(k) for k in keys), "a polling task was declared stale"
                polled.wait(0.1)
        assert all(task.error is None for task in tasks), [task.error for task in tasks]

        sent = time.monotonic()
        for i, task in enumerate(tasks):
            registry.order(task.key, {"order": "start", "worker_id": f"w{i}", "env": {}, "secret": "s", "cwd": "/"})
        registry.finish()
        for task in tasks:
            task.join(10.0)
            assert not task.is_alive() and task.error is None, task.error
        # Both answered a held poll at once, not at its deadline or after the others' polls.
        assert max(task.news["start"] for task in tasks) - sent < ORDER_POLL_S
        assert max(task.news["exit"] for task in tasks) - sent < 1.0
    finally:
        registry.close()
