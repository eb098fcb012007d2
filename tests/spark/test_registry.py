"""The Spark task registry and its helpers, over real HTTP where a socket is involved (no Spark needed)."""

from __future__ import annotations

import pytest

from cloud_elastic.control import Codec
from cloud_elastic.errors import ConfigError, ControlPlaneError
from cloud_elastic.spark import spark_defaults
from cloud_elastic.spark.discovery import SparkTaskDiscovery
from cloud_elastic.spark.registry import TaskRegistry, seal, unseal
from cloud_elastic.worker.client import DriverClient

pytestmark = pytest.mark.timeout(60)


def test_sizes_default_from_the_spark_configuration_as_horovod_did():
    dyn = {"spark.dynamicAllocation.minExecutors": "2", "spark.dynamicAllocation.maxExecutors": "8",
           "spark.dynamicAllocation.initialExecutors": "4"}
    assert spark_defaults(dyn, 16, None, None, None) == (4, 2, 8)
    assert spark_defaults({"spark.dynamicAllocation.minExecutors": "3"}, 16, None, None, None) == (3, 3, 3)
    assert spark_defaults({}, 6, None, None, None) == (6, 6, 6)
    assert spark_defaults(dyn, 16, 5, 1, 9) == (5, 1, 9)
    with pytest.raises(ConfigError, match="spark.dynamicAllocation.maxExecutors must be an integer"):
        spark_defaults({"spark.dynamicAllocation.maxExecutors": "many"}, 2, None, None, None)


def test_a_sealed_secret_opens_only_under_its_key_and_does_not_show_in_clear():
    sealed = seal("k1", "the-job-secret")
    assert b"the-job-secret".hex() not in sealed
    assert unseal("k1", sealed) == "the-job-secret"
    assert seal("k1", "the-job-secret") != sealed  # a fresh nonce every time
    with pytest.raises(ValueError, match="does not verify"):
        unseal("k2", sealed)


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
        assert registry.entry(key).exit_code == -9
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
