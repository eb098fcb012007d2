"""The Spark task's side (``run_task``) with real wrapper and worker processes, against a real registry; no Spark.

The training functions are standard-library callables, so the worker imports
nothing of the tests; the task pickles them with PySpark's cloudpickle, so
PySpark must be installed (Java is not needed).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import operator
import os
import pickle
import signal
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloud_elastic.driver.launch.api import ExitStatus, WorkerSpec
from cloud_elastic.spark.launcher import SparkTaskLauncher
from cloud_elastic.spark.registry import TaskRegistry
from cloud_elastic.spark.task import TaskSettings, WorkerFailed, read_result, run_task, task_gpus, worker_env
from tests.ray.conftest import wait_for

pytestmark = pytest.mark.timeout(120)


def _ctx(addresses):
    """A stand-in for pyspark's TaskContext (which exists only inside a Spark task): the attributes read."""
    resources = {"gpu": SimpleNamespace(name="gpu", addresses=addresses)} if addresses is not None else {}
    return SimpleNamespace(resources=lambda: resources)


def test_each_worker_sees_only_the_gpus_spark_assigned_to_its_task():
    executor = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # the executor sees all its GPUs
    env = worker_env(executor, {"A": 1}, "10.0.0.5", task_gpus(_ctx(["2"])))
    assert env["CUDA_VISIBLE_DEVICES"] == "2"  # so the worker's cuda:0 (local rank 0) is GPU 2
    assert env["A"] == "1" and env["CLOUD_ELASTIC_HOSTNAME"] == "10.0.0.5"
    assert worker_env({}, {}, "ip", task_gpus(_ctx(["1", "3"])))["CUDA_VISIBLE_DEVICES"] == "1,3"
    # The user's own choice (env= of run_elastic) wins.
    assert worker_env({}, {"CUDA_VISIBLE_DEVICES": "7"}, "ip", ["2"])["CUDA_VISIBLE_DEVICES"] == "7"
    # No GPUs assigned (a CPU job, or Spark without GPU scheduling): the executor's environment stands.
    assert task_gpus(_ctx(None)) is None and task_gpus(_ctx([])) is None and task_gpus(None) is None
    assert worker_env(executor, {}, "ip", None)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "CUDA_VISIBLE_DEVICES" not in worker_env({}, {}, "ip", None)


@pytest.fixture
def task_tmp(tmp_path, monkeypatch):
    """The folder the task's temporary folders go to, so the test sees whether they are removed."""
    pytest.importorskip("pyspark", reason="the task pickles the function with PySpark's cloudpickle")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


class _Task:
    """``run_task`` on a thread, as a Spark task runs it, against a real registry."""

    def __init__(self, fn, args, kwargs=None, stale_s: float = 5.0) -> None:
        self.registry = TaskRegistry("job1", stale_s=stale_s)
        self.registry.start()
        self.settings = TaskSettings(f"127.0.0.1:{self.registry.port}", self.registry.key, "job1", fn, args,
                                     kwargs or {})
        self.outcome: dict = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.key = next(iter(wait_for(self.registry.alive, 30, "the task registering")))
        self.launcher = SparkTaskLauncher(self.registry)

    def _run(self) -> None:
        try:
            self.outcome["rows"] = run_task(self.settings, 0, 0)
        except BaseException as exc:  # handed to the test
            self.outcome["error"] = exc

    def run_worker(self, worker_id: str) -> ExitStatus:
        worker = self.launcher.launch(WorkerSpec(worker_id, self.key, 0, ("x",), {}, "S" * 64, ""), print)
        return wait_for(worker.poll, 30, f"worker {worker_id} exiting")

    def end(self) -> dict:
        self.thread.join(30)
        assert not self.thread.is_alive(), "run_task did not return"
        self.registry.close()
        return self.outcome


def test_a_task_whose_worker_was_sent_away_keeps_its_slot_for_the_next_worker(task_tmp):
    task = _Task(sys.exit, (0,))  # what a worker the driver sends away does: exit 0, no result
    try:
        assert task.run_worker("w1") == ExitStatus(0)
        # Spark never reruns a partition that succeeded: the task must stay, or the job loses the slot for good.
        assert task.thread.is_alive() and task.key in task.registry.alive()
        assert task.run_worker("w2") == ExitStatus(0)
        assert task.key in task.registry.alive()
        task.registry.finish()  # training is over
    finally:
        outcome = task.end()
    assert outcome == {"rows": []}
    assert not list(task_tmp.glob("cloud-elastic-task-*")), "the task's folder was left behind"


def test_a_task_whose_function_returned_hands_the_value_back_leaves_and_removes_its_folder(task_tmp):
    task = _Task(operator.add, (2, 3))
    try:
        assert task.run_worker("w1") == ExitStatus(0)
    finally:
        outcome = task.end()
    # The value as the worker pickled it: unpickled once, by run_elastic on the driver, not here too.
    [(rank, data)] = outcome["rows"]
    assert (rank, pickle.loads(data)) == (None, 5)
    assert task.key not in task.registry.alive()
    assert not list(task_tmp.glob("cloud-elastic-task-*")), "the task's folder (function, result) was left behind"


class _SlowToPickle:
    """An argument that takes :data:`_PICKLE_S` to pickle (a dataset, a model) and loads as an empty dict (so the
    worker imports nothing of the tests)."""

    def __reduce__(self):
        time.sleep(_PICKLE_S)
        return (dict, ())


#: Longer than the registry's staleness limit in the test below (1.5 s), with room: a task that stops polling
#: while it pickles counts as gone.
_PICKLE_S = 3.0


