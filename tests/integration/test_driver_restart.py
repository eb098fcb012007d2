"""Driver restart: the same ``cloud-elastic run`` command resumes its job from the checkpoint directory.

The driver is SIGKILLed mid-training. Its workers train on for ``--driver-grace``
(rank 0 checkpointing at every commit it can), then stop: no process is left.
The same command, run again, waits for them, keeps the job's id and resumes
from the latest checkpoint, so the steps the workers made without their driver
are not lost either.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from cloud_elastic.checkpoint import CheckpointStore, read_job_record
from tests.integration.harness import processes_of_job, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GRACE_S = 6.0


def _args(ckpt, *extra: str) -> list[str]:
    return ["run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1", "--checkpoint-dir", str(ckpt),
            "--checkpoint-interval", "1", "--driver-grace", str(GRACE_S), *extra]


def _wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_a_killed_driver_is_resumed_by_the_same_command_and_no_worker_outlives_the_grace(jobs, tmp_path):
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    ckpt = tmp_path / "ckpt"
    args = _args(ckpt, *probe_cmd("--steps", "120", "--step-sleep", "0.1"))
    first = jobs(args, env=env)
    first.wait_for(lambda j: any(e["step"] >= 10 for e in j.of("commit")) and "checkpoint of step" in j.output(),
                   timeout=120, what="training with checkpoints")
    job_id = first.job_id()
    workers = processes_of_job(job_id)
    assert len(workers) == 2
    seen_before_kill = max(e["step"] for e in first.of("commit"))
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()

    # Without their driver the workers train on (and checkpoint) for the grace, then stop.
    store = CheckpointStore(str(ckpt))
    _wait_until(lambda: store.list() and store.list()[0].step > seen_before_kill + 2, GRACE_S + 30,
                "a checkpoint written without the driver")
    _wait_until(lambda: not processes_of_job(job_id), GRACE_S + 30, "the orphaned workers to stop")
    latest = store.list()[0].step
    assert read_job_record(store).job_id == job_id

    second = jobs(args, env=env)
    assert second.finish(180) == 0, second.output()
    out = second.output()
    assert second.job_id() == job_id, "the restarted driver did not keep the job's identity"
    assert f"resumed from the checkpoint of step {latest}" in out, out
    resumed = [e for e in second.of("commit")]
    assert resumed and min(e["step"] for e in resumed) == latest + 1, "training did not continue from the checkpoint"
    done = second.of("done")
    assert len(done) == 2 and {e["step"] for e in done} == {120} and len({e["checksum"] for e in done}) == 1
    assert not processes_of_job(job_id)
