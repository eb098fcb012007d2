"""A job that finishes while the round planned to admit a newcomer still forms its group in the background
(``worker.rounds.next_group``): the formation is cancelled and every worker exits as its script ended.

Before, the driver kept offering the plan while the job finished, so a member's heartbeat started the
formation again after its exit hook had dropped it; the interpreter then finalized under that thread, inside
torch's C++ (``terminate called without an active exception``, SIGABRT), and the job failed although rank 0
had finished training.

Here the job commits rarely, so the plan that admits the newcomer is formed and armed but not switched to
when rank 0 returns (the newcomer waits in its state sync on the plan's group), and every worker's script has
an exit hook of its own that keeps it 3 s past the library's, its heartbeats going on meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.harness import HostsFile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

OLD = ["127.0.0.1", "127.0.0.2"]
NEWCOMER = "127.0.0.3"
PROBE = Path(__file__).with_name("finish_probe.py")


def test_a_job_that_finishes_while_its_planned_round_forms_succeeds(jobs, tmp_path):
    hosts = HostsFile(tmp_path, OLD)
    stop = tmp_path / "stop"
    job = jobs(["run", "-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", "--blacklist-cooldown-range", "600", "600",
                sys.executable, str(PROBE), "--stop-when", str(stop), "--commit-every", "1000",
                "--exit-hook-s", "3"])
    job.wait_event("hello", rank=0)
    hosts.set([*OLD, NEWCOMER])
    job.wait_for(lambda j: "round 2 formed in the background (plan 1)" in j.output(), 30, "the plan formed")
    stop.touch()
    assert job.finish(45) == 0, job.output()[-6000:]
    out = job.output()
    assert "Aborted" not in out and "terminate called" not in out, out[-6000:]
    assert "finished training" in out and len(job.of("done")) == 2, out[-6000:]
