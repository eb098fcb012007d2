"""A pod deleted where the driver cannot see it: only the kubelet's SIGTERM says the pod is going.

As in ``test_pod_job.py``, a real job trains over SSH into "pods" running the manifests'
start-sshd.sh, found through the fake Kubernetes API; here the API never shows the deletion (the
driver's watch missed it: the API server unreachable, RBAC), so nothing but the SIGTERM to the
pod's process reaches the job. start-sshd.sh passes it on through the remote wrapper to the
worker, which asks the driver to let it leave at its next commit: the host drains as for a
spot notice, with no rollback, and the script exits 0 once its worker has left.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.emulator.fake_kubernetes import kubernetes, kubernetes_server  # noqa: F401
from tests.integration.harness import Job

from .test_pod_job import driver_args, events_of, replace_flag, start_pods, wrappers_through

pytestmark = [pytest.mark.emulator, pytest.mark.ssh, pytest.mark.timeout(180)]

NET = 98
NAMESPACE = "pods-sigterm"  # pods stay in the fake between tests: a namespace of this test's own


def test_a_pod_whose_deletion_the_driver_never_sees_leaves_at_a_commit_through_its_sigterm(kubernetes, kubectl,
                                                                                          tmp_path):
    key, port, pods = start_pods(kubernetes, tmp_path, NET, NAMESPACE)
    events = tmp_path / "events"
    args = driver_args(kubectl, kubernetes, key, port, events)
    args = replace_flag(replace_flag(args, "--k8s-namespace", NAMESPACE), "--address-map",
                        f"10.91.{NET}.0/24=127.0.{NET}.0/24")
    (tmp_path / "run").mkdir()  # its driver's record in a directory of its own (see the ``jobs`` fixture)
    job = Job(args, env={"XDG_RUNTIME_DIR": str(tmp_path / "run")})
    try:
        job.wait_event("commit", rank=1, step=3, timeout=90)
        p1 = pods["p1"]
        assert wrappers_through(p1), "no worker wrapper came in through p1's sshd"
        # The kubelet's SIGTERM, and nothing in the API: p1 stays Running and Ready there.
        p1.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60  # a bound on the test, far beyond a commit (the worker commits each step)
        while p1.proc.poll() is None:
            assert time.monotonic() < deadline, f"p1's start-sshd.sh still waits:\n{job.output()}"
            time.sleep(0.05)
        assert p1.proc.returncode == 0 and not wrappers_through(p1)
        assert job.finish(120) == 0, job.output()
    finally:
        if job.proc.poll() is None:
            job.kill()
        for pod in pods.values():
            pod.stop()

    out = job.output()
    assert "SIGTERM: passed on to the worker" in out and "SIGTERM: leaving at the next commit" in out, out
    assert [(e["source"], e["host"], e["action"]) for e in events_of(events, "notice")] == [
        ("sigterm", f"127.0.{NET}.2", "drain")]
    assert [e["host"] for e in events_of(events, "worker_left")] == [f"127.0.{NET}.2"]
    assert not events_of(events, "rollback") and not events_of(events, "worker_failed")
    done = job.of("done")
    assert done and done[0]["step"] >= 40
