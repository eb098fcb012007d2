"""``run_elastic``: an elastic job whose workers run beside the tasks of a Spark stage.

As in Horovod's elastic Spark runner: the job starts ``max_np`` Spark tasks;
each registers its executor with the driver's task registry; the driver (the
one of ``cloud-elastic run``) launches workers on registered tasks; a task
whose worker fails raises, Spark retries it (possibly elsewhere) and the retry
is admitted as new capacity; tasks still queued when training ends exit at once.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from cloud_elastic.config import JobConfig
from cloud_elastic.errors import ConfigError, JobFailed
from cloud_elastic.spark._deps import require_pyspark

__all__ = ["run_elastic", "spark_defaults"]

log = logging.getLogger(__name__)

#: Horovod's variable for ``start_timeout``'s default on Spark (its ``run_elastic`` reads it too).
ENV_START_TIMEOUT = "HOROVOD_SPARK_START_TIMEOUT"


def _conf_int(conf: Any, name: str) -> int | None:
    raw = conf.get(name, None)
    try:
        return int(raw) if raw not in (None, "") else None
    except ValueError:
        raise ConfigError(f"Spark configuration {name} must be an integer, got {raw!r}") from None


def spark_defaults(conf: Any, default_parallelism: int,
                   num_proc: int | None, min_np: int | None, max_np: int | None) -> tuple[int, int, int]:
    """``(num_proc, min_np, max_np)`` with the gaps filled from the Spark configuration.

    With ``spark.dynamicAllocation.enabled`` true, ``num_proc``: ``initialExecutors``, else
    ``minExecutors``, else ``spark.default.parallelism``, moved into ``[min_np, max_np]`` (a
    default, so ``min_np=1, max_np=2`` on ``local[4]`` starts 2); ``min_np``: ``minExecutors``,
    else ``num_proc``; ``max_np``: ``maxExecutors``, else ``num_proc``. Without it, as in Horovod,
    ``num_proc`` is ``spark.default.parallelism`` and both bounds ``num_proc``: the executor
    counts of a switched-off dynamic allocation say nothing about this job's size (a fixed-size
    job would grow to ``maxExecutors`` workers). Reading them at all is cloud-elastic's own rule;
    Horovod never did. ConfigError, in these arguments' names, when the sizes cannot go together.
    """
    dyn_min = dyn_max = dyn_initial = None
    if str(conf.get("spark.dynamicAllocation.enabled", None) or "false").strip().lower() == "true":
        dyn_min = _conf_int(conf, "spark.dynamicAllocation.minExecutors")
        dyn_max = _conf_int(conf, "spark.dynamicAllocation.maxExecutors")
        dyn_initial = _conf_int(conf, "spark.dynamicAllocation.initialExecutors")
    if num_proc is None:
        num_proc = dyn_initial or dyn_min or default_parallelism
        low, high = dyn_min if min_np is None else min_np, dyn_max if max_np is None else max_np
        num_proc = max(num_proc if high is None else min(num_proc, high), low or 1)
    if min_np is None:
        min_np = dyn_min or num_proc
    if max_np is None:
        max_np = dyn_max or num_proc
    _check_sizes(num_proc, min_np, max_np)
    return num_proc, min_np, max_np


def _check_sizes(num_proc: int, min_np: int, max_np: int) -> None:
    """The CLI's size checks (``JobConfig``'s), said in ``run_elastic``'s argument names."""
    where = " (sizes not passed come from the Spark configuration: see spark_defaults)"
    if min_np < 1:
        raise ConfigError(f"min_np ({min_np}) must be >= 1")
    if max_np < min_np:
        raise ConfigError(f"max_np ({max_np}) must be >= min_np ({min_np}){where}")
    if not min_np <= num_proc <= max_np:
        raise ConfigError(f"num_proc ({num_proc}) must lie between min_np ({min_np}) and max_np ({max_np}){where}")


