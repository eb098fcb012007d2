"""Rank 0 lost at the end of training while rank 1, returned at the last commit, waits for it (checkpoint review
s56, kill_final.py / kill_eval.py): rank 1 holds the final state and writes it; the job fails saying the same
command resumes there, and the rerun starts at the last commit instead of retraining from an older checkpoint."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PROBE = Path(__file__).parent / "final_state_probe.py"
STEPS = 12


def _run(jobs, ckpt: Path, eval_s: float):
    return jobs(["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(ckpt),
                 "--checkpoint-interval", "600", sys.executable, str(PROBE), "--steps", str(STEPS),
                 "--eval-s", str(eval_s)])


def test_rank_0_killed_in_its_evaluation_after_the_last_commit_leaves_the_final_state_in_a_checkpoint(jobs, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = _run(jobs, ckpt, eval_s=8)
    pid = int(job.wait_for(lambda j: next((m.group(1) for line in j.lines
                                           if (m := re.search(r"LOOP_DONE rank=0 step=\d+ pid=(\d+)", line))), None),
                           40, "rank 0's loop to end"))
    job.wait_for(lambda j: "returned from its training function at commit" in j.output(), 20, "rank 1 to park")
    os.kill(pid, signal.SIGKILL)
    assert job.finish(40) == 1, job.output()
    out = job.output()
    assert (f"rank 0 was lost after the training loop's last commit (#{STEPS}) while others had returned; the final "
            f"state is in the checkpoint (step {STEPS})") in job.lines[-1], out
    assert "cannot rejoin" not in out and "every worker that held" not in out and "resumed from" not in out, out
    assert CheckpointStore(str(ckpt)).list()[0].step == STEPS
    rerun = _run(jobs, ckpt, eval_s=0)
    assert rerun.finish(60) == 0, rerun.output()
    assert f"START rank=0 step={STEPS}" in rerun.output(), rerun.output()
