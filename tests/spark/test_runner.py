"""``run_elastic``'s own bookkeeping around the driver, with stand-ins for Spark and the driver (no JVM)."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.timeout(60)


class _FakeSpark:
    """The few SparkContext calls run_elastic makes; the stage runs until its job group is cancelled."""

    defaultParallelism = 1

    def __init__(self) -> None:
        self.groups: list[str] = []
        self.cancelled: list[str] = []
        self._cancel = threading.Event()

    def getConf(self):
        return {"spark.driver.host": "127.0.0.1"}

    def setJobGroup(self, group, description, interruptOnCancel=False):
        self.groups.append(group)

    def parallelize(self, data, slices):
        return self

    def mapPartitionsWithIndex(self, fn):
        return self

    def collect(self):
        self._cancel.wait(30)
        raise RuntimeError("job group cancelled")

    def cancelJobGroup(self, group):
        self.cancelled.append(group)
        self._cancel.set()


class _RaisingDriver:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def run(self):
        raise RuntimeError("the driver broke")

    def stop(self, reason, code) -> None:
        pass


def test_the_spark_stage_is_cancelled_when_the_driver_raises(monkeypatch):
    pytest.importorskip("pyspark", reason="run_elastic needs PySpark installed")
    import cloud_elastic.driver.runtime.driver as driver_module
    from cloud_elastic.spark import run_elastic

    monkeypatch.setattr(driver_module, "Driver", _RaisingDriver)
    sc = _FakeSpark()
    with pytest.raises(RuntimeError, match="the driver broke"):
        run_elastic(len, num_proc=1, min_np=1, max_np=1, spark_context=sc)
    # Its tasks would otherwise keep their executors' slots (and their workers) after run_elastic raised.
    assert sc.cancelled == sc.groups and len(sc.groups) == 1
