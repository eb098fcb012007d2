"""A worker that dies during a state sync loses nothing: the others go back to exactly their last commit.

Two workers train in the default commit mode (commits kept in place) with an
optimizer that keeps state; a newcomer is added by discovery, and at the
commit that admits it the three sync from rank 0. The newcomer (or rank 0,
the root) dies at a point of that sync (``sync_probe.py``). The workers left
must resume from the commit they made before the sync, bitwise (model,
optimizer state, step), and finish the job. Before, a sync made rank 0 load
a copy of its own optimizer state, and the worker that already held rank 0's
commit load the copy it received: their in-place commits were then
"replaced", and a failure later in the sync ended the job with "training
state lost" (the soak benchmark saw it twice in 60-100 resets). Even a
newcomer dead at the start of the parameters' broadcast did harm: rank 0's
broadcast reached 127.0.0.2 before it failed on the newcomer, and 127.0.0.2
wrote what it received into its parameters (a packed chunk's copy-back).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.integration.harness import HostsFile

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("full_sync")]

PROBE = str(Path(__file__).with_name("sync_probe.py"))
OLD = ["127.0.0.1", "127.0.0.2"]
NEWCOMER = "127.0.0.3"


def run_job(jobs, tmp_path, optimizer: str, victim: str, point: str, *extra: str, wide: bool = False):
    hosts = HostsFile(tmp_path, OLD)
    job = jobs(["run", "-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", "--blacklist-cooldown-range", "600", "600", "--start-timeout", "120",
                *extra, sys.executable, PROBE, "--optimizer", optimizer, "--victim", victim, "--point", point,
                *(["--wide"] if wide else [])])
    job.wait_event("commit", step=3, size=2)
    hosts.set([*OLD, NEWCOMER])
    return job


def check_resumed_exactly(job, survivors: list[str], steps: int) -> None:
    out = job.output()
    assert "training state lost" not in out, out[-4000:]
    assert "cannot restore the last commit exactly" not in out, out[-4000:]
    assert not [e for e in job.events if e.kind == "resumed" and e["size"] == 3], "a sync of three completed"
    for host in survivors:
        mine = [e for e in job.events if e.data.get("host") == host]
        interrupted = [e for e in mine if e.kind == "commit" and e.data.get("interrupted")]
        assert len(interrupted) == 1, interrupted  # the commit that admitted the newcomer; its sync failed
        resumed = [e for e in mine if e.kind == "resumed"][1:]  # the first one is the start
        assert [(e["step"], e["size"]) for e in resumed] == [(interrupted[0]["step"], 2)], resumed
        assert resumed[0]["checksum"] == interrupted[0]["checksum"], "resumed from a state never committed"
        done = next(e for e in mine if e.kind == "done")
        assert done["step"] == max(steps, resumed[0]["step"]) and done["size"] == 2, done


@pytest.mark.timeout(200)
@pytest.mark.parametrize("point", ["parameters", "optimizer", "attributes"])
def test_a_newcomer_killed_during_its_state_sync_leaves_the_others_at_their_last_commit(jobs, tmp_path, point):
    job = run_job(jobs, tmp_path, "adamw", NEWCOMER, point)
    assert job.finish(timeout=180) == 0, job.output()[-4000:]
    assert "killed by signal 9" in job.output()
    check_resumed_exactly(job, OLD, 12)


@pytest.mark.timeout(200)
def test_a_newcomer_stopped_during_its_state_sync_is_given_up_and_the_others_resume_exactly(jobs, tmp_path):
    job = run_job(jobs, tmp_path, "sgd-momentum", NEWCOMER, "stop", "--heartbeat-timeout", "5", wide=True)
    stopped = job.wait_event("stopping", timeout=120)
    try:
        assert job.finish(timeout=180) == 0, job.output()[-4000:]
    finally:
        try:
            os.kill(stopped["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert "stopped answering heartbeats" in job.output()
    check_resumed_exactly(job, OLD, 12)


@pytest.mark.timeout(200)
def test_the_root_killed_during_a_state_sync_leaves_the_worker_that_held_its_commit_able_to_restore_it(jobs, tmp_path):
    # 127.0.0.2 held rank 0's very commit and sent its part of the model to the newcomer before rank 0 died
    # (as the optimizer state's tensors were to go): it must still restore that commit exactly, and give it to
    # the newcomer.
    job = run_job(jobs, tmp_path, "adam", OLD[0], "optimizer", wide=True)
    assert job.finish(timeout=180) == 0, job.output()[-4000:]
    check_resumed_exactly(job, OLD[1:], 12)
    newcomer = [e for e in job.events if e.data.get("host") == NEWCOMER and e.kind == "resumed"]
    survivor = [e for e in job.events if e.data.get("host") == OLD[1] and e.kind == "resumed"]
    assert [e["checksum"] for e in newcomer] == [survivor[-1]["checksum"]]
