"""The Ray actor that hosts one worker. Runs in the actor's process on its node.

Imports only the standard library at module level (plus ``cloud_elastic.worker``
once a training function returned), so the actor starts fast and importing
this module never pulls in Ray or torch.

The job's secret arrives as an argument of the method call that starts the
worker, never in the actor's constructor or ``runtime_env``: Ray keeps
creation arguments and runtime environments in its GCS (for restarts and the
dashboard), while a method's arguments travel once, inside the cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["REMOTE_MODULE", "WorkerActor", "cuda_visible_devices"]

REMOTE_MODULE = "cloud_elastic.driver.launch.ssh_remote"


class WorkerActor:
    """One worker: either a Python training function run in this process, or a command run as a child.

    Created with ``max_concurrency=2`` so :meth:`order` can reach a running command.
    """

    def __init__(self) -> None:
        self._wrapper: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def run_function(
        self, env: Mapping[str, str], secret: str, fn: Callable[..., Any], args: Sequence[Any],
        kwargs: Mapping[str, Any], gpu: bool,
    ) -> dict[str, Any]:
        """Call ``fn(*args, **kwargs)`` as this job's worker; the worker library reads ``env`` at ``init()``.

        Returns ``{"kind": "result", "rank", "value"}`` when ``fn`` returned, or
        ``{"kind": "exit", "code"}`` when it left through ``sys.exit`` (a worker the
        driver told to leave exits 0). An exception propagates to the caller as Ray's
        task error, which is an instance of the user's exception class.
        """
        _worker_environment(env, secret, gpu)
        try:
            value = fn(*args, **dict(kwargs))
        except SystemExit as exc:
            _script_ended(None)
            code = exc.code
            return {"kind": "exit", "code": code if isinstance(code, int) else (0 if code is None else 1)}
        except BaseException as exc:
            _script_ended(exc)
            raise
        ctx = _script_ended(None)
        rank = ctx.info.rank if ctx is not None and ctx.info is not None else None
        # Heartbeats go on while Ray serialises the value (minutes for a large state_dict): the driver gives
        # up a completed worker that goes silent. They stop when the launcher, holding the value, kills this actor.
        return {"kind": "result", "rank": rank, "value": value}

    def run_command(
        self, env: Mapping[str, str], secret: str, cwd: str, command: Sequence[str], grace_s: float, gpu: bool,
    ) -> dict[str, Any]:
        """Run ``command`` on this node through the SSH launcher's wrapper (:mod:`cloud_elastic.driver.launch.ssh_remote`).

        The wrapper reads the secret from its stdin and runs the worker in its own process group. When this
        actor dies (killed, crashed, out of memory), the wrapper gets a SIGTERM, from the kernel
        (``PR_SET_PDEATHSIG``) and from Ray (which TERMs a dead actor's process group), and KILLs the worker's
        group (``--term-kills``; under SSH a SIGTERM means the host is going, and the worker may leave at its
        next commit). So a worker never outlives its actor, and the driver counts a worker that failed, as for
        any worker that died, not a host that is going.
        """
        from cloud_elastic.driver.launch.ssh_remote import WrapperArgs, die_with_parent, wrapper_argv

        _worker_environment(env, None, gpu)
        child_env = dict(os.environ)
        child_env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), child_env.get("PATH", "")])
        # The driver's directory may not exist on this node; then run where Ray put us.
        workdir = cwd if os.path.isdir(cwd) else os.getcwd()
        args = WrapperArgs("ray", grace_s, 0.0, workdir, tuple(command), term_kills=True)
        argv = [sys.executable, "-m", REMOTE_MODULE, *wrapper_argv(args)]
        with self._lock:
            # PDEATHSIG fires when the starting thread ends: this one waits for the wrapper below, so only
            # the actor's death ends it first.
            self._wrapper = subprocess.Popen(argv, env=child_env, stdin=subprocess.PIPE,
                                             preexec_fn=die_with_parent(signal.SIGTERM))
            assert self._wrapper.stdin is not None
            self._wrapper.stdin.write(secret.encode() + b"\n")
            self._wrapper.stdin.flush()
        code = self._wrapper.wait()
        # The wrapper exits 128+N for a worker killed by signal N, as a shell does.
        return {"kind": "exit", "code": 128 - code if 128 < code < 160 else code}

    def order(self, line: str) -> None:
        """Pass ``TERM <grace>`` or ``KILL`` to the running command's wrapper (no-op without one)."""
        with self._lock:
            wrapper = self._wrapper
        if wrapper is None or wrapper.stdin is None:
            return
        try:
            wrapper.stdin.write(line.encode() + b"\n")
            wrapper.stdin.flush()
        except (OSError, ValueError):  # the wrapper has ended already
            pass


def _script_ended(error: BaseException | None) -> Any:
    """Tell the driver a training function that never entered ``hvd.elastic.run`` has ended (with ``error``,
    if it raised), as the worker library's exit hook does for a script; return the worker's context, if any.

    The hook never runs here: the actor's process is killed, not exited. Without the report the driver
    runs such a function as an elastic job and counts its return as a worker lost mid-training.
    """
    if "cloud_elastic.worker.context" not in sys.modules:  # fn never imported the worker library
        return None
    from cloud_elastic.worker import context

    ctx = context.current()  # as it is: a function that never needed the round does not join one now
    if ctx is not None and not ctx.elastic_entered:
        if error is not None:
            ctx._uncaught = error  # what the exit hook would have seen through sys.excepthook
        ctx._report_script_end()
    return ctx


def _worker_environment(env: Mapping[str, str], secret: str | None, gpu: bool) -> None:
    """Put the worker's settings into this process's environment before the worker library reads it, and the
    secret into the worker library: in the environment, the function's subprocesses would inherit it."""
    import ray

    from cloud_elastic.worker.settings import HOSTNAME_ENV, SLOT_ENV, keep_secret

    os.environ.update(env)
    # The driver names hosts by Ray node id; Gloo needs an address this node can bind.
    os.environ[HOSTNAME_ENV] = ray.util.get_node_ip_address()
    if secret is not None:
        keep_secret(secret)
    if gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(
            _node_gpu_ids(), [str(i) for i in ray.get_gpu_ids()], int(env.get(SLOT_ENV, "0"))
        )


def cuda_visible_devices(node_gpus: Sequence[str], own: Sequence[str], slot: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the worker on ``slot`` of a node whose Ray GPU ids are ``node_gpus``, when
    Ray assigned it the GPUs ``own``.

    The worker library trains on ``cuda:<local rank>``, and its local rank is its slot: so the worker's
    first own GPU goes at position ``slot``, the node's other GPUs around it (visible, as under Horovod, so
    that NCCL can reach its peers directly). Showing it ``0..N-1`` instead would put it on whatever GPU
    has index ``slot``, not the one Ray gave it, wrong wherever the raylet has only some of the GPUs.
    """
    mine = sorted(own, key=lambda g: node_gpus.index(g) if g in node_gpus else len(node_gpus))
    if not mine:
        raise RuntimeError("Ray assigned this worker no GPU (use_gpu=True needs gpus_per_slot >= 1)")
    others = [g for g in node_gpus if g not in mine]
    if slot > len(others):
        raise RuntimeError(f"slot {slot} cannot be a GPU of its own: Ray shows {len(node_gpus)} GPU(s) on this node")
    return ",".join([*others[:slot], *mine, *others[slot:]])


def _node_gpu_ids() -> list[str]:
    """The GPU ids Ray hands out on this node: those its raylet was started with (its
    ``CUDA_VISIBLE_DEVICES``, which Ray keeps only privately), else ``0..N-1``."""
    try:
        from ray._private.worker import global_worker

        original = global_worker.original_visible_accelerator_ids.get("GPU")
    except Exception:  # a Ray without the attribute: its ids are 0..N-1 unless the raylet had a subset
        original = None
    if original is not None:
        return [str(i) for i in original]
    return [str(i) for i in range(_node_gpus())]


def _node_gpus() -> int:
    import ray

    node = ray.get_runtime_context().get_node_id()
    for info in ray.nodes():
        if info.get("NodeID") == node:
            return int(info.get("Resources", {}).get("GPU", 0))
    return 0
