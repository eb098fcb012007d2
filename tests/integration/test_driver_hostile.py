"""A stranger on the driver's ports cannot stop a job (issue 44 #3). Real jobs, their driver under a
low RLIMIT_NOFILE (``prlimit`` on the running driver), and a worker killed so that the driver launches
another. With 256 idle store connections under a 256-descriptor limit, that launch's ``os.pipe()``
raised EMFILE, and the driver died with a traceback (``Driver._launch`` caught only LaunchError),
leaving its surviving worker training on, orphaned."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket

import pytest

from tests.integration.harness import HostsFile, probe_cmd, worker_on

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _ports(job) -> tuple[int, int]:
    line = job.wait_for(lambda j: next((x for x in j.lines if "store port" in x), None), 60, "the driver's ports")
    m = re.search(r"control port (\d+), store port (\d+)", line)
    return int(m.group(1)), int(m.group(2))


def _connect_all(port: int, n: int, sources: int = 1) -> list[socket.socket]:
    """``n`` connections that send nothing (the kernel completes them; the driver may not accept them), from
    ``sources`` addresses in turn (127.0.0.1, then 127.0.0.201 on)."""
    held = []
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        if i % sources:
            s.bind((f"127.0.0.{200 + i % sources}", 0))
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    return held


def _job(jobs, tmp_path):
    """Two workers (127.0.0.1, 127.0.0.2) training until ``stop`` exists, both past step 3: the job, the
    stop file, the control and store ports, and the driver's soft descriptor limit and its open count."""
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    stop = tmp_path / "stop"
    job = jobs(["run", "-np", "2", "--min-np", "1", "--host-discovery-script", str(hosts.script),
                "--blacklist-cooldown-range", "1", "1",
                *probe_cmd("--steps", "5", "--step-sleep", "0.02", "--stop-when", str(stop))])
    control_port, store_port = _ports(job)
    job.wait_event("commit", rank=1, step=3)
    return job, stop, control_port, store_port, len(os.listdir(f"/proc/{job.proc.pid}/fd"))


def _limit(job, soft: int) -> None:
    hard = resource.prlimit(job.proc.pid, resource.RLIMIT_NOFILE)[1]
    resource.prlimit(job.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))


def _finished_well(job) -> str:
    assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    assert "Traceback" not in out, out
    done = job.of("done")
    assert done and all(e["step"] >= 5 for e in done), out
    return out


def _said(*texts: str):
    return lambda job: any(t in line for line in job.lines for t in texts)


def test_idle_strangers_on_both_ports_leave_the_descriptors_a_launch_needs_and_the_job_finishes(jobs, tmp_path):
    """The issue's case, on both ports: idle unauthenticated connections, far more than the descriptor
    limit, held to the end. The store takes at most a quarter of the limit and the control plane half:
    the driver's relaunch of a killed worker gets its pipe and the job finishes."""
    job, stop, control_port, store_port, open_now = _job(jobs, tmp_path)
    _limit(job, open_now + 200)
    # Eight addresses: past 64 unsigned connections of one address, the control plane closes that address's oldest.
    held = _connect_all(store_port, 400) + _connect_all(control_port, 400, sources=8)
    try:
        job.wait_for(_said("a quarter of the driver's descriptor limit", "the rendezvous store may hold",
                           "store: cannot accept"), 60,
                     "the store at its cap (or out of descriptors)")
        job.wait_for(_said("(half the driver's descriptor limit)", "the control plane may hold",
                           "control plane: cannot accept"), 60,
                     "the control plane at its cap (or out of descriptors)")
        os.kill(worker_on(job.job_id(), "127.0.0.2"), signal.SIGKILL)
        job.wait_for(_said("launched worker 127.0.0.2[0]#3", "127.0.0.2[0]#3: the driver could not"), 60,
                     "the relaunch")
        stop.touch()
        out = _finished_well(job)
    finally:
        for s in held:
            s.close()
    assert "launched worker 127.0.0.2[0]#3" in out and "could not start" not in out
    assert "Too many open files" not in out  # neither server, nor the discovery script, ran short


def test_a_launch_the_driver_has_no_descriptors_for_is_a_worker_that_failed_to_start(jobs, tmp_path):
    """A driver's process out of descriptors for any reason: the launch fails, the job goes on without that
    worker, and once descriptors are back, finishes."""
    job, stop, _, _, _ = _job(jobs, tmp_path)
    soft = resource.prlimit(job.proc.pid, resource.RLIMIT_NOFILE)[0]
    _limit(job, 8)  # below what it has open: no new descriptor at all until the limit is back
    try:
        os.kill(worker_on(job.job_id(), "127.0.0.2"), signal.SIGKILL)
        job.wait_for(_said("127.0.0.2[0]#3: the driver could not start it"), 60, "a failed launch")
    finally:
        _limit(job, soft)
    stop.touch()
    out = _finished_well(job)
    assert "Too many open files" in out and "host 127.0.0.2 blacklisted" in out
