"""A plain Horovod script (no ``hvd.elastic.run``) runs as a fixed-size job (issue 44, finding 11).

``plain_horovod.py`` calls ``hvd.init()``, ``broadcast_parameters`` and ``DistributedOptimizer`` as most
Horovod scripts do. Every worker exiting 0 is the job's success; a failure fails it with its reason,
blacklisting nothing, or with ``--restarts N`` restarts it whole, and the script's own checkpoint
resumes it (as torchrun does).
"""

from __future__ import annotations

import sys

import pytest

from tests.integration.events_check import of, read_events
from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

PLAIN = REPO / "tests" / "integration" / "plain_horovod.py"


def plain(*args: str) -> list[str]:
    return [sys.executable, str(PLAIN), *args]


def _hosts(n: int) -> str:
    return ",".join(f"127.0.0.{i}:1" for i in range(1, n + 1))


def test_a_plain_horovod_script_succeeds_when_every_worker_exits_0(jobs, tmp_path):
    events = tmp_path / "events.jsonl"
    job = jobs(["run", "-np", "2", "-H", _hosts(2), "--events-file", str(events), *plain("--steps", "12")])
    assert job.finish() == 0, job.output()
    assert "training completed on 2 worker(s), every one exiting 0" in job.lines[-1], job.output()
    done = job.of("done")
    assert sorted(e["rank"] for e in done) == [0, 1] and all(e["step"] == 12 for e in done)
    assert len({e["checksum"] for e in done}) == 1, "the ranks' parameters differ"
    out = job.output()
    assert "all workers failed" not in out and "blacklisted" not in out, out
    assert not of(read_events(events), "worker_failed")


def test_a_plain_horovod_script_that_raises_fails_the_job_with_its_reason(jobs, tmp_path):
    events = tmp_path / "events.jsonl"
    job = jobs(["run", "-np", "2", "-H", _hosts(2), "--events-file", str(events),
                *plain("--steps", "40", "--fail-at-step", "4", "--only-slot", "127.0.0.2")])
    assert job.finish() == 1, job.output()
    last = job.lines[-1]
    assert "worker 127.0.0.2[0]" in last and "exited with code 1: RuntimeError: the script failed at step 4" in last, last
    assert "a fixed-size job" in last, last
    out = job.output()
    assert "all workers failed" not in out and "blacklisted" not in out, out
    recorded = read_events(events)
    failures = of(recorded, "worker_failed")
    # Both exits are recorded, in the order the driver reaped them (the peer's may come first: its collective
    # fails as the failing worker's sockets close); none blacklists its slot. The job's reason is the root cause.
    assert "127.0.0.2" in {e["host"] for e in failures}, failures
    assert all(e["blacklisted_s"] is None for e in failures), failures
    finished = of(recorded, "job_finished")
    assert len(finished) == 1 and finished[0]["outcome"] == "failed", finished
    assert "127.0.0.2[0]" in finished[0]["reason"] and "the script failed at step 4" in finished[0]["reason"], finished
    assert not [e for e in job.of("done")], "a worker trained on to the end after its peer failed"



def test_restarts_start_a_failed_plain_script_again_and_its_checkpoint_resumes_it(jobs, tmp_path):
    ckpt, once = tmp_path / "model.pt", tmp_path / "failed-once"
    job = jobs(["run", "-np", "2", "-H", _hosts(2), "--restarts", "2",
                *plain("--steps", "16", "--checkpoint", str(ckpt), "--fail-at-step", "6", "--only-slot",
                       "127.0.0.2", "--fail-once", str(once))])
    assert job.finish() == 0, job.output()
    assert "training completed on 2 worker(s), every one exiting 0 after 1 restart(s)" in job.lines[-1], job.output()
    assert "restart 1 of 2" in job.output()
    hellos = job.of("hello")
    assert len(hellos) == 4 and len({e["worker"] for e in hellos}) == 4  # two attempts, new workers each time
    resumed = [e["start"] for e in hellos[2:]]
    assert resumed[0] == resumed[1] >= 5, hellos  # the second attempt resumed from the script's checkpoint
    done = job.of("done")
    assert len(done) == 2 and len({e["checksum"] for e in done}) == 1
