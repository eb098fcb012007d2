"""The Spark task side: what each of the job's ``max_np`` Spark tasks runs on its executor.

A task registers its executor's address with the driver's task registry, then
polls it for orders. On ``start`` it runs the training function as a worker
process of its own (:mod:`cloud_elastic.spark.runfn` under the SSH launcher's
wrapper, which dies with the task), relays ``TERM``/``KILL`` orders to it, and
reports its exit. Then:

* the function returned: the task returns ``[(rank, pickled value)]`` to Spark, the bytes the
  worker wrote, untouched: the value is unpickled once, by ``run_elastic`` on the driver;
* the worker was told to leave (exit 0): the task stays registered and goes
  back to waiting for orders, because Spark never reruns a partition that
  succeeded: returning would take its slot from the job for good. It returns
  ``[]`` when the driver says training is over;
* the worker failed: the task **raises**, so Spark retries it (possibly on
  another executor), and the retry registers as a new host: that is how
  capacity comes back.

A task that registers after training ended is told to exit at once. The
worker sees only the GPUs Spark assigned to its task (:func:`worker_env`).

The task pickles the function and its arguments into its temporary folder once,
before it registers: pickling a large argument takes a while, and a task that
stopped polling meanwhile would be declared lost. Each worker gets a link of its
own to that file, which it deletes once it has loaded it. The folder is removed
when the task ends, and also when Spark SIGKILLs the task's process (a cancelled
job): a small process beside the task (:data:`_JANITOR`) removes it when the
task's end of its pipe closes, however the task ended.
Imports the standard library and cloud-elastic's control plane only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cloud_elastic.control import Codec
from cloud_elastic.worker.settings import HOSTNAME_ENV

__all__ = ["TaskSettings", "run_task", "task_gpus", "worker_env"]

#: The variable through which a worker sees only its task's GPUs.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class TaskSettings:
    """What every task needs, shipped to the executors inside Spark's task closure."""

    registry: str  # host:port
    registry_key: str = field(repr=False)
    job_id: str
    fn: Callable[..., Any]
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    grace_s: float = 5.0


class WorkerFailed(RuntimeError):
    """The worker in this task failed; raising it makes Spark retry the task."""


def _route_ip(driver: str) -> str:
    """This executor's address on the route to the driver (no packet is sent)."""
    host = driver.rpartition(":")[0]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def task_gpus(ctx: Any) -> list[str] | None:
    """The GPU addresses Spark assigned to the task of ``ctx`` (a ``TaskContext``); None when it assigned none."""
    if ctx is None:
        return None
    try:
        gpu = ctx.resources().get("gpu")
    except Exception:  # a Spark without task resources
        return None
    addresses = [str(a) for a in getattr(gpu, "addresses", None) or ()]
    return addresses or None


def worker_env(base: Mapping[str, str], job_env: Mapping[str, Any], ip: str,
               gpus: Sequence[str] | None) -> dict[str, str]:
    """The worker's environment: the executor's ``base``, then the driver's ``job_env``.

    Each task is a host with one slot, so every worker's local rank is 0 and it
    takes ``cuda:0``. With the task's GPUs in ``CUDA_VISIBLE_DEVICES``, that is
    the GPU Spark gave this task, not the executor's first, unless the user set
    the variable themselves (``env=`` of ``run_elastic``).
    """
    env = dict(base)
    env.update({str(k): str(v) for k, v in job_env.items()})
    if gpus and CUDA_VISIBLE_DEVICES not in job_env:
        env[CUDA_VISIBLE_DEVICES] = ",".join(gpus)
    env[HOSTNAME_ENV] = ip  # the driver names this host by task; Gloo binds the address
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


