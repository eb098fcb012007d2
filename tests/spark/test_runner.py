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


class _FailingSpark(_FakeSpark):
    """A Spark whose stage fails at once with ``error``, as when no task can unpickle the training function."""

    defaultParallelism = 4

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.error = error

    def collect(self):
        if self.error is None:
            return []  # every task returned nothing
        raise self.error


def _driver(monkeypatch, finish=None, on_run=None):
    """Put in a driver that records its config and, after ``on_run(driver)``, ends as ``finish`` says, or
    (``finish=None``) with the reason it was stopped with. Returns the list the drivers made go to."""
    import cloud_elastic.driver.runtime.driver as driver_module
    from cloud_elastic.driver.job.actions import Finish

    made = []

    class Driver:
        def __init__(self, config, discovery, *, job_id, launcher) -> None:
            self.config, self.launcher = config, launcher
            self._stopped: list = []
            self._event = threading.Event()
            made.append(self)

        def run(self):
            if on_run is not None:
                on_run(self)
            if finish is not None:
                return finish
            assert self._event.wait(30), "never stopped"
            return Finish(False, *self._stopped[0])

        def stop(self, reason, code) -> None:
            self._stopped.append((reason, code))
            self._event.set()

    monkeypatch.setattr(driver_module, "Driver", Driver)
    return made


_PYTHON_WORKER_ERROR = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/site-packages/pyspark/worker_util.py", line 75, in read_command
    command = serializer.loads(file)
              ^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'mytrain'
