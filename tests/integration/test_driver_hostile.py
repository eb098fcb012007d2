"""A stranger on the driver's ports cannot stop a job (issue 44 #3): a real job, its driver out of
descriptors under a low RLIMIT_NOFILE because of idle unauthenticated connections to its store and
control plane, and a worker killed so that the driver launches another one, whose os.pipe() fails.
The driver used to die there with a traceback (``Driver._launch`` caught only LaunchError) and leave
its surviving worker training on, orphaned."""

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


def _connect_all(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that send nothing (the kernel completes them; the driver may not accept them)."""
    held = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    return held


def _job_short_of_descriptors(jobs, tmp_path):
    """A job of two workers (127.0.0.1, 127.0.0.2) that trains until ``stop`` exists, its driver's
    descriptor limit lowered to 48 above what it has open once both train: the job, the stop file
    and the control and store ports."""
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    stop = tmp_path / "stop"
    job = jobs(["run", "-np", "2", "--min-np", "1", "--host-discovery-script", str(hosts.script),
                "--blacklist-cooldown-range", "1", "1",
                *probe_cmd("--steps", "5", "--step-sleep", "0.02", "--stop-when", str(stop))])
    control_port, store_port = _ports(job)
    job.wait_event("commit", rank=1, step=3)
    driver = job.proc.pid
    spare = len(os.listdir(f"/proc/{driver}/fd")) + 48
    resource.prlimit(driver, resource.RLIMIT_NOFILE, (spare, resource.prlimit(driver, resource.RLIMIT_NOFILE)[1]))
    return job, stop, control_port, store_port


def _finished_well(job) -> str:
    assert job.finish(timeout=120) == 0, job.output()
    out = job.output()
    assert "Traceback" not in out, out
    done = job.of("done")
    assert done and all(e["step"] >= 5 for e in done), out
    return out


def test_idle_strangers_on_the_store_port_take_half_the_descriptors_at_most_and_the_job_finishes(jobs, tmp_path):
    """The issue's case: idle unauthenticated store connections, past the descriptor limit, held to the
    end. A worker is killed so that the driver launches another (whose os.pipe() used to fail)."""
    job, stop, _, store_port = _job_short_of_descriptors(jobs, tmp_path)
    held = _connect_all(store_port, 300)
    try:
        job.wait_for(lambda j: any("half the driver's descriptor limit" in x or "store: cannot accept" in x
                                   for x in j.lines), 60, "the store at its cap or out of descriptors")
        os.kill(worker_on(job.job_id(), "127.0.0.2"), signal.SIGKILL)
        job.wait_for(lambda j: any("127.0.0.2[0]#3" in x for x in j.lines), 60, "the relaunch")
        stop.touch()
        assert "half the driver's descriptor limit" in _finished_well(job)
    finally:
        for s in held:
            s.close()


def test_idle_strangers_exhausting_the_drivers_descriptors_fail_a_launch_not_the_driver(jobs, tmp_path):
    """The control plane has no cap of its own (it closes idle connections after 60 s), so strangers there
    can still take every descriptor: the launch then fails, and the job goes on without that worker."""
    job, stop, control_port, store_port = _job_short_of_descriptors(jobs, tmp_path)
    held = _connect_all(store_port, 150) + _connect_all(control_port, 300)
    try:
        job.wait_for(lambda j: any("cannot accept connections" in x for x in j.lines), 60,
                     "the driver out of descriptors")
        os.kill(worker_on(job.job_id(), "127.0.0.2"), signal.SIGKILL)
        job.wait_for(lambda j: any("the driver could not start it" in x for x in j.lines), 60, "a failed launch")
    finally:
        for s in held:
            s.close()
    stop.touch()
    assert "Too many open files" in _finished_well(job)