def run_task(settings: TaskSettings, index: int, attempt: int,
             gpus: Sequence[str] | None = None) -> list[tuple[int | None, bytes]]:
    """Run one task to its end (see module docstring); ``gpus``: the GPU addresses Spark assigned to it.
    Returns ``[(rank, the value pickled)]`` when this task's worker returned, else ``[]``."""
    from cloud_elastic.worker.link.client import DriverClient

    client = DriverClient(settings.registry, Codec(settings.registry_key, settings.job_id), f"spark-task-{index}")
    ip = _route_ip(settings.registry)
    workdir = tempfile.mkdtemp(prefix="cloud-elastic-task-")
    janitor = _janitor(workdir)
    wrapper: subprocess.Popen | None = None
    worker_id = ""
    started = 0
    result_path = os.path.join(workdir, "result.pkl")
    fn_path = os.path.join(workdir, "fn.pkl")
    try:
        _write_fn(settings, fn_path)  # before registering: no poll is due while it takes
        reply = client.call("register", {"index": index, "attempt": attempt, "ip": ip})
        if reply.get("order") == "exit":
            return []
        key = reply["key"]
        while True:
            order = client.call("order", {"key": key}, timeout_s=60.0)
            kind = order.get("order")
            if kind == "exit" and wrapper is None:
                return []
            if kind == "start" and wrapper is None:
                worker_id = str(order.get("worker_id", ""))
                started += 1
                wrapper = _start(settings, order, ip, gpus, workdir, _worker_fn(fn_path, started), result_path)
            elif wrapper is not None and (kind == "exit" or kind in ("TERM", "KILL") and _for(order, worker_id)):
                _send(wrapper, "KILL" if kind == "KILL" else f"TERM {float(order.get('grace_s', settings.grace_s)):g}")
            if wrapper is not None and wrapper.poll() is not None:
                code = wrapper.returncode
                code = 128 - code if 128 < code < 160 else code  # the wrapper's 128+N means signal N
                wrapper = None
                error = _take(result_path + ".error", lambda f: f.read(500), "r") or ""
                client.call("exited", {"key": key, "worker_id": worker_id, "code": code, "error": error,
                                       "leaving": code != 0 or os.path.exists(result_path)})
                result = _take(result_path, read_result, "rb")
                if result is not None:
                    return [result]
                if code != 0:
                    raise WorkerFailed(f"the worker in spark task {index} (attempt {attempt}) exited with code {code}")
                # Sent away (exit 0): wait for the next worker or the end of training.
    finally:
        if wrapper is not None and wrapper.poll() is None:
            _send(wrapper, "KILL")
            wrapper.wait()
        shutil.rmtree(workdir, ignore_errors=True)
        _dismiss(janitor)


#: What the janitor beside each task runs (``python -I -c``, so it starts in milliseconds): it waits for the
#: end of its stdin, which comes when the task's process ends however it ends (Spark SIGKILLs the Python worker
#: of a cancelled task; its wrapper and worker are then killed too, see :func:`_start`), and removes the task's
#: folder, with the function and arguments pickled in it. It tries again for a few seconds while a worker
#: being killed may still write there.
_JANITOR = """\
import os, shutil, sys, time
sys.stdin.buffer.read()
path, end = sys.argv[1], time.monotonic() + 10.0
while os.path.lexists(path) and time.monotonic() < end:
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        time.sleep(0.1)
"""


