"""Horovod's loop with a deterministic bug ends after three repeats; jobs that get further each time never do.

Horovod's elastic loop (``for state.batch in range(state.batch, ...): ...; state.commit()``) redoes the committed
batch after every restore and commits it again before the bug recurs, so the job's commit never repeats: guards
keyed on it let the job retrain the same batch for ever (review s60 rvS: 58 identical failures in 150 s, rc 124;
rvV: every rank raising with --checkpoint-dir, 116 failures in 200 s). The guards now measure progress by the
states committed (driver/job/repeats.py, ``Trained``): a redone batch is no progress. A job that gains one commit
per relaunch, failing in a different way each time, is progress (the first fix, reverted, stopped those: rvV's
rare_commit, rare_hang and all_lost): each of those must complete.
"""

from __future__ import annotations

import re

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

PROBE = [sys.executable, str(Path(__file__).with_name("horovod_loop_probe.py"))]
TWO = ["-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--min-np", "2", "--elastic-timeout", "20",
       "--blacklist-cooldown-range", "0.5", "0.5"]


def end_line(job) -> str:
    return next(line for line in reversed(job.lines) if " failed: " in line)


@pytest.mark.timeout(60)
def test_a_rank_raising_at_the_same_batch_of_horovods_loop_is_blacklisted_at_its_third_failure(jobs):
    job = jobs(["run", *TWO, *PROBE, "raise"])
    assert job.finish(timeout=50) == 1, job.output()
    line = end_line(job)
    assert ("127.0.0.3[0] is blacklisted for the rest of the job: it failed 3 times in a row at commit 5, with no "
            "commit that moved the state on in between") in line, line
    assert "exited with code 1: ValueError: poison sample in batch 3" in line, line
    relaunch = "(rank 1) exited with code 1: ValueError: poison sample in batch 3; slot 127.0.0.3[0] blacklisted"
    assert len([x for x in job.lines if relaunch in x]) == 3, job.output()  # relaunched twice, never a third time


@pytest.mark.timeout(60)
def test_every_rank_raising_at_the_same_batch_with_a_checkpoint_dir_ends_instead_of_resuming_for_ever(jobs, tmp_path):
    # Each attempt resumes from the checkpoint of the one before, whose first commit redid batch 0: the checkpoint's
    # step grows, its state does not.
    job = jobs(["run", *TWO, "--checkpoint-dir", str(tmp_path / "ckpt"), *PROBE, "all"])
    assert job.finish(timeout=50) == 1, job.output()
    assert "resumed from the checkpoint of step 2" in job.output(), job.output()
    line = end_line(job)
    # Which count gets there first depends on when the driver first heard a worker's own fingerprint (a heartbeat
    # after two commits of one process): every slot blacklisted for its third failure, or the job's third loss.
    assert ("failed 3 times in a row at commit " in line and "with no commit that moved the state on" in line
            or re.search(r"every worker failed, [34] time\(s\) in a row at commit", line)), line
    assert "exited with code 1: ValueError: poison sample in batch 3" in line, line
    assert job.output().count("lost every worker; waiting") <= 4, job.output()


@pytest.mark.timeout(90)
def test_a_collective_only_rank_0_runs_in_horovods_loop_ends_the_job_at_the_third_stall(jobs):
    job = jobs(["run", *TWO, "--progress-timeout", "5", *PROBE, "stall"])
    assert job.finish(timeout=80) == 1, job.output()
    line = end_line(job)
    assert "round 3 stalled 3 times in a row at commit 5 with the same 2 worker(s)" in line, line
    assert "rank 0 collective #" in line and "(allreduce loss)" in line and "(broadcast)" in line, line


@pytest.mark.timeout(120)
def test_a_rank_deadlocked_at_the_same_batch_of_horovods_loop_ends_the_job_at_its_third_give_up(jobs):
    job = jobs(["run", *TWO, "--progress-timeout", "5", *PROBE, "hang"])
    assert job.finish(timeout=110) == 1, job.output()
    line = end_line(job)
    assert ("no progress: worker 127.0.0.3[0] (rank 1) was given up 3 times in a row at commit 5, its process still "
            "running each time and no commit that moved the state on in between") in line, line
    assert 'horovod_loop_probe.py", line ' in line and "raise --progress-timeout" in line, line


def trained_to_the_end(job) -> None:
    assert "done at batch 16" in job.output() and "for the rest of the job" not in job.output(), job.output()
    assert job.output().count("done at batch 16") == 2, job.output()


@pytest.mark.timeout(60)
def test_a_rank_failing_each_relaunch_one_commit_further_with_other_errors_trains_to_the_end(jobs):
    """rvV's rare_commit.sh: one commit (4 batches) gained per relaunch, three failures of rank 1."""
    job = jobs(["run", *TWO, *PROBE, "rare"])
    assert job.finish(timeout=50) == 0, job.output()
    trained_to_the_end(job)
    failures = [x for x in job.lines if "(rank 1) exited with code 1: " in x and "blacklisted for" in x]
    assert len(failures) == 3, job.output()


@pytest.mark.timeout(60)
def test_every_rank_failing_each_attempt_one_checkpoint_further_trains_to_the_end(jobs, tmp_path):
    """rvV's all_lost.sh: with --checkpoint-dir, every commit checkpointed, every rank fails 6 batches into each
    attempt; each attempt resumes one checkpoint further."""
    job = jobs(["run", *TWO, "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "0.01",
                *PROBE, "rare_all"])
    assert job.finish(timeout=50) == 0, job.output()
    trained_to_the_end(job)
    # Every attempt lost every worker, so each next round starts from the newest checkpoint, one further each time.
    # Not counted by "lost every worker" lines: where the second rank's exit is read after the first one's
    # replacement was launched (a clean clone under load), the driver is never left with none in that attempt.
    resumed = [int(x.split("resumed from the checkpoint of step ")[1].split()[0]) for x in job.lines
               if "resumed from the checkpoint of step " in x]
    assert resumed == [1, 2, 3], job.output()
    assert sum("formed with 2 worker(s) (sync=True, from the latest checkpoint)" in x for x in job.lines) == 3


@pytest.mark.timeout(120)
def test_a_rank_stuck_each_relaunch_one_commit_further_trains_to_the_end(jobs):
    """rvV's rare_hang.sh: rank 1 stuck on a read 6 batches into each process, given up three times."""
    job = jobs(["run", *TWO, "--progress-timeout", "5", *PROBE, "rare_hang"])
    assert job.finish(timeout=110) == 0, job.output()
    trained_to_the_end(job)
    assert job.output().count("rank 1 stuck on a read at batch") == 3, job.output()