"""


def test_a_failed_spark_stage_says_what_failed_in_the_task_and_is_the_cause(monkeypatch):
    pytest.importorskip("pyspark", reason="run_elastic needs PySpark installed")
    from cloud_elastic.errors import JobFailed
    from cloud_elastic.spark import run_elastic

    _driver(monkeypatch)
    error = RuntimeError(_PYTHON_WORKER_ERROR)
    with pytest.raises(JobFailed) as failed:
        run_elastic(len, num_proc=1, min_np=1, max_np=1, spark_context=_FailingSpark(error))
    assert failed.value.reason == "the Spark job failed: ModuleNotFoundError: No module named 'mytrain'"
    assert failed.value.__cause__ is error  # with Spark's whole error and traceback


def test_a_failed_job_names_the_error_of_the_worker_its_reason_names_not_one_it_recovered_from(monkeypatch):
    pytest.importorskip("pyspark", reason="run_elastic needs PySpark installed")
    from cloud_elastic.driver.job.actions import Finish
    from cloud_elastic.errors import JobFailed
    from cloud_elastic.spark import run_elastic

    def workers_fail(driver) -> None:  # two tasks' workers report their errors, as tasks do over the wire
        registry = driver.launcher._registry
        for index, worker_id, error in [(0, "w-old", "the training function raised: MemoryError: at step 10"),
                                        (1, "w-last", "the training function raised: KeyError: 'label'")]:
            key = registry._handle("register", {"index": index, "attempt": 0, "ip": "127.0.0.1"})["key"]
            registry._handle("exited", {"key": key, "worker_id": worker_id, "code": 1, "error": error})

    reason = "all workers failed; last: worker w-last (rank 0 on h) exited with code 1"
    _driver(monkeypatch, Finish(False, reason, 1), workers_fail)
    with pytest.raises(JobFailed) as failed:
        run_elastic(len, num_proc=1, min_np=1, max_np=1, spark_context=_FailingSpark())
    assert failed.value.reason == f"{reason} (the training function raised: KeyError: 'label')"


def test_min_np_and_max_np_alone_move_the_default_num_proc_between_them(monkeypatch):
    pytest.importorskip("pyspark", reason="run_elastic needs PySpark installed")
    from cloud_elastic.driver.job.actions import Finish
    from cloud_elastic.errors import ConfigError, JobFailed
    from cloud_elastic.spark import run_elastic, spark_defaults

    made = _driver(monkeypatch, Finish(False, "stopped", 1))
    with pytest.raises(JobFailed):  # the stand-in driver ends at once; its config is what counts here
        run_elastic(len, min_np=1, max_np=2, spark_context=_FailingSpark())
    assert (made[0].config.num_proc, made[0].config.min_np, made[0].config.max_np) == (2, 1, 2)  # on local[4]
    assert spark_defaults({}, 1, None, 3, 5) == (3, 3, 5)
    with pytest.raises(ConfigError, match=r"^num_proc \(4\) must lie between min_np \(1\) and max_np \(2\)"):
        spark_defaults({}, 4, 4, 1, 2)
    with pytest.raises(ConfigError, match=r"^max_np \(1\) must be >= min_np \(2\)"):
        spark_defaults({}, 4, None, 2, 1)


def test_checkpoint_dir_and_the_drivers_other_settings_reach_the_driver_and_verbose_shows_its_log(
        monkeypatch, tmp_path, capsys):
    pytest.importorskip("pyspark", reason="run_elastic needs PySpark installed")
    import logging

    from cloud_elastic.driver.job.actions import Finish
    from cloud_elastic.errors import JobFailed
    from cloud_elastic.spark import run_elastic

    def log_a_round(driver) -> None:
        logging.getLogger("cloud_elastic.driver.runtime.driver").debug("round 1: 1 worker")

    made = _driver(monkeypatch, Finish(False, "stopped", 1), log_a_round)
    logger = logging.getLogger("cloud_elastic")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", False)
    with pytest.raises(JobFailed):
        run_elastic(len, num_proc=1, min_np=1, max_np=1, spark_context=_FailingSpark(),
                    checkpoint_dir=str(tmp_path), heartbeat_timeout=9.0, discovery_interval=2.0, verbose=True)
    config = made[0].config
    assert (config.checkpoint_dir, config.heartbeat_timeout_s, config.discovery_interval_s) == (str(tmp_path), 9.0, 2.0)
    assert "cloud-elastic: round 1: 1 worker" in capsys.readouterr().err


class _ReturningSpark(_FailingSpark):
    """A Spark whose stage hands back ``rows`` after ``busy_s``, its one task running meanwhile (as a task handing
    a large value back is), or, with ``running=False``, a stage whose queued tasks Spark never runs."""

    def __init__(self, rows, busy_s: float, running: bool = True) -> None:
        super().__init__()
        self.rows, self.busy_s, self.running = rows, busy_s, running

    def collect(self):
        if self._cancel.wait(self.busy_s):
            raise RuntimeError("job group cancelled")
        return self.rows

    def statusTracker(self):
        import types

        running = 1 if self.running and not self._cancel.is_set() else 0
        return types.SimpleNamespace(
            getJobIdsForGroup=lambda group: [7] if group in self.groups else [],
            getJobInfo=lambda job: types.SimpleNamespace(stageIds=[3]),
            getStageInfo=lambda stage: types.SimpleNamespace(numActiveTasks=running))


def test_after_training_a_stage_whose_tasks_still_run_is_waited_for_and_one_left_idle_is_cancelled(monkeypatch):
    pytest.importorskip("pyspark", reason="run_elastic needs PySpark installed")
    import pickle

    from cloud_elastic.driver.job.actions import Finish
    from cloud_elastic.errors import JobFailed
    from cloud_elastic.spark import run_elastic, runner

    monkeypatch.setattr(runner, "STAGE_IDLE_S", 0.3)
    _driver(monkeypatch, Finish(True, "training completed", 0))
    # Tasks handing their values back (a large state_dict) for longer than the idle limit: waited for, not
    # cancelled (that failed a job whose training had succeeded); the values, as the workers pickled them,
    # are unpickled here, in rank order.
    sc = _ReturningSpark([(1, pickle.dumps("b")), (0, pickle.dumps("a"))], busy_s=1.5)
    assert run_elastic(len, num_proc=2, min_np=2, max_np=2, spark_context=sc) == ["a", "b"]
    assert sc.cancelled == []
    # Tasks Spark keeps queued (no executor for them) and none running: cancelled once idle that long.
    sc = _ReturningSpark([], busy_s=30.0, running=False)
    with pytest.raises(JobFailed, match="training finished but the Spark job failed: job group cancelled"):
        run_elastic(len, num_proc=1, min_np=1, max_np=1, spark_context=sc)
    assert sc.cancelled == sc.groups


def test_horovods_run_elastic_arguments_are_taken_in_its_order_with_its_defaults(monkeypatch, caplog):
    pytest.importorskip("pyspark", reason="run_elastic needs PySpark installed")
    from cloud_elastic.driver.job.actions import Finish
    from cloud_elastic.errors import ConfigError, JobFailed
    from cloud_elastic.spark import run_elastic

    made = _driver(monkeypatch, Finish(False, "stopped", 1))
    monkeypatch.delenv("HOROVOD_ELASTIC_TIMEOUT", raising=False)
    monkeypatch.delenv("CLOUD_ELASTIC_ELASTIC_TIMEOUT", raising=False)
    monkeypatch.setenv("HOROVOD_SPARK_START_TIMEOUT", "45")
    caplog.set_level("WARNING", logger="cloud_elastic.spark")
    # Horovod's signature: fn, args, kwargs, num_proc, min_np, max_np, start_timeout, elastic_timeout,
    # reset_limit, env, stdout, stderr, verbose, nics, prefix_output_with_timestamp.
    with pytest.raises(JobFailed):
        run_elastic(len, (), {}, 1, 1, 1, 30, 90, 3, {"A": "1"}, spark_context=_FailingSpark())
    config = made[-1].config
    assert (config.start_timeout_s, config.elastic_timeout_s, config.reset_limit) == (30, 90, 3)
    assert config.forward_env == ("A=1",)
    # None is Horovod's default (its variables, else 600 s), not a ConfigError naming the CLI's flags.
    with pytest.raises(JobFailed):
        run_elastic(len, num_proc=1, min_np=1, max_np=1, start_timeout=None, elastic_timeout=None,
                    cooldown_range=None, nics=["eth9"], stdout=None, stderr=object(),
                    prefix_output_with_timestamp=True, verbose=1, spark_context=_FailingSpark())
    config = made[-1].config
    assert (config.start_timeout_s, config.elastic_timeout_s, config.cooldown_range_s) == (45, 600, (1.0, 10.0))
    assert config.network_interface == "eth9"  # --network-interface: Gloo and NCCL use it on the workers
    ignored = sorted(r.getMessage().split("(")[1].split("=")[0] for r in caplog.records
                     if "is ignored" in r.getMessage())
    assert ignored == ["prefix_output_with_timestamp", "stderr"], caplog.text
    with pytest.raises(ConfigError, match=r"^nics=\['eth0', 'eth1'\]: the workers use one network interface"):
        run_elastic(len, num_proc=1, nics={"eth0", "eth1"}, spark_context=_FailingSpark())
