"""A local worker started from scratch (``CLOUD_ELASTIC_LOCAL_FORKSERVER=0``, as every worker on a GPU machine is)
and adopted by a driver restarted within ``--driver-grace`` ends the job as it ends: the restarted driver is not its
parent and cannot reap it, so it has only the exit code the worker says (``driver.launch.local_main``). A script
that returns succeeds (it failed: 'ended without saying its exit code'), one that exits 3 fails naming code 3, and
one SIGKILLed after its training function returned fails, never taken for a success. Nothing is left behind."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.integration.harness import processes_of_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PROBE = Path(__file__).with_name("adopted_exit_probe.py")


def _adopted(jobs, tmp_path: Path, ending: str):
    """Start a one-worker job, SIGKILL its driver once the worker trains, run the same command again and wait until
    it adopted the worker; then let the worker's training function return. Returns (restarted driver, job id)."""
    (tmp_path / "run").mkdir()
    events = tmp_path / "events"
    events.mkdir()
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "CLOUD_ELASTIC_LOCAL_FORKSERVER": "0"}
    args = ["run", "-np", "1", "-H", "localhost:1", "--checkpoint-dir", str(tmp_path / "ckpt"), "--driver-grace",
            "60", sys.executable, str(PROBE), str(events), ending]
    first = jobs(args, env=env)
    steps = events / "steps"
    first.wait_for(lambda j: steps.exists() and int(steps.read_text() or 0) >= 3, timeout=60, what="training")
    job_id = first.job_id()
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    second = jobs(args, env=env)
    second.wait_for(lambda j: "adopted 1 running worker(s)" in j.output(), timeout=60, what="adoption")
    (events / "go").touch()
    return second, job_id


def _nothing_left(job, tmp_path: Path, job_id: str) -> None:
    out = job.output()
    assert "launched worker" not in out and "resumed from the checkpoint" not in out, out
    assert not processes_of_job(job_id), "a worker outlived the job"
    left = [p.name for p in (tmp_path / "run" / "cloud-elastic" / job_id).glob("*")
            if p.name.startswith((".exit-", "adopt"))]
    assert not left, left


def test_an_adopted_worker_started_from_scratch_whose_script_returns_succeeds(jobs, tmp_path):
    second, job_id = _adopted(jobs, tmp_path, "return")
    assert second.finish(60) == 0, second.output()
    assert f"job {job_id} succeeded" in second.output()
    _nothing_left(second, tmp_path, job_id)


def test_an_adopted_worker_started_from_scratch_that_exits_3_fails_the_job_naming_code_3(jobs, tmp_path):
    second, job_id = _adopted(jobs, tmp_path, "exit3")
    assert second.finish(60) == 1, second.output()
    out = second.output()
    assert f"job {job_id} failed" in out and "(rank 0) exited with code 3 after its training function returned" in out, out
    _nothing_left(second, tmp_path, job_id)


def test_an_adopted_worker_started_from_scratch_killed_after_training_fails_the_job(jobs, tmp_path):
    second, job_id = _adopted(jobs, tmp_path, "hang")
    trained = tmp_path / "events" / "trained"
    second.wait_for(lambda j: trained.exists() and trained.read_text(), timeout=60, what="the training returned")
    os.kill(int(trained.read_text()), signal.SIGKILL)  # it says nothing: its code is unknown, never 0
    assert second.finish(60) == 1, second.output()
    out = second.output()
    assert f"job {job_id} failed" in out and "ended without saying its exit code" in out, out
    assert "succeeded" not in out, out
    _nothing_left(second, tmp_path, job_id)
