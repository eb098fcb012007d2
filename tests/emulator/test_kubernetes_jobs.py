"""``cloud-elastic run --k8s-selector`` trains a real job on pods of the fake Kubernetes API server.

Pod IPs (``10.91.x.y``) are mapped onto loopback with ``--address-map``, so the
driver's local launcher starts each pod's workers on this machine; the driver
reaches the fake through a kubeconfig, as it would reach a cluster. The fake
runs in this test process: what a test does to a pod or a node reaches the
driver through its watches only. (SIGTERM inside a pod is the in-pod side's
test, not here.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_elastic.providers.kubernetes_view import DRAIN_TAINTS
from tests.emulator.fake_kubernetes import kubernetes, kubernetes_server  # noqa: F401
from tests.integration.conftest import jobs  # noqa: F401  (the fixture that kills what a test leaves running)
from tests.integration.harness import REPO, Job, probe_cmd, worker_on

pytestmark = [pytest.mark.emulator, pytest.mark.timeout(150)]

CLI = [sys.executable, "-m", "cloud_elastic.cli"]


def _run(fake, namespace: str, net: int, np: int, events: Path, *extra: str) -> list[str]:
    return ["run", "-np", str(np), "--min-np", "1", "--discovery-interval", "0.5", "--events-file", str(events),
            "--k8s-selector", "app=llm", "--k8s-namespace", namespace, "--kubeconfig", str(fake.kubeconfig),
            "--address-map", f"10.91.{net}.0/24=127.0.{net}.0/24", *extra]


def _reset_after(job: Job, size: int, after: int, timeout: float = 60):
    """Wait for a reset at ``size`` among the resets after the first ``after`` ones."""
    return job.wait_for(lambda j: [r for r in j.of("reset")[after:] if r["size"] == size], timeout,
                        f"a reset at size {size} after the first {after}")


def _events(path: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def _no_rollback(job: Job, events: Path) -> None:
    """No round reported a rollback (the driver's events), and every worker whose step count the probe
    can vouch for (one there from the start, or reset before) resumed at the step it had executed."""
    assert not _events(events, "rollback") and not _events(events, "worker_failed")
    resets = job.of("reset")
    counted = {e["worker"] for e in job.of("hello") if e["size"] == job.of("hello")[0]["size"]}
    checked = []
    for r in resets:
        if r["worker"] in counted:
            checked.append(r)
        counted.add(r["worker"])  # the probe's count starts over from the step of each reset
    assert checked and all(r["executed"] == r["step"] for r in checked), f"survivors rolled back: {resets}"


def test_a_pod_that_becomes_ready_joins_and_a_disruption_target_leaves_with_no_rollback(kubernetes, jobs, tmp_path):
    ns, net = "job-join", 92
    kubernetes.add_pod("p0", f"10.91.{net}.1", namespace=ns, node="join-a", created=1.0)
    kubernetes.add_pod("p1", f"10.91.{net}.2", namespace=ns, node="join-a", created=2.0)
    kubernetes.add_pod("p2", None, namespace=ns, node="join-b", phase="Pending", ready=False, created=3.0)
    # It trains until both changes are done: a reset count (--min-resets) would train on for good, past the
    # finish's bound, if a change cost a round more or less than counted (a round aborted in its sync: CI of stop 56).
    stop = tmp_path / "stop"
    job = jobs(_run(kubernetes, ns, net, 2, tmp_path / "events", "--max-np", "3",
                    *probe_cmd("--steps", "40", "--stop-when", str(stop))))
    job.wait_event("commit", rank=0, step=3, timeout=60)
    # Each worker's output has a pipe of its own: rank 1's hello may come after rank 0's third commit.
    job.wait_for(lambda j: len(j.of("hello")) >= 2, 30, "both workers' hello lines")
    assert sorted(e["worker"].split("[")[0] for e in job.of("hello")) == [f"127.0.{net}.1", f"127.0.{net}.2"]

    kubernetes.change_pod("p2", ns, ip=f"10.91.{net}.3", phase="Running", ready=True)  # scheduled, started, Ready
    _reset_after(job, 3, 0)
    kubernetes.disrupt("p0", "EvictionByEvictionAPI", namespace=ns)  # the oldest pod: rank 0's
    _reset_after(job, 2, len(job.of("reset")))
    stop.touch()
    assert job.finish() == 0, job.output()

    out = job.output()
    assert f"host 127.0.{net}.1 is draining (DisruptionTarget: EvictionByEvictionAPI)" in out
    _no_rollback(job, tmp_path / "events")
    assert [e["host"] for e in _events(tmp_path / "events", "worker_left")] == [f"127.0.{net}.1"]
    done = job.of("done")
    assert len(done) == 2 and len({e["checksum"] for e in done}) == 1 and done[0]["step"] >= 40


#: Each node signal of the issue, as (taint key, flags, the reason the driver logs; None: not checked).
_TAINTS = [(key, (), reason) for key, reason in DRAIN_TAINTS.items()] + [
    ("example.com/going-away", ("--k8s-drain-taint", "example.com/going-away"), "taint example.com/going-away"),
    ("aws-node-termination-handler/rebalance-recommendation", ("--drain-on-rebalance",), None),
]


@pytest.mark.parametrize("taint,flags,reason", _TAINTS, ids=[t[0].split("/")[-1] for t in _TAINTS])
def test_a_tainted_node_sends_its_pods_away_with_no_rollback(kubernetes, jobs, tmp_path, taint, flags, reason):
    index = [t[0] for t in _TAINTS].index(taint)
    ns, net = f"job-taint-{index}", 110 + index
    kubernetes.add_node("taint-a")
    kubernetes.add_node("taint-b")
    kubernetes.add_pod("p0", f"10.91.{net}.1", namespace=ns, node="taint-a", created=1.0)
    kubernetes.add_pod("p1", f"10.91.{net}.2", namespace=ns, node="taint-b", created=2.0)
    kubernetes.add_pod("p2", f"10.91.{net}.3", namespace=ns, node="taint-b", created=3.0)
    job = jobs(_run(kubernetes, ns, net, 3, tmp_path / "events", *flags,
                    *probe_cmd("--steps", "40", "--min-resets", "1")))
    job.wait_event("commit", rank=0, step=3, timeout=60)

    kubernetes.taint("taint-b", taint)
    _reset_after(job, 1, 0)
    assert job.finish() == 0, job.output()

    out = job.output()
    for host in (2, 3):
        if reason is not None:
            assert f"host 127.0.{net}.{host} is draining (node taint-b: {reason}" in out
    _no_rollback(job, tmp_path / "events")
    assert sorted(e["host"] for e in _events(tmp_path / "events", "worker_left")) == [f"127.0.{net}.2",
                                                                                       f"127.0.{net}.3"]
    done = job.of("done")
    assert len(done) == 1 and done[0]["step"] >= 40


def test_a_pod_deleted_with_a_10s_grace_period_leaves_before_its_deadline_with_no_rollback(kubernetes, jobs,
                                                                                             tmp_path):
    ns, net = "job-delete", 96
    kubernetes.add_pod("p0", f"10.91.{net}.1", namespace=ns, node="delete-a", created=1.0)
    kubernetes.add_pod("p1", f"10.91.{net}.2", namespace=ns, node="delete-a", created=2.0)
    job = jobs(_run(kubernetes, ns, net, 2, tmp_path / "events", *probe_cmd("--steps", "40", "--min-resets", "1")))
    job.wait_event("commit", rank=1, step=3, timeout=60)

    deadline = kubernetes.delete_pod("p1", grace_s=10, namespace=ns).deletion  # kubectl delete --grace-period=10
    _reset_after(job, 1, 0)
    assert job.finish() == 0, job.output()

    drains = [d for e in _events(tmp_path / "events", "hosts_changed") for d in e.get("draining", ())]
    assert drains == [{"host": f"127.0.{net}.2", "reason": "pod deleted", "deadline": float(int(deadline))}]
    left = _events(tmp_path / "events", "worker_left")
    assert [e["host"] for e in left] == [f"127.0.{net}.2"] and left[0]["ts"] < int(deadline)
    _no_rollback(job, tmp_path / "events")


def test_a_restarted_pod_gets_a_worker_again_at_once_and_a_vanished_pod_takes_the_failure_path(kubernetes, jobs,
                                                                                                 tmp_path):
    ns, net = "job-vanish", 94
    kubernetes.add_pod("p0", f"10.91.{net}.1", namespace=ns, node="vanish-a", created=1.0)
    kubernetes.add_pod("p1", f"10.91.{net}.2", namespace=ns, node="vanish-b", created=2.0)
    events, host = tmp_path / "events", f"127.0.{net}.2"
    # A failed slot waits 300 s before a new worker starts there: unless a new instance holds the address.
    stop = tmp_path / "stop"  # it trains until both changes are done
    job = jobs(_run(kubernetes, ns, net, 2, events, "--blacklist-cooldown-range", "300", "300",
                    *probe_cmd("--steps", "20", "--stop-when", str(stop))))
    job.wait_event("commit", rank=1, step=3, timeout=60)

    # The worker container restarts (an OOM kill, say): its processes die, then the kubelet restarts it.
    subprocess.run(["kill", "-9", str(worker_on(job.job_id(), host))], check=True)
    job.wait_for(lambda j: _events(events, "worker_failed"), 30, "the failure")
    kubernetes.restart("p1", ns)
    _reset_after(job, 2, len(job.of("reset")))  # a new worker on the restarted pod, within the 300 s
    started = [e["host"] for e in _events(events, "worker_started")]
    assert started.count(host) == 2, started

    # Then the node dies: the pod is gone from the API with no notice before, and its processes with it.
    resets = len(job.of("reset"))  # counted before the kill: the survivor's reset can follow it within milliseconds
    kubernetes.remove_pod("p1", ns)
    subprocess.run(["kill", "-9", str(worker_on(job.job_id(), host))], check=True)
    _reset_after(job, 1, resets)
    stop.touch()
    assert job.finish() == 0, job.output()

    failed = _events(events, "worker_failed")
    assert [(e["host"], e.get("signal")) for e in failed] == [(host, "SIGKILL"), (host, "SIGKILL")]
    assert not _events(events, "worker_left")  # neither was a graceful leave
    assert len(_events(events, "rollback")) == 2
    done = job.of("done")
    assert len(done) == 1 and done[0]["step"] >= 20


def test_run_with_a_bad_selector_or_an_unreadable_namespace_fails_at_once_with_one_line(kubernetes):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, *args, *probe_cmd()], cwd=REPO, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    bad = run("run", "-np", "1", "--k8s-selector", "app in llm", "--kubeconfig", str(kubernetes.kubeconfig))
    assert bad.returncode != 0
    assert "--k8s-selector 'app in llm' is not a label selector" in bad.stderr + bad.stdout

    kubernetes.forbid("pods", "job-forbidden")
    refused = run("run", "-np", "1", "--k8s-selector", "app=llm", "--k8s-namespace", "job-forbidden",
                  "--kubeconfig", str(kubernetes.kubeconfig))
    assert refused.returncode != 0
    last = (refused.stderr + refused.stdout).strip().splitlines()[-1]
    assert "failed: host discovery failed: kubernetes pods 'app=llm': may not list pods in namespace " \
           "'job-forbidden': pods is forbidden" in last, refused.stderr + refused.stdout


def test_discover_shows_the_pods_and_their_drains(kubernetes):
    ns = "job-discover"
    kubernetes.add_pod("p0", "10.91.95.1", namespace=ns, node="discover-a", gpus=8, created=1.0)
    kubernetes.add_pod("p1", "10.91.95.2", namespace=ns, node="discover-a", created=2.0)
    kubernetes.delete_pod("p1", grace_s=30, namespace=ns)
    result = subprocess.run([*CLI, "discover", "--k8s-selector", "app=llm", "--k8s-namespace", ns,
                             "--kubeconfig", str(kubernetes.kubeconfig)], cwd=REPO, capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert "10.91.95.1" in result.stdout and "8" in result.stdout
    assert "10.91.95.2" in result.stdout and "pod deleted" in result.stdout
    assert kubernetes.count(rf"/namespaces/{ns}/pods$") == 1
    assert kubernetes.count(r"\?watch$") == 0  # one look: no watch started for it
