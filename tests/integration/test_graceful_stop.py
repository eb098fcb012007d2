"""Ctrl-C with ``--checkpoint-dir`` keeps the last commit: the workers stop at it, rank 0 checkpoints it, and the
newest checkpoint, which the same command resumes from, holds it. Found by review: the rerun resumed from the
last periodic checkpoint instead (step 154 of 220)."""

from __future__ import annotations

import os
import re
import signal

import pytest

from cloud_elastic.checkpoint.store import CheckpointStore
from tests.integration.harness import probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


# SIGHUP: the terminal of a driver started over ssh closes. Before (review h13) it killed the driver with no last line.
@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "interrupted by SIGINT"),
                                             (signal.SIGHUP, 129, r"hung up \(SIGHUP\)")], ids=["SIGINT", "SIGHUP"])
def test_a_signal_checkpoints_the_last_commit_and_the_newest_checkpoint_holds_it(jobs, tmp_path, sig, code, said):
    # One checkpoint an hour: the only periodic one is of the first commit.
    # --verbose: the driver says when its workers' heartbeats first told of a commit.
    args = ["run", "--verbose", "-np", "2", "-H", "127.0.0.2:1,127.0.0.3:1", "--checkpoint-dir",
            str(tmp_path / "ckpt"), "--checkpoint-interval", "3600",
            *probe_cmd("--steps", "100000", "--step-sleep", "0.02")]
    job = jobs(args)
    # The earliest a stop can keep anything (before it, a stop ends at once: see
    # test_a_signal_before_any_commit_ends_the_job_at_once); the pace of commits is not known yet, so it waits.
    job.wait_for(lambda j: any(": first commit seen (worker " in line for line in j.lines), 30, "the first commit")
    os.kill(job.proc.pid, sig)
    assert job.finish(timeout=40) == code, job.output()
    ends = [m for line in job.lines if (m := re.search(
        rf"interrupted: {said}; checkpoint of step (\d+) written; the same command resumes from it$", line))]
    assert len(ends) == 1, job.output()
    step = int(ends[0][1])
    assert step >= max(e["step"] for e in job.of("commit", rank=0))  # no commit made is lost

    # What the same command resumes from: the newest checkpoint there (its resume is test_durable's).
    latest = CheckpointStore(str(tmp_path / "ckpt")).latest()
    assert latest is not None and latest.info.step == step


def test_a_driver_started_under_nohup_trains_on_through_a_hang_up(jobs, tmp_path):
    """Review h15: the SIGHUP handler replaced the ignore that nohup had set, and a hang-up stopped the job."""
    import subprocess
    import sys

    from tests.integration.harness import CLI

    args = [*CLI, "run", "-np", "1", "-H", "127.0.0.2:1", sys.executable, "-c",
            "import time; print('started', flush=True); time.sleep(4)"]
    proc = subprocess.Popen(["nohup", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}, start_new_session=True)
    try:
        seen = []
        while not any("started" in line for line in seen):  # the worker runs (bounded by the test's timeout)
            seen.append(proc.stdout.readline())
            assert seen[-1], seen
        os.kill(proc.pid, signal.SIGHUP)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()