def run_elastic(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
    start_timeout: float | None = None,
    elastic_timeout: float | None = None,
    reset_limit: int | None = None,
    env: Mapping[str, str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    verbose: bool = False,
    nics: str | Collection[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    *,
    cooldown_range: tuple[float, float] | None = None,
    spark_context: Any = None,
    checkpoint_dir: str | None = None,
    heartbeat_timeout: float = 5.0,
    discovery_interval: float = 1.0,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` elastically on Spark; return the values of the final round, in rank order.

    The arguments up to ``prefix_output_with_timestamp`` are Horovod's, in its order. Uses the active
    SparkContext (or ``spark_context``). Missing sizes come from the Spark configuration
    (:func:`spark_defaults`). ``start_timeout`` and ``elastic_timeout`` of None are Horovod's defaults
    (``$HOROVOD_SPARK_START_TIMEOUT``, ``$HOROVOD_ELASTIC_TIMEOUT``, else 600 s); ``cooldown_range`` of None
    is 1 to 10 s. ``nics`` (one interface) is the CLI's ``--network-interface``; ``stdout``, ``stderr`` and
    ``prefix_output_with_timestamp`` are accepted and ignored with a warning (workers print to the executor
    logs). ``checkpoint_dir``, ``heartbeat_timeout`` (also how long a silent task counts as alive),
    ``discovery_interval`` and ``verbose`` are the CLI's ``--checkpoint-dir``, ``--heartbeat-timeout``,
    ``--discovery-interval`` and ``--verbose``.
    Raises :class:`JobFailed` with the driver's reason when the job fails (and, when it names
    a worker whose training function raised, that exception's one-line summary; when the
    Spark job failed, Spark's error is the ``__cause__``), and ConfigError for bad sizes.
    """
    from cloud_elastic.config import elastic_timeout_default
    from cloud_elastic.worker.settings import check_environ

    interface = _interface(nics)
    _ignored(stdout=stdout, stderr=stderr, prefix_output_with_timestamp=prefix_output_with_timestamp)
    # A bad worker setting in env, what `cloud-elastic run -x` refuses, refused before Spark runs a task: every
    # worker would fail at init() (its environment is the executor's, with env over it, not this process's).
    check_environ({}, dict(env or {}), checkpointing=checkpoint_dir is not None)
    pyspark = require_pyspark()
    sc = spark_context or pyspark.SparkContext._active_spark_context
    if sc is None:
        raise ConfigError("no active SparkContext: create a SparkSession (or pass spark_context=) first")
    num_proc, min_np, max_np = spark_defaults(sc.getConf(), sc.defaultParallelism, num_proc, min_np, max_np)
    address = _driver_address(sc)
    bind = "127.0.0.1" if address.startswith("127.") else "0.0.0.0"
    config = JobConfig(
        command=("<spark task>", getattr(fn, "__qualname__", type(fn).__name__)),  # a label: tasks run fn
        num_proc=num_proc, min_np=min_np, max_np=max_np,
        elastic_timeout_s=elastic_timeout_default() if elastic_timeout is None else elastic_timeout,
        start_timeout_s=_start_timeout_default() if start_timeout is None else start_timeout,
        reset_limit=reset_limit, cooldown_range_s=(1.0, 10.0) if cooldown_range is None else tuple(cooldown_range),
        driver_address=address, notice_watcher="none", verbose=bool(verbose), checkpoint_dir=checkpoint_dir,
        heartbeat_timeout_s=heartbeat_timeout, discovery_interval_s=discovery_interval, network_interface=interface,
        forward_env=tuple(f"{k}={v}" for k, v in (env or {}).items()),
    )
    from cloud_elastic.driver.runtime.driver import Driver
    from cloud_elastic.ray.executor import named_error, verbose_logging  # Ray's run(): same driver, same API
    from cloud_elastic.spark.discovery import SparkTaskDiscovery
    from cloud_elastic.spark.launcher import SparkTaskLauncher
    from cloud_elastic.spark.registry import TaskRegistry
    from cloud_elastic.spark.task import TaskSettings, partition_fn

    job_id = secrets.token_hex(4)
    registry = TaskRegistry(job_id, bind=bind, stale_s=config.heartbeat_timeout_s)
    registry.start()
    settings = TaskSettings(
        registry=f"{address}:{registry.port}", registry_key=registry.key, job_id=job_id,
        fn=fn, args=tuple(args), kwargs=dict(kwargs or {}), grace_s=config.terminate_grace_s,
    )
    group = f"cloud-elastic-{job_id}"
    collected: dict[str, Any] = {}
    driver = Driver(config, SparkTaskDiscovery(registry), job_id=job_id, launcher=SparkTaskLauncher(registry))

    def stage() -> None:
        try:
            sc.setJobGroup(group, f"cloud-elastic elastic job {job_id}", interruptOnCancel=True)
            rdd = sc.parallelize(range(max_np), max_np).mapPartitionsWithIndex(partition_fn(settings))
            collected["rows"] = rdd.collect()
        except Exception as exc:  # the Spark job failed or was cancelled: no task will come back
            collected["error"] = exc
            collected["reason"] = f"the Spark job failed: {spark_error(exc)[:300]}"
            driver.stop(collected["reason"], 1)

    spark_thread = threading.Thread(target=stage, name=f"spark-{job_id}", daemon=True)
    spark_thread.start()
    idle = False
    try:
        with verbose_logging(verbose):
            finish = driver.run()
        registry.finish()  # queued and polling tasks exit now
        idle = not wait_for_stage(sc, group, spark_thread)
    finally:
        # Also when driver.run() raised: no task may keep its executor's slot (or its worker) after we return.
        registry.finish()
        if spark_thread.is_alive():
            why = f" (none ran for {STAGE_IDLE_S:g}s: no executor free for those still queued?)" if idle else ""
            log.warning("job %s: Spark tasks did not end with training%s; cancelling them", job_id, why)
            sc.cancelJobGroup(group)
            spark_thread.join(30.0)
        registry.close()
    if not finish.success:
        error = named_error(finish.reason, registry.errors())
        reason = f"{finish.reason} ({error})" if error else finish.reason
        spark_failed = finish.reason == collected.get("reason")
        raise JobFailed(reason, finish.exit_code) from (collected["error"] if spark_failed else None)
    if "rows" not in collected:
        error = collected.get("error")
        why = spark_error(error) if error is not None else "its stage did not end"
        raise JobFailed(f"training finished but the Spark job failed: {why}") from error
    rows = sorted(collected["rows"], key=lambda r: (r[0] is None, r[0] if r[0] is not None else 0))
    return [_loaded(rank, data) for rank, data in rows]


#: Once training has ended, how long the job's Spark stage may go on with none of its tasks running before it is
#: cancelled: what is left then are tasks Spark keeps queued for want of an executor, which would hold
#: ``run_elastic`` forever. A running task is handing its value back (a large state_dict takes what it takes) or
#: exiting, and is waited for however long that lasts: cancelling it failed a job whose training had succeeded.
STAGE_IDLE_S = 30.0


def wait_for_stage(sc: Any, group: str, thread: threading.Thread, idle_s: float | None = None) -> bool:
    """Wait for the Spark ``thread`` running job group ``group``'s stage to end; True when it ended, False when it
    had no running task for ``idle_s`` (default :data:`STAGE_IDLE_S`). Without Spark's status tracker every task
    counts as idle."""
    idle_s = STAGE_IDLE_S if idle_s is None else idle_s
    idle_since = time.monotonic()
    while True:
        thread.join(min(1.0, idle_s))
        if not thread.is_alive():
            return True
        if _running_tasks(sc, group):
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= idle_s:
            return False


def _running_tasks(sc: Any, group: str) -> int:
    """How many tasks of job group ``group`` run now, as Spark's status tracker sees them (0 when it cannot tell).
    A task counts until its value has reached this driver."""
    try:
        tracker = sc.statusTracker()
        running = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                running += stage.numActiveTasks if stage is not None else 0
        return running
    except Exception:  # a SparkContext without a tracker (a stand-in), or one stopping
        return 0


def _loaded(rank: int | None, data: bytes) -> Any:
    """The value rank ``rank`` returned, from the bytes its worker pickled: unpickled here, once (the task hands
    them on untouched, so loading a large value costs the executor nothing and the stage no time)."""
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise JobFailed(f"training finished, but the value rank {rank} returned cannot be unpickled in this process: "
                        f"{type(exc).__name__}: {exc}"[:500]) from exc


def _start_timeout_default() -> float:
    """Horovod's default ``start_timeout``: ``$HOROVOD_SPARK_START_TIMEOUT``, else 600 s."""
    raw = os.environ.get(ENV_START_TIMEOUT)
    if not raw:
        return 600.0
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {ENV_START_TIMEOUT} must be a number of seconds, "
                          f"got {raw!r}") from None


def _interface(nics: str | Collection[str] | None) -> str | None:
    """Horovod's ``nics`` as ``--network-interface``: the one interface Gloo (and NCCL) use on the workers."""
    if not nics:
        return None
    names = [nics] if isinstance(nics, str) else sorted(str(n) for n in nics)
    if len(names) > 1:
        raise ConfigError(f"nics={names!r}: the workers use one network interface (the CLI's --network-interface); "
                          "pass one name")
    return names[0]


def _ignored(**given: Any) -> None:
    """One warning line for each of Horovod's output arguments given: a worker's output is in its executor's log."""
    for name, value in given.items():
        if value not in (None, False):
            log.warning("run_elastic(%s=...) is ignored: workers print to their Spark executor's log, which "
                        "cloud-elastic does not forward to this process", name)


def spark_error(exc: BaseException) -> str:
    """The line that says what went wrong in a Spark job's error: the last exception of the Python
    traceback it carries (a task's ``ModuleNotFoundError``), not PySpark's preamble; else its first line."""
    lines = str(exc).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().endswith("Traceback (most recent call last):")]
    if starts:
        # The frames are indented; the exception is the first line after them that is not.
        found = next((line for line in lines[starts[-1] + 1:] if line.strip() and not line[0].isspace()), None)
        if found is not None:
            return found.strip()
    return next((line.strip() for line in lines if line.strip()), type(exc).__name__)


def _driver_address(sc: Any) -> str:
    """The address executors reach this process at: ``spark.driver.host``, as an IP."""
    host = sc.getConf().get("spark.driver.host", None) or socket.gethostname()
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host
