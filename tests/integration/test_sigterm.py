"""SIGTERM to a worker inside ``elastic.run``, end to end: a request to leave at the next commit.

Three loopback "hosts" (127.0.0.1-3) of one slot each, real worker processes, and no
notice from anywhere but the signal (no metadata watcher, a static host list): what
a pod deletion or node drain that no watcher saw looks like from inside the pod.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.integration.harness import HostsFile, probe_cmd, worker_on

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
LEAVING = "127.0.0.3"


def _job(jobs, tmp_path: Path, *probe: str):
    hosts = HostsFile(tmp_path, HOSTS)
    return jobs(["run", "-np", "3", "--min-np", "1", "--host-discovery-script", str(hosts.script),
                 "--discovery-interval", "0.3", "--events-file", str(tmp_path / "events"), *probe_cmd(*probe)],
                env={"CLOUD_ELASTIC_TERM_GRACE_S": "45"})


def _events(tmp_path: Path, kind: str) -> list[dict]:
    lines = (tmp_path / "events").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_a_sigterm_to_a_worker_makes_it_leave_at_its_next_commit_with_zero_rollback(jobs, tmp_path):
    # --min-resets 1: the job trains on (committing every 5 steps) until the leave has happened.
    job = _job(jobs, tmp_path, "--steps", "30", "--commit-every", "5", "--min-resets", "1")
    job.wait_event("commit", rank=0, step=10)
    victim = worker_on(job.job_id(), LEAVING)
    os.kill(victim, signal.SIGTERM)
    assert job.finish(timeout=120) == 0, job.output()

    out = job.output()
    assert f"notice from sigterm for host {LEAVING}: SIGTERM to worker {LEAVING}" in out, out
    assert "SIGTERM: leaving at the next commit" in out
    resets = job.of("reset")
    assert resets and all(r["size"] == 2 for r in resets), resets
    assert all(r["executed"] == r["step"] for r in resets), f"survivors rolled back: {resets}"
    assert all(r["step"] % 5 == 0 for r in resets), resets  # the leaver left exactly at a commit
    done = job.of("done")
    assert len(done) == 2 and len({e["checksum"] for e in done}) == 1, out
    assert "training completed on 2 worker(s)" in job.lines[-1]

    [notice] = _events(tmp_path, "notice")
    assert (notice["source"], notice["host"], notice["action"]) == ("sigterm", LEAVING, "drain")
    assert 40 <= notice["deadline"] - notice["ts"] <= 46  # CLOUD_ELASTIC_TERM_GRACE_S ahead of the signal
    assert [e["host"] for e in _events(tmp_path, "worker_left")] == [LEAVING]
    assert not _events(tmp_path, "rollback") and not _events(tmp_path, "worker_failed")
    assert "0 steps lost" in out and f"host {LEAVING} drained" in out


def test_a_second_sigterm_ends_the_worker_at_once_and_the_survivors_take_the_failure_path(jobs, tmp_path):
    # A commit every 100 steps (5 s at the least): the second SIGTERM comes long before the leaver's next one, the
    # last (step 200), which the survivors reach after rolling back to step 100.
    job = _job(jobs, tmp_path, "--steps", "200", "--commit-every", "100")
    job.wait_event("commit", rank=0, step=100, timeout=120)
    victim = worker_on(job.job_id(), LEAVING)
    os.kill(victim, signal.SIGTERM)
    job.wait_for(lambda j: any("SIGTERM: leaving at the next commit" in line for line in j.lines), 60,
                 "the worker to say it leaves at its next commit")
    os.kill(victim, signal.SIGTERM)
    assert job.finish(timeout=120) == 0, job.output()

    # The leaver vanished mid-round, before its next commit (step 200): its peers took the failure path back to
    # the last one (a leave at a commit has no rollback), and the events say so: a failure, not a graceful leave
    # (0f42435), its slot not blamed.
    assert len(_events(tmp_path, "rollback")) == 1
    resets = job.of("reset")
    assert resets and all(r["size"] == 2 and r["step"] == 100 and r["executed"] >= 100 for r in resets), resets
    assert not _events(tmp_path, "worker_left")
    assert [e["host"] for e in _events(tmp_path, "worker_failed")] == [LEAVING]
    done = job.of("done")
    assert len(done) == 2 and {e["step"] for e in done} == {200} and len({e["checksum"] for e in done}) == 1


# A worker that waits at its first rendezvous for a peer that never comes (the peer's host sleeps first).
_WAITS_FOR_A_PEER = """
import os, sys, time
if os.environ["CLOUD_ELASTIC_HOSTNAME"] == "127.0.0.2":
    time.sleep(60)
import cloud_elastic.torch as hvd
hvd.init()
print("joined a round", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_sigterm_before_the_first_round_drains_the_host_and_the_worker_leaves_uncounted(jobs, tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(_WAITS_FOR_A_PEER)
    hosts = HostsFile(tmp_path, HOSTS[:2])
    job = jobs(["run", "-np", "2", "--min-np", "2", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.3", "--events-file", str(tmp_path / "events"), sys.executable, str(script)])
    ready = tmp_path / "events"
    job.wait_for(lambda j: ready.exists() and _events(tmp_path, "worker_ready"), 40, "127.0.0.1's worker at rendezvous")
    os.kill(worker_on(job.job_id(), HOSTS[0]), signal.SIGTERM)
    job.wait_for(lambda j: _events(tmp_path, "worker_left") or _events(tmp_path, "worker_failed"), 30,
                 "127.0.0.1's worker to end")
    job.kill()

    out = job.output()
    notices = [(e["source"], e["host"], e["action"]) for e in _events(tmp_path, "notice")]
    assert notices == [("sigterm", HOSTS[0], "drain")], out
    assert [e["host"] for e in _events(tmp_path, "worker_left")] == [HOSTS[0]], out
    assert not _events(tmp_path, "worker_failed") and "blacklisted" not in out, out
    assert "leaving the job" in out and "joined a round" not in out, out