def test_an_argument_slower_to_pickle_than_the_staleness_limit_does_not_lose_the_task(task_tmp):
    task = _Task(dict, (), {"data": _SlowToPickle()}, stale_s=1.5)
    try:
        # Pickled before the task registered, not when its worker was ordered to start: the task polls throughout.
        assert task.run_worker("w1") == ExitStatus(0)
    finally:
        outcome = task.end()
    [(rank, data)] = outcome["rows"]
    assert pickle.loads(data) == {"data": {}}


def _descendants(pid: int) -> set[int]:
    children: dict[int, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, set()).add(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _task_process(settings: TaskSettings) -> None:
    run_task(settings, 0, 0)


# A worker with a child of its own (a DataLoader's workers), which notes a SIGTERM and stays, as a worker inside
# elastic.run does (it reports its host as going). Run by ``exec``, so the worker imports nothing of the tests.
_WORKER = textwrap.dedent(r"""
    import os, signal, subprocess, sys, time
    out = {out!r}
    def note(line):
        with open(out, "a") as f:
            f.write(line + "\n")
    signal.signal(signal.SIGTERM, lambda *_: note("SIGTERM"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    note(f"pids {{os.getpid()}} {{child.pid}}")
    while True:
        time.sleep(0.2)
""")


def _worker_pids(out: Path) -> list[int]:
    lines = wait_for(lambda: out.exists() and out.read_text().splitlines(), 30, "the worker starting")
    return [int(pid) for pid in lines[0].split()[1:]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigterm_to_the_wrapper_fails_the_worker_and_its_children_at_once_never_passed_on(task_tmp):
    """Under Spark a SIGTERM reaches the wrapper when its task's process died (the kernel's parent-death signal),
    never because a host is going: a worker handed it would report its host as going, and the driver would
    drain a task that Spark never retries. The task raises instead, so Spark retries it."""
    out = task_tmp / "worker.out"
    task = _Task(exec, (_WORKER.format(out=str(out)), {}))
    pids: list[int] = []
    try:
        task.launcher.launch(WorkerSpec("w1", task.key, 0, ("x",), {}, "S" * 64, ""), print)
        pids = _worker_pids(out)
        wrapper = int(Path(f"/proc/{pids[0]}/stat").read_text().rpartition(")")[2].split()[1])
        os.kill(wrapper, signal.SIGTERM)
        wait_for(lambda: not any(_running(p) for p in pids), 30, "the worker and its child dying")
    finally:
        for pid in pids:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        outcome = task.end()
    assert "SIGTERM" not in out.read_text(), "the worker was told its host is going"
    assert isinstance(outcome.get("error"), WorkerFailed) and "exited with code -9" in str(outcome["error"]), outcome


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_worker_and_its_children_die_with_its_task(task_tmp):
    out = task_tmp / "worker.out"
    registry = TaskRegistry("job1")
    registry.start()
    settings = TaskSettings(f"127.0.0.1:{registry.port}", registry.key, "job1", exec,
                            (_WORKER.format(out=str(out)), {}), {})
    task = multiprocessing.get_context("fork").Process(target=_task_process, args=(settings,), daemon=True)
    task.start()
    left: set[int] = set()
    try:
        key = next(iter(wait_for(registry.alive, 30, "the task registering")))
        # With a driver grace, a wrapper that only sees its pipe close lets the worker train on that long.
        spec = WorkerSpec("w1", key, 0, ("x",), {"CLOUD_ELASTIC_DRIVER_GRACE_S": "90"}, "S" * 64, "")
        SparkTaskLauncher(registry).launch(spec, print)

        def worker_started() -> set[int]:
            procs = _descendants(task.pid)
            return procs if any(b"cloud_elastic.spark.runfn" in _cmdline(p) for p in procs) else set()

        left = wait_for(worker_started, 30, "the worker starting") | set(_worker_pids(out))
        [folder] = task_tmp.glob("cloud-elastic-task-*")
        assert not list(folder.glob("fn.pkl.*")), "the worker kept its copy of the function after loading it"
        os.kill(task.pid, signal.SIGKILL)  # as Spark kills a task's Python process (task kill, cancel)
        wait_for(lambda: not any(_running(p) for p in left), 30,
                 "the wrapper, the worker and the worker's child dying with their task")
        assert "SIGTERM" not in out.read_text(), "the worker was told its host is going"
        # Nothing of the task is left: its folder held the user's function and arguments, pickled.
        wait_for(lambda: not folder.exists(), 30, "the killed task's folder being removed")
    finally:
        for pid in left:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        task.join(10)
        registry.close()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _fn_file(tmp_path, fn) -> str:
    from pyspark import cloudpickle

    path = str(tmp_path / "fn.pkl")
    with open(path, "wb") as f:
        cloudpickle.dump((fn, (), {}), f)
    return path


def test_a_value_of_a_class_only_the_driver_script_defines_comes_back(task_tmp):
    from cloud_elastic.spark import runfn

    @dataclasses.dataclass
    class Result:  # as in a driver script or notebook: no executor can import it by name
        rank: int

    result = str(task_tmp / "result.pkl")
    fn_file = _fn_file(task_tmp, lambda: Result(3))
    assert runfn.main([fn_file, result]) == 0
    assert not os.path.exists(fn_file), "the worker kept the function after loading it"
    with open(result, "rb") as f:
        rank, data = read_result(f)
    assert rank is None and pickle.loads(data).rank == 3


def test_a_value_that_cannot_be_pickled_fails_the_worker_with_the_reason(task_tmp):
    from cloud_elastic.spark import runfn

    result = str(task_tmp / "result.pkl")
    with pytest.raises(TypeError):
        runfn.main([_fn_file(task_tmp, threading.Lock), result])
    assert not os.path.exists(result)
    reason = Path(result + ".error").read_text()
    assert reason.startswith("the training function's return value (lock) cannot be pickled for Spark: TypeError: cannot pickle")