def _janitor(workdir: str) -> subprocess.Popen | None:
    """Start the janitor of ``workdir`` (:data:`_JANITOR`), in a session of its own so that nothing sent to the
    task's process group reaches it; None if it cannot start (the task's own ``finally`` still removes the folder)."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-c", _JANITOR, workdir], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def _dismiss(janitor: subprocess.Popen | None) -> None:
    """The task is ending by itself (its folder removed already): let its janitor go."""
    if janitor is None:
        return
    try:
        assert janitor.stdin is not None
        janitor.stdin.close()
        janitor.wait(5.0)
    except (OSError, subprocess.TimeoutExpired):  # it ends by itself within its own bound
        pass


def _write_fn(settings: TaskSettings, fn_path: str) -> None:
    """Pickle the training function and its arguments to ``fn_path`` (private: the folder is the task's own)."""
    from pyspark import cloudpickle  # the serialiser Spark itself used for the closure

    with open(fn_path, "wb") as f:
        cloudpickle.dump((settings.fn, tuple(settings.args), dict(settings.kwargs)), f)


def _worker_fn(fn_path: str, number: int) -> str:
    """A path of the task's ``number``-th worker's own to the pickled function, which the worker deletes once
    loaded: a hard link to the task's copy (a copy where links are refused), made at once however large the
    arguments are."""
    path = f"{fn_path}.{number}"
    try:
        os.link(fn_path, path)
    except OSError:
        shutil.copyfile(fn_path, path)
    return path


def read_result(f: Any) -> tuple[int | None, bytes]:
    """``(rank, the value pickled)`` from a result file :mod:`~cloud_elastic.spark.runfn` wrote: a JSON line with the
    rank, then the pickle, kept as bytes."""
    head = json.loads(f.readline())
    return head["rank"], f.read()


def _for(order: Mapping[str, Any], worker_id: str) -> bool:
    """Whether a TERM/KILL ``order`` is meant for worker ``worker_id`` (not one of this task's earlier workers)."""
    return str(order.get("worker_id", worker_id)) == worker_id


def _take(path: str, read: Callable[[Any], Any], mode: str) -> Any:
    """What ``read`` makes of the file at ``path``, which is then removed (the next worker writes its own);
    None when there is no such file."""
    if not os.path.exists(path):
        return None
    with open(path, mode) as f:
        value = read(f)
    os.unlink(path)
    return value


def _start(settings: TaskSettings, order: Mapping[str, Any], ip: str, gpus: Sequence[str] | None,
           workdir: str, fn_path: str, result_path: str) -> subprocess.Popen:
    from cloud_elastic.driver.launch.ssh_remote import MODULE, WrapperArgs, die_with_parent, wrapper_argv
    from cloud_elastic.spark.registry import unseal

    job_env = json.loads(unseal(settings.registry_key, str(order["env"])))
    env = worker_env(os.environ, job_env, ip, gpus)
    cwd = str(order.get("cwd") or "")
    command = [sys.executable, "-m", "cloud_elastic.spark.runfn", fn_path, result_path]
    args = WrapperArgs("spark", settings.grace_s, 0.0, cwd if os.path.isdir(cwd) else workdir, tuple(command),
                       term_kills=True)
    # When Spark kills the task's process (task kill, cancel, stage abort, the daemon's end), the kernel TERMs
    # the wrapper and its pipe closes: with --term-kills either KILLs the worker's whole process group at once
    # (its children too), as a worker that failed. Passed on, a SIGTERM would make the worker report its host
    # as going, and the driver would drain a task that Spark never retries; a KILLed wrapper left the worker's
    # children running, and a closed pipe alone lets the worker train on for the driver grace.
    wrapper = subprocess.Popen([sys.executable, "-m", MODULE, *wrapper_argv(args)], env=env, stdin=subprocess.PIPE,
                               preexec_fn=die_with_parent(signal.SIGTERM))
    secret = unseal(settings.registry_key, str(order["secret"]))
    assert wrapper.stdin is not None
    wrapper.stdin.write(secret.encode() + b"\n")
    wrapper.stdin.flush()
    return wrapper


def _send(wrapper: subprocess.Popen, line: str) -> None:
    try:
        assert wrapper.stdin is not None
        wrapper.stdin.write(line.encode() + b"\n")
        wrapper.stdin.flush()
    except (OSError, ValueError):  # the wrapper has ended already
        pass


def partition_fn(settings: TaskSettings) -> Callable[[int, Iterator[Any]], Iterator[tuple[int | None, Any]]]:
    """The ``mapPartitionsWithIndex`` function of the job's stage."""

    def fn(index: int, _rows: Iterator[Any]) -> Iterator[tuple[int | None, Any]]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        yield from run_task(settings, index, attempt, task_gpus(ctx))

    return fn
