"""Every worker failing right after the job's first commit resumes from its checkpoint (fixA's finding, fixH).

With --checkpoint-dir, a job whose every rank raised within a heartbeat (0.5 s) of the first commit ended "all
workers failed", though rank 0 had reported that commit's checkpoint saved: the driver learnt of commits only from
heartbeats. The report now counts as the commit it stores (driver/runtime/control_plane.py). A checkpoint spoilt
after its report is still never trained over: rank 0's load checks it, and the job ends naming it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

PROBE = [sys.executable, str(Path(__file__).with_name("first_commit_probe.py"))]


def run(jobs, tmp_path: Path, mode: str):
    events, checkpoints = tmp_path / "events.jsonl", tmp_path / "ckpt"
    return jobs(["run", "-np", "2", "-H", "localhost:2", "--elastic-timeout", "20", "--blacklist-cooldown-range",
                 "0.5", "0.5", "--checkpoint-dir", str(checkpoints), "--events-file", str(events),
                 *PROBE, str(events), mode, str(checkpoints)])


@pytest.mark.timeout(90)
def test_every_rank_raising_right_after_the_first_commit_resumes_from_its_checkpoint(jobs, tmp_path):
    job = run(jobs, tmp_path, "saved")
    assert job.finish(timeout=80) == 0, job.output()
    out = job.output()
    assert "all workers failed" not in out, out
    assert "resumed from the checkpoint of step 1 (" in out, out
    assert out.count("enters at batch 0") == 2 and out.count("enters at batch 1") == 2, out  # never from scratch
    assert out.count("done at batch 6") == 2, out


@pytest.mark.timeout(90)
def test_a_checkpoint_spoilt_after_its_report_is_not_trained_over(jobs, tmp_path):
    job = run(jobs, tmp_path, "spoilt")
    assert job.finish(timeout=80) == 1, job.output()
    out = job.output()
    last = next(line for line in reversed(job.lines) if " failed: " in line)
    assert "training state lost: cannot resume from the checkpoint: no usable checkpoint in " in last, out
    assert "resumed from" not in out and out.count("enters at batch") == 2, out  # the relaunched ranks never train
