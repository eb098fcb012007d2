"""Workers that fail the same way again and again without progress end the job (driver/job/repeats.py).

Each job here would otherwise go round for ever (the reviewer's f1, f2 and f3 ran until SIGINT): a slot
relaunched after each crash at the same step, a resume from the checkpoint that fails again, a round that
stalls, re-forms unchanged and stalls again. Each ends with exit 1 and one line naming what failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PROBE = [sys.executable, str(Path(__file__).with_name("repeat_probe.py"))]
TWO = ["-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--blacklist-cooldown-range", "1", "1"]
BUG = "ValueError: user bug at step 3"


def end_line(job) -> str:
    return next(line for line in reversed(job.lines) if " failed: " in line)


def test_a_slot_that_crashes_at_the_same_step_each_time_is_blacklisted_for_good_and_the_job_fails(jobs):
    job = jobs(["run", *TWO, "--min-np", "2", "--elastic-timeout", "3", *PROBE, "rank1"])
    assert job.finish(timeout=75) == 1, job.output()
    line = end_line(job)
    # A fixed -H list ends at once once a slot is blocked for good below --min-np (driver.job.capacity).
    assert "1 slot(s) left for --min-np 2: 127.0.0.3[0] blacklisted for the rest of the job" in line, line
    assert f"exited with code 1: {BUG}" in line, line
    assert "127.0.0.3[0] is blacklisted for the rest of the job: it failed 3 times in a row at commit 2" in line, line
    failures = [x for x in job.lines if f"(rank 1) exited with code 1: {BUG}; slot 127.0.0.3[0] blacklisted" in x]
    assert len(failures) == 3, job.output()  # relaunched twice, never a fourth time


def test_a_bug_on_every_rank_with_a_checkpoint_dir_fails_instead_of_resuming_for_ever(jobs, tmp_path: Path):
    job = jobs(["run", *TWO, "--min-np", "1", "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--checkpoint-interval", "0.1", *PROBE, "all"])
    assert job.finish(timeout=75) == 1, job.output()
    line = end_line(job)
    assert "every worker failed, " in line and "time(s) in a row at commit 2" in line, line
    assert "without getting further" in line, line
    assert f"exited with code 1: {BUG}" in line, line


def test_a_collective_that_never_completes_ends_the_job_naming_it(jobs):
    job = jobs(["run", *TWO, "--min-np", "1", "--progress-timeout", "5", *PROBE, "mismatch"])
    assert job.finish(timeout=75) == 1, job.output()
    line = end_line(job)
    assert "stalled 3 times in a row at commit 2 with the same 2 worker(s)" in line, line
    assert "rank 0 collective #" in line and "(allreduce" in line, line
    assert "stacks of worker" in job.output()
