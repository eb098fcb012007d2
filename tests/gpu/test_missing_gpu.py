"""A slot whose GPU does not exist: its worker says so in one line and leaves; the job trains on without it.

A host given one slot more than it has GPUs (``-H 127.0.0.1:2`` on a one-GPU
machine, a wrong ``--slots-per-host``, a GPU that fell off the bus) starts a worker
whose slot, and so whose NCCL device, is ``cuda:N`` with only N devices visible.
What a user should see: one line from that worker naming the GPU it was given and
how many the host has (not a traceback of torch internals), the driver's line that
the worker failed and its slot is blacklisted, and the job going on with the
workers that do have a GPU, as after any other failure (``--min-np`` allowing).

One job serves both tests (started by the first that asks).
"""

from __future__ import annotations

import re

import pytest

from tests.gpu.support import env, probe, visible_gpus
from tests.integration.harness import Job

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(150)]

STEPS = 60


@pytest.fixture(scope="module")
def missing_gpu_job():
    """``run()`` -> (job, exit code, N): the job, started and finished once per module; N GPUs, N + 1 slots."""
    cache: dict = {}

    def run() -> tuple[Job, int, int]:
        if "job" not in cache:
            if cache.get("tried"):
                pytest.fail("the job shared by this module did not finish (see the first test of the module)")
            cache["tried"] = True
            n = visible_gpus()[0]
            job = cache["started"] = Job(
                ["run", "-np", str(n + 1), "--min-np", str(n), "-H", f"127.0.0.1:{n + 1}",
                 "--blacklist-cooldown-range", "300", "300", "--progress-timeout", "30", "--elastic-timeout", "60",
                 *probe("--steps", str(STEPS), "--step-sleep", "0.05")], env=env())
            rc = job.finish(130)
            cache.update(job=job, rc=rc, n=n)
        return cache["job"], cache["rc"], cache["n"]

    yield run
    job = cache.get("started")
    if job is not None and job.proc.poll() is None:
        job.kill()


def _lines_of_slot(job: Job, n: int) -> list[str]:
    prefix = re.compile(rf"^\[[^\]]*\]<127\.0\.0\.1\[{n}\]> ")
    return [prefix.sub("", line) for line in job.lines if prefix.match(line)]


def test_the_job_trains_on_without_the_worker_whose_gpu_does_not_exist(missing_gpu_job, gpu_report):
    job, rc, n = missing_gpu_job()
    assert rc == 0, job.output()
    done = job.of("done")
    assert [(e["slot"], e["size"], e["step"]) for e in done if e["slot"] == "127.0.0.1/0"] == [("127.0.0.1/0", n, STEPS)]
    assert {e["slot"] for e in done} == {f"127.0.0.1/{i}" for i in range(n)}, done
    assert not [e for e in job.of("commit") if e["slot"] == f"127.0.0.1/{n}"], "the worker without a GPU trained"
    # The driver said which worker failed, and that its slot is left alone for a while.
    failed = [line for line in job.lines if line.startswith("cloud-elastic:") and f"127.0.0.1[{n}]" in line
              and "blacklisted" in line]
    assert failed, job.output()
    gpu_report(f"{n} GPU(s), {n + 1} slots; the driver said: {failed[0]}")


def test_the_worker_whose_gpu_does_not_exist_says_so_in_one_line(missing_gpu_job, gpu_report):
    job, _, n = missing_gpu_job()
    lines = _lines_of_slot(job, n)
    gpu_report(f"the worker of slot {n} printed {len(lines)} line(s): " + " | ".join(lines[:3])[:300])
    assert not [line for line in lines if line.startswith("Traceback")], "\n".join(lines)
    naming = [line for line in lines if f"cuda:{n}" in line]
    assert len(naming) == 1, "\n".join(lines)
    assert len(naming[0]) < 400, naming[0]
