"""A member whose training function returned before rank 0's (review s58 rvH, findings 1, 2 and 4), real processes.

1. Rank 1's data ends first and it evaluates locally; rank 0's next allreduce times out waiting for it and rank 0
   rolls back to rendezvous; then rank 1 returns. It used to complete the job as "succeeded" at rank 1's step, rank
   0 sent away with its data unfinished.
2. Rank 1 returned at the last commit; rank 0 sits in its function without progress until --progress-timeout aborts
   the round and gives it up. Rank 1 used to be sent away unwritten and the job to fail resuming from step 1.
4. Rank 1, returned at the last commit, is SIGKILLed while rank 0 evaluates: it used to be a mid-training loss
   (blacklisted, replaced) and the job "succeeded".

Review s58 rvN finding 1: rank 1's data ends first (an early return) and it is lost while parked, rank 0 waiting for it
in its next allreduce: the fix of 4 failed that healthy job after rank 0 trained to its end.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PROBE = Path(__file__).parent / "final_state_probe.py"
STEPS = 12


def _pid(job, rank: int) -> int:
    pattern = rf"LOOP_DONE rank={rank} step=\d+ pid=(\d+)"
    return int(job.wait_for(lambda j: next((m.group(1) for line in j.lines if (m := re.search(pattern, line))), None),
                            60, f"rank {rank}'s loop to end"))


def test_a_peer_returning_while_rank_0_is_back_at_rendezvous_leaves_and_rank_0_trains_to_its_end(jobs):
    # Rank 1's loop ends at step 6 and it evaluates 8 s; rank 0's step-7 allreduce times out after 2 s.
    job = jobs(["run", "-np", "2", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1",
                "--blacklist-cooldown-range", "600", "600", "-x", "CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S",
                sys.executable, str(PROBE), "--steps", str(STEPS), "--short-steps", "6", "--eval1", "8"],
               env={"CLOUD_ELASTIC_COLLECTIVE_TIMEOUT_S": "2"})
    assert job.finish(80) == 0, job.output()
    out = job.output()
    assert "rank 1 (127.0.0.2[0]#2) finished training" not in out, out
    assert "leaving the job: returned from its training function" in out, out
    assert f"END rank=0 step={STEPS}" in out and "END rank=1" not in out, out
    assert "succeeded: training completed on 1 worker(s)" in job.lines[-1], out


def test_a_peer_at_the_last_commit_writes_it_when_rank_0_is_given_up_by_the_progress_timeout(jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--progress-timeout", "5",
                "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "600",
                sys.executable, str(PROBE), "--steps", str(STEPS), "--eval-s", "120"])
    assert job.finish(80) == 1, job.output()
    out = job.output()
    assert "cannot rejoin" not in out, out
    assert (f"rank 0 was lost after the training loop's last commit (#{STEPS}) while others had returned; the final "
            f"state is in the checkpoint (step {STEPS})") in job.lines[-1], out
    assert CheckpointStore(str(ckpt)).list()[0].step == STEPS


def test_a_parked_peer_killed_while_rank_0_evaluates_fails_the_job_naming_it(jobs):
    job = jobs(["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1",
                sys.executable, str(PROBE), "--steps", str(STEPS), "--eval-s", "6"])
    pid = _pid(job, 1)
    job.wait_for(lambda j: "returned from its training function at commit" in j.output(), 30, "rank 1 to park")
    os.kill(pid, signal.SIGKILL)
    assert job.finish(60) == 1, job.output()
    out = job.output()
    assert f"END rank=0 step={STEPS}" in out, out  # rank 0 finished its evaluation and its script
    assert re.search(r"rank 0 finished training, but worker 127\.0\.0\.2\[0\]#\d+ \(rank 1\) killed by signal 9 after "
                     rf"its training function returned \(commit {STEPS}", job.lines[-1]), out
    assert "blacklisted" not in out, out


def test_a_parked_early_returner_lost_while_rank_0_trains_on_leaves_and_the_job_succeeds(jobs):
    # Rank 1's loop ends at step 6 and it parks; its host is lost at once (SIGSTOP: silent, connections open) while
    # rank 0 waits for it in its step-7 allreduce. It used to fail: "rank 0 finished training, but worker ...
    # (rank 1) stopped answering heartbeats ... after its training function returned (commit 6 ...)".
    job = jobs(["run", "-np", "2", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1",
                "--blacklist-cooldown-range", "600", "600",
                sys.executable, str(PROBE), "--steps", str(STEPS), "--short-steps", "6"])
    pid = _pid(job, 1)
    job.wait_for(lambda j: "returned from its training function at commit" in j.output(), 30, "rank 1 to park")
    os.kill(pid, signal.SIGSTOP)
    try:
        assert job.finish(60) == 0, job.output()
    finally:
        if os.path.exists(f"/proc/{pid}"):  # the driver stops it as it ends: this is for a failed assertion
            os.kill(pid, signal.SIGKILL)
    out = job.output()
    assert f"END rank=0 step={STEPS}" in out and "END rank=1" not in out, out
    assert "after returning early from its training function (commit 6" in out, out
    assert "succeeded: training completed on 1 worker(s)" in job.lines[-1], out
