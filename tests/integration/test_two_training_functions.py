"""A second ``hvd.elastic.run`` function in the same script (fine-tuning after pre-training) is elastic too:
a worker lost in it costs a rollback, not the job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PROBE = Path(__file__).with_name("two_runs_probe.py")


def test_a_worker_killed_in_the_second_training_function_is_survived_and_the_job_succeeds(jobs, tmp_path):
    job = jobs(["run", "-np", "2", "--min-np", "1", "-H", "127.0.0.1:1,127.0.0.2:1",
                "--blacklist-cooldown-range", "600", "600",
                sys.executable, str(PROBE), "--kill-at-step", "7", "--only-slot", "127.0.0.2",
                "--mark", str(tmp_path / "killed")])
    assert job.finish(timeout=45) == 0, job.output()
    assert (tmp_path / "killed").exists()  # the worker did die in fine-tuning
    out = job.output()
    assert "entered hvd.elastic.run again" in out and "round 1 aborted" in out, out
    finetuned = [e for e in job.of("after") if e["phase"] == "finetune"]
    assert [(e["rank"], e["step"], e["w"]) for e in finetuned] == [(0, 10, [-10.0, -10.0])], finetuned
    assert "succeeded: training completed" in job.lines[-1], out
