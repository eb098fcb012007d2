"""Honest endings: a job succeeds only when rank 0 finished and every finished worker exited 0, and a
round that stops making progress while its members still heartbeat is aborted, not waited out."""

from __future__ import annotations

import sys

import pytest

from cloud_elastic.checkpoint import CheckpointStore
from tests.integration.events_check import of, read_events
from tests.integration.harness import probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _hosts(n: int) -> str:
    return ",".join(f"127.0.0.{i}:1" for i in range(1, n + 1))


def test_a_worker_that_fails_after_training_fails_the_job_and_keeps_the_checkpoints(jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = jobs(["run", "-np", "2", "-H", _hosts(2), "--checkpoint-dir", str(ckpt),
                *probe_cmd("--steps", "8", "--fail-after-training")])
    assert job.finish() == 1, job.output()
    last = job.lines[-1]
    assert "rank 0 finished training, but worker" in last, job.output()
    assert "exited with code 1 after its training function returned" in last and "commit 8" in last, last
    # ... and why: the error its script said it exits with, as a failure before returning says it.
    assert "8 optimizer step(s)): RuntimeError: the final save failed (--fail-after-training)" in last, last
    assert "succeeded" not in job.output()
    assert len(job.of("done")) == 2  # training itself did finish
    assert CheckpointStore(str(ckpt)).list()[0].step == 8  # the final checkpoint stays where it was written


def test_a_member_that_returns_while_rank_0_trains_leaves_and_rank_0_finishes(jobs, tmp_path):
    events = tmp_path / "events.jsonl"
    # --heartbeat-timeout 20: the leaver's exit must be seen as such; a slow teardown is covered by its
    # `exiting` message (docs/architecture/worker.md, "At exit"), and this is the margin should that message be late.
    job = jobs(["run", "-np", "3", "--min-np", "1", "-H", _hosts(3), "--events-file", str(events),
                "--blacklist-cooldown-range", "600", "600", "--heartbeat-timeout", "20",
                *probe_cmd("--steps", "24", "--return-at-step", "6", "--only-slot", "127.0.0.3")])
    assert job.finish() == 0, job.output()
    out = job.output()
    assert "returned from its training function at commit 6" in out and "while rank 0" in out, out
    assert "sized for another world size" in out
    left = [e for e in of(read_events(events), "worker_left") if e.get("early_return")]
    assert len(left) == 1 and left[0]["host"] == "127.0.0.3" and left[0]["commit_step"] == 6, left
    # The others went on without it, from their last commit, and rank 0 finished all 24 steps.
    assert not [e for e in job.of("done") if e["worker"].startswith("127.0.0.3[0]#3")]
    done = {e["worker"].split("[")[0]: e for e in job.of("done")}
    assert done["127.0.0.1"]["step"] == 24 and done["127.0.0.1"]["rank"] == 0
    resumed = [e for e in job.of("reset") if e["size"] == 2]
    assert resumed and all(e["step"] >= 6 for e in resumed), "the survivors lost committed steps"
    assert "training completed" in job.lines[-1]


def test_a_round_stuck_in_a_blocked_worker_is_aborted_after_its_stacks_and_the_job_goes_on(jobs, tmp_path):
    events = tmp_path / "events.jsonl"
    job = jobs(["run", "-np", "3", "--min-np", "1", "-H", _hosts(3), "--events-file", str(events),
                "--progress-timeout", "6", "--blacklist-cooldown-range", "600", "600",
                *probe_cmd("--steps", "16", "--block-at-step", "5", "--only-slot", "127.0.0.3")])
    assert job.finish() == 0, job.output()
    out = job.output()
    recorded = read_events(events)
    stalled = of(recorded, "round_stalled")
    # First the round (no member progressed), then the blocked member (the abort could not reach it).
    assert [e["round"] for e in stalled] == [1, 1], stalled
    assert all(e["idle_s"] >= 6 for e in stalled)
    assert [w.split("[")[0] for w in stalled[1]["workers"]] == ["127.0.0.3"], stalled
    # The stacks each member sent over the control plane when the round stalled (the blocked one is also
    # asked by signal before it is killed: test_health checks those).
    stacks = {e["host"]: e["text"] for e in of(recorded, "stacks") if e.get("via") != "signal"}
    # The blocked worker's training thread is in its step, outside any collective; rank 0 waits for it
    # in the gradient allreduce.
    assert "in one_step" in stacks["127.0.0.3"] and "_ce_wait_buckets" not in stacks["127.0.0.3"], stacks
    assert "_ce_wait_buckets" in stacks["127.0.0.1"], stacks
    assert "stacks of worker 127.0.0.3[0]" in out  # the same stacks are in the driver's log
    assert "did not come back to rendezvous within" in out
    failed = [e for e in of(recorded, "worker_failed") if e["host"] == "127.0.0.3"]
    assert failed and "did not come back to rendezvous" in failed[0]["reason"]
    done = job.of("done")
    assert {e["step"] for e in done} == {16} and len({e["checksum"] for e in done}) == 1
    assert {e["worker"].split("[")[0] for e in done} == {"127.0.0.1", "127.0.0.2"}


_SLOW_EXIT = """
import atexit, sys, time
if sys.argv[1] == "hook":
    atexit.register(time.sleep, 8)  # registered first, so it runs after cloud-elastic's own exit hook
else:
    class SlowTeardown:
        def __del__(self):
            time.sleep(8)  # in the interpreter's teardown, after every exit hook: no thread runs but this one
    slow = SlowTeardown()
import cloud_elastic.torch as hvd
hvd.init()
hvd.allreduce(__import__("torch").ones(1))
print("EVENT", flush=True)
"""


@pytest.mark.parametrize("slow_in", ["hook", "teardown"])
def test_a_worker_that_is_slow_to_exit_is_not_taken_for_a_silent_one(jobs, tmp_path, slow_in):
    """Exiting (atexit hooks, the interpreter's teardown) can outlast the heartbeat timeout on a loaded
    machine: the worker keeps answering heartbeats through the exit hooks and then says it is exiting,
    so that the job ends with what really happened (here: a script without elastic.run whose workers both
    exit 0, a fixed-size job that succeeds), not "stopped answering heartbeats"."""
    script = tmp_path / "slow_exit.py"
    script.write_text(_SLOW_EXIT)
    job = jobs(["run", "-np", "2", "-H", _hosts(2), "--heartbeat-timeout", "3", sys.executable, str(script), slow_in])
    assert job.finish() == 0, job.output()
    assert "training completed on 2 worker(s), every one exiting 0" in job.lines[-1], job.output()
    assert "stopped answering heartbeats" not in job.output(), job.output()
