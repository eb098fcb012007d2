"""Driver failure paths a real fleet hits, with real worker processes: a discovery answer that
glitches, a driver that stalls, a first round that must not wait for a straggler."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.integration.harness import PROBE, HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _steps_never_went_back(job) -> None:
    for rank in {e["rank"] for e in job.of("commit")}:
        steps = [e["step"] for e in job.of("commit", rank=rank)]
        assert steps == sorted(steps), f"rank {rank} went back: {steps}"


def test_an_empty_discovery_answer_for_1_5s_changes_nothing(jobs, tmp_path):
    """Issue 10 #2, as reported: every worker was evicted and training restarted at step 1."""
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    job = jobs(["run", "-np", "3", "--host-discovery-script", str(hosts.script), "--discovery-interval", "0.2",
                *probe_cmd("--steps", "120")])
    job.wait_event("commit", rank=0, step=30)
    hosts.set([])
    time.sleep(1.5)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    assert job.finish(timeout=120) == 0, job.output()
    done = job.of("done")
    assert len(done) == 3 and {e["step"] for e in done} == {120}
    assert len({e["checksum"] for e in done}) == 1
    assert [e for e in job.of("reset")] == []  # nobody left, nobody joined, nothing rolled back
    _steps_never_went_back(job)
    assert any("missing from discovery" in line for line in job.lines), job.output()


def test_a_driver_stalled_longer_than_the_heartbeat_timeout_loses_no_worker(jobs, tmp_path):
    """Issue 10 #3: silence is judged over the driver's running time only."""
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    job = jobs(["run", "-np", "2", "--heartbeat-timeout", "3", "--host-discovery-script", str(hosts.script),
                *probe_cmd("--steps", "150")])
    job.wait_event("commit", rank=0, step=10)
    os.kill(job.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(5)  # > --heartbeat-timeout 3, < the workers' own 3 x 3 s patience
    finally:
        os.kill(job.proc.pid, signal.SIGCONT)
    assert job.finish(timeout=120) == 0, job.output()
    assert not any("stopped answering heartbeats" in line for line in job.lines), job.output()
    assert job.of("reset") == []
    assert any("the driver did not run for" in line for line in job.lines), job.output()


def test_the_first_round_forms_at_np_without_waiting_for_a_straggler(jobs, tmp_path):
    """Issue 10 #4: -np 2 --max-np 3 and a third worker that never reaches rendezvous."""
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    job = jobs(["run", "-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                sys.executable, str(PROBE), "--steps", "30"], env={"CE_PROBE_STRAGGLER": "127.0.0.3"})
    assert job.finish(timeout=120) == 0, job.output()  # well before --start-timeout (600 s)
    assert {e["size"] for e in job.of("done")} == {2}
