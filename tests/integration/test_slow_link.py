"""A slow network is seen, not only a slow computer (issue 42, part 3), with real processes on loopback hosts.

The worker on 127.0.0.3 gets the test hook CLOUD_ELASTIC_TEST_LINK_BYTES_PER_S: its Gloo operations
and its link probe wait as if its network moved 20 kB/s (some 30 ms per step, more than the 20 ms of
compute, so the job is faster without it), while its compute is as fast as the others'. The pairwise
probes name its host, it is drained at its next commit with no rollback, and the other two train on;
no worker is reported as a straggler.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.integration.events_check import of, read_events
from tests.integration.harness import REPO, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]  # its job waits up to 210 s


def test_a_worker_slow_only_in_its_sends_and_receives_is_drained_as_a_slow_network_and_the_others_are_not(
        jobs, tmp_path):
    events = tmp_path / "events.jsonl"
    stop = tmp_path / "stop"  # the job trains until the drain has happened (not a fixed number of steps)
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"),  # where `cloud-elastic status` finds the job
           "CE_PROBE_ENV": "127.0.0.3=CLOUD_ELASTIC_TEST_LINK_BYTES_PER_S=20000"}  # the slow link: 127.0.0.3's alone
    (tmp_path / "run").mkdir()
    job = jobs(["run", "-np", "3", "--min-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
                "--events-file", str(events), *probe_cmd("--steps", "20", "--step-sleep", "0.02", "--stop-when",
                                                         str(stop))], env=env)
    job.wait_for(lambda j: re.search(r"worker 127\.0\.0\.3\[0\]#\d+ left \(slow network", j.output()), timeout=90,
                 what="the worker with the slow network to leave")
    job.wait_for(lambda j: [e for e in j.of("commit") if e["size"] == 2], timeout=60, what="training on without it")

    def status() -> str:
        return subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "status", job.job_id()], cwd=REPO,
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=60).stdout

    # Each survivor's share of time in collectives shows once it has a few steps in the new round.
    deadline = time.monotonic() + 60
    while (shown := status()).count("% comm") < 2:
        assert time.monotonic() < deadline, f"status never showed both survivors' share of time in collectives:\n{shown}"
        time.sleep(0.5)
    assert re.search(r"127\.0\.0\.1 .*rank 0 training [\d.]+ ms/step \d+% comm", shown), shown
    stop.touch()
    assert job.finish() == 0, job.output()
    out = job.output()
    recorded = read_events(events)
    slow = of(recorded, "slow_link")
    assert len(slow) == 1 and slow[0]["host"] == "127.0.0.3", out
    assert slow[0]["mb_s"] * slow[0]["factor"] <= slow[0]["peers_mb_s"]
    assert sorted(slow[0]["peers"]) == ["127.0.0.1", "127.0.0.2"]
    assert 0 < slow[0]["comm_share"] <= 1  # every worker waited in collectives, and that alone named nobody
    assert not of(recorded, "straggler"), "its compute was as fast as the others'"
    left = [e for e in of(recorded, "worker_left") if e["host"] == "127.0.0.3"]
    assert left and left[0]["reason"].startswith("slow network: host 127.0.0.3")
    assert not [e for e in of(recorded, "worker_left") if e["host"] != "127.0.0.3"]
    assert not of(recorded, "rollback") and not [e for e in job.of("reset") if e["executed"] != e["step"]]
    line = next(line for line in job.lines if "slow network: host 127.0.0.3" in line and "leave at" in line)
    assert "MB/s" in line and "blacklisted" in line, line
    # No step was repeated: each survivor's commits only go up; both finish in a round of two.
    for worker in {e["worker"] for e in job.of("commit") if not e["worker"].startswith("127.0.0.3")}:
        steps = [e["step"] for e in job.of("commit") if e["worker"] == worker]
        assert steps == sorted(set(steps)), f"{worker} repeated steps: {steps}"
    done = job.of("done")
    assert {e["worker"].split("[")[0] for e in done} == {"127.0.0.1", "127.0.0.2"} and {e["size"] for e in done} == {2}
