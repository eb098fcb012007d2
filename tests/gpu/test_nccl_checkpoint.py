"""One GPU, NCCL: a job whose only worker is killed with ``kill -9`` resumes from its durable checkpoint, bitwise."""

from __future__ import annotations

import os
import re
import signal

import pytest

from cloud_elastic.status import query_status
from tests.gpu.support import env, probe

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(150)]


def _saved_steps(job) -> list[int]:
    return [int(m.group(1)) for line in job.lines for m in [re.search(r"checkpoint of step (\d+) saved", line)] if m]


def _commit_heard(job, runtime) -> int:
    """The highest commit step the driver has heard of (workers report it with their heartbeats)."""
    try:
        return query_status(job.job_id(), root=runtime / "cloud-elastic", timeout_s=2.0).commit_step or 0
    except Exception:  # the driver not answering yet counts as nothing heard
        return 0


def test_an_nccl_job_killed_with_sigkill_resumes_from_its_checkpoint_bitwise(jobs, tmp_path, gpu_report):
    ckpt = tmp_path / "ckpt"
    runtime = tmp_path / "run"
    runtime.mkdir()
    steps = 200
    job = jobs(["run", "-np", "1", "--min-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(ckpt),
                "--checkpoint-interval", "0.3", "--blacklist-cooldown-range", "1", "1", "--elastic-timeout", "60",
                *probe("--steps", str(steps), "--step-sleep", "0.02")], env=env(XDG_RUNTIME_DIR=str(runtime)))
    first = job.wait_event("hello", timeout=90)
    # NCCL is what a job on a CUDA machine gets without asking; the worker's GPU is its slot's.
    assert (first["backend"], first["device"]) == ("nccl", "cuda:0"), first
    job.wait_for(lambda j: len(_saved_steps(j)) >= 2, timeout=60, what="two durable checkpoints")
    # Only a driver that knows the state was committed resumes from a checkpoint (else it would start over).
    second = _saved_steps(job)[1]
    job.wait_for(lambda j: _commit_heard(j, runtime) >= second, timeout=30, what="the driver to hear of the commits")
    os.kill(first["pid"], signal.SIGKILL)

    assert job.finish(120) == 0, job.output()
    out = job.output()
    resumed_from = re.search(r"resumed from the checkpoint of step (\d+)", out)
    assert resumed_from, out
    step = int(resumed_from.group(1))
    assert step in _saved_steps(job), (step, _saved_steps(job))

    old = [e for e in job.events if e["pid"] == first["pid"]]
    new = [e for e in job.events if e["pid"] != first["pid"]]
    [again] = [e for e in new if e.kind == "hello"]
    assert (again["backend"], again["device"]) == ("nccl", "cuda:0"), again
    # The replacement starts from the checkpoint: the step and every byte of the parameters and the
    # optimizer state (AdamW's moments and step counts) are those of the commit that was checkpointed.
    [resumed] = [e for e in new if e.kind == "resumed"]
    committed = {e["step"]: e["checksum"] for e in old if e.kind == "commit"}
    assert resumed["step"] == step and step in committed, (resumed, sorted(committed)[-5:])
    assert resumed["checksum"] == committed[step], (resumed, committed[step])
    assert 1 <= step <= max(committed)
    [done] = [e for e in new if e.kind == "done"]
    assert done["step"] == steps and done["size"] == 1, done
    gpu_report(f"killed after commit {max(committed)}, resumed from the checkpoint of step {step}, bitwise equal")
