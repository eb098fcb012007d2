"""A command worker's Ray actor dies (kill -9, a crash, the OOM killer): its worker dies with it, as a failure.

Ray TERMs a dead actor's process group, so the worker's wrapper used to pass a SIGTERM on to the worker,
which reads one as "this host is going" (``worker.termination``): the driver drained a healthy node and never
used it again, and the worker trained on, without its actor, for the driver grace.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time

import pytest

from cloud_elastic.driver.launch.api import ExitStatus, WorkerSpec
from cloud_elastic.ray.launcher import RayLauncher
from tests.ray.conftest import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

# Stays after a SIGTERM, as a worker inside elastic.run does (it asks the driver to drain its host).
_WORKER = textwrap.dedent(r"""
    import os, signal, sys, time
    out = sys.argv[1]
    def note(line):
        with open(out, "a") as f:
            f.write(line + "\n")
    signal.signal(signal.SIGTERM, lambda *_: note("SIGTERM"))
    note(f"pid {os.getpid()}")
    while True:
        time.sleep(0.2)
""")


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_actor_kills_its_command_worker_at_once_and_never_hands_it_a_sigterm(nodes, tmp_path):
    import ray

    nodes.add(1)
    node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))
    script, out = tmp_path / "worker.py", tmp_path / "worker.out"
    script.write_text(_WORKER)
    # The driver passes its --driver-grace: a worker whose wrapper only lost its stdin trains on that long.
    spec = WorkerSpec("w[0]#1", node, 0, (sys.executable, str(script), str(out)),
                      {"CLOUD_ELASTIC_DRIVER_GRACE_S": "300"}, "secret", str(tmp_path))
    worker = RayLauncher(None, terminate_grace_s=5.0).launch(spec, lambda line: None)
    try:
        lines = wait_for(lambda: out.exists() and out.read_text().splitlines(), 90, "the worker to start",
                         ended=lambda: worker.poll() and f"the worker ended: {worker.poll()}")
        pid = int(lines[0].split()[1])
        actor = _ppid(_ppid(pid))  # worker <- wrapper <- actor
        os.kill(actor, signal.SIGKILL)
        wait_for(lambda: not _alive(pid), 30, f"worker {pid} to die with its actor {actor}")
        assert "SIGTERM" not in out.read_text(), "the worker was told its host is going"
        assert wait_for(worker.poll, 30, "the launcher to report the worker's end") == ExitStatus(-9)
    finally:
        worker.kill()
        if out.exists() and _alive(pid := int(out.read_text().split()[1])):
            os.kill(pid, signal.SIGKILL)
