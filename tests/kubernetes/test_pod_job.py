"""The manifests' driver command line trains a real job over SSH into "pods" that run the
manifests' start-sshd.sh, with pods and their deletion served by the fake Kubernetes API.

Each pod is start-sshd.sh listening on a loopback address of its own (its pod IP
``10.91.97.x`` mapped there with ``--address-map``), all on one port, with the driver's key as its
authorized key and this process's environment as its container's: workers find Python, the probe
and cloud-elastic through what start-sshd.sh hands every session. The driver's arguments are the
kind overlay's, rendered and expanded as the kubelet does; only what points at this machine is
replaced (the SSH port, user and key, the kubeconfig, the address map, the training command).

Deleting a pod is what the kubelet and the API server do: ``deletionTimestamp`` in the API and
SIGTERM to the pod's process. The pod's workers leave at a commit, with no rollback, while
start-sshd.sh waits for them (it is seen running while they run, and gone only once they are);
then it exits 0, before the deadline.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.emulator.fake_kubernetes import kubernetes, kubernetes_server  # noqa: F401
from tests.integration.harness import Job, probe_cmd

from .manifests import DEPLOY, driver_job, flag, render, resolved_args
from .pods import Pod, need_sshd, start_on_one_port

pytestmark = [pytest.mark.emulator, pytest.mark.ssh, pytest.mark.timeout(180)]

NET = 97
NAMESPACE = "cloud-elastic"  # the kind overlay's


def replace_flag(args: list[str], name: str, value: str) -> list[str]:
    i = args.index(name)
    return [*args[:i + 1], value, *args[i + 2:]]


def start_pods(fake, tmp: Path, net: int, namespace: str) -> tuple[Path, int, dict[str, Pod]]:
    """Two Ready worker pods, p0 and p1, in ``fake``'s ``namespace`` at 10.91.NET.1-2, each running start-sshd.sh
    on 127.0.NET.1-2, one port for both: the driver's key, the port, the pods by name."""
    need_sshd()
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    labels = {"app": "cloud-elastic-worker"}
    pods = {}
    for i, name in enumerate(("p0", "p1"), start=1):
        fake.add_pod(name, f"10.91.{net}.{i}", namespace=namespace, node=f"node-{i}", labels=labels,
                     created=float(i))
        pods[name] = Pod(tmp / name, dict(os.environ), key=key, address=f"127.0.{net}.{i}")
    return key, start_on_one_port(list(pods.values())), pods


def driver_args(kubectl: str, fake, key: Path, port: int, events: Path) -> list[str]:
    """The kind overlay's driver command, pointed at this machine."""
    objects = render(kubectl, DEPLOY / "overlays" / "kind")
    args = resolved_args(objects, driver_job(objects))
    assert args[:2] == ["cloud-elastic", "run"] and args[-2:] == ["python", "train.py"]
    options = args[2:-2]
    for name, value in (("--ssh-port", str(port)), ("--ssh-user", getpass.getuser()),
                        ("--ssh-identity-file", str(key))):
        options = replace_flag(options, name, value)
    assert flag(options, "--k8s-namespace") == NAMESPACE
    return ["run", *options, "--kubeconfig", str(fake.kubeconfig), "--address-map", f"10.91.{NET}.0/24=127.0.{NET}.0/24",
            "--force-ssh", "--discovery-interval", "0.5", "--events-file", str(events),
            *probe_cmd("--steps", "40", "--min-resets", "1")]


def wrappers_through(pod: Pod) -> list[int]:
    """The remote wrappers (``cloud_elastic.driver.launch.ssh_remote``) whose SSH connection came in through
    ``pod``'s sshd: its address and port in their ``SSH_CONNECTION``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if b"cloud_elastic.driver.launch.ssh_remote" not in (proc / "cmdline").read_bytes():
                continue
            env = dict(v.split(b"=", 1) for v in (proc / "environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if env.get(b"SSH_CONNECTION", b"").split()[2:] == [pod.address.encode(), str(pod.port).encode()]:
            found.append(int(proc.name))
    return found


def events_of(path: Path, kind: str) -> list[dict]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def test_a_deleted_pod_s_workers_leave_at_a_commit_while_its_sshd_script_waits(kubernetes, kubectl, tmp_path):
    key, port, pods = start_pods(kubernetes, tmp_path, NET, NAMESPACE)
    events = tmp_path / "events"
    (tmp_path / "run").mkdir()  # its driver's record in a directory of its own (see the ``jobs`` fixture)
    job = Job(driver_args(kubectl, kubernetes, key, port, events), env={"XDG_RUNTIME_DIR": str(tmp_path / "run")})
    try:
        job.wait_event("commit", rank=1, step=3, timeout=90)
        assert {e["worker"].split("[")[0] for e in job.of("hello")} == {f"127.0.{NET}.1", f"127.0.{NET}.2"}

        p1 = pods["p1"]
        assert wrappers_through(p1), "no worker wrapper came in through p1's sshd"
        # kubectl delete pod p1 --grace-period=30: the API marks it, the kubelet sends SIGTERM.
        deadline = kubernetes.delete_pod("p1", grace_s=30, namespace=NAMESPACE).deletion
        p1.proc.send_signal(signal.SIGTERM)
        waited = False  # p1's script seen running after the SIGTERM while its worker still was
        while p1.proc.poll() is None:
            alive = wrappers_through(p1)
            waited = waited or (alive and p1.proc.poll() is None)
            assert time.time() < deadline, "p1's start-sshd.sh still runs at the pod's deadline"
            time.sleep(0.02)
        assert not wrappers_through(p1), "p1's start-sshd.sh exited while a worker it served was still running"
        assert waited, "p1's worker was gone before the test could look: nothing shows the script waited"
        assert p1.proc.returncode == 0
        assert "no worker left: exiting" in p1.log.read_text()

        assert job.finish(120) == 0, job.output()
    finally:
        if job.proc.poll() is None:
            job.kill()
        for pod in pods.values():
            pod.stop()

    left = events_of(events, "worker_left")
    assert [e["host"] for e in left] == [f"127.0.{NET}.2"]
    assert not events_of(events, "rollback") and not events_of(events, "worker_failed")
    done = job.of("done")
    assert done and done[0]["step"] >= 40
