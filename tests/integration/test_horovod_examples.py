"""Horovod's three elastic PyTorch examples, in their shape, run with only their Horovod import changed.

Each job starts on two loopback hosts; once both train, one worker is killed
with ``kill -9``; once the survivor trains on alone, discovery reports a new
host and its worker joins. The scripts are ours, written in the examples'
shape (``tests/integration/horovod_examples``), on tiny generated data.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.integration.harness import REPO, Event, HostsFile, Job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EXAMPLES = REPO / "tests" / "integration" / "horovod_examples"


def kill_then_grow(jobs, tmp_path: Path, script: str, *args: str, kill_at: Callable[[Event], bool] = lambda e: True) -> Job:
    """Run ``script`` on two hosts, kill rank 1 at its third step where ``kill_at``, add a host.

    Returns the finished job (asserted to exit 0).
    """
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    slow = tmp_path / "slow"  # while it exists each step sleeps 0.2 s (instrument.step): time to kill and grow
    slow.touch()
    job = jobs(["run", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", "--blacklist-cooldown-range", "300", "300",
                sys.executable, str(EXAMPLES / script), *args],
               # Workers run scripts outside the package: put this checkout first, whatever the venv points at.
               env={"PYTHONPATH": str(REPO), "CE_EXAMPLE_SLOW": str(slow)})
    victim = job.wait_for(lambda j: [e for e in j.of("step", rank=1, size=2) if kill_at(e)][2:], 90,
                          "three steps of two workers")[0]
    os.kill(victim["pid"], signal.SIGKILL)
    job.wait_for(lambda j: len(j.of("step", size=1)) >= 3, 60, "the survivor training on alone")
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    job.wait_for(lambda j: len([e for e in j.of("step", size=2) if e["worker"].startswith("127.0.0.3")]) >= 3, 90,
                 "the newcomer on 127.0.0.3 training")
    slow.unlink()
    assert job.finish() == 0, job.output()
    assert "killed by signal 9" in job.output()
    return job


def assert_trained_on(job: Job, reset_callbacks: bool = True) -> None:
    """The newcomer joined, both workers ended with the same parameters, and the loss fell without diverging."""
    done = job.of("done")
    assert len(done) == 2 and {e["size"] for e in done} == {2}, job.output()
    assert len({e["checksum"] for e in done}) == 1, "final parameters differ between workers"
    assert any(e["worker"].startswith("127.0.0.3") for e in done), "the newcomer did not finish"
    if reset_callbacks:  # the learning rate was rescaled for one worker, then for two
        assert [e["size"] for e in job.of("reset", rank=0)] == [1, 2], job.of("reset")
    losses = [e["loss"] for e in job.of("step", rank=0)]
    assert all(math.isfinite(x) for x in losses), losses
    tenth = max(1, len(losses) // 10)
    first, last = sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth
    assert last < first, (first, last)


def test_synthetic_benchmark_with_fp16_allreduce_survives_a_kill_and_admits_a_newcomer(jobs, tmp_path):
    job = kill_then_grow(jobs, tmp_path, "synthetic_benchmark_elastic.py", "--fp16-allreduce", "--num-iters", "40")
    assert_trained_on(job)
    assert any(line.endswith("Running benchmark...") for line in job.lines)
    assert any("Total img/sec on 2 CPU(s)" in line for line in job.lines), job.output()


def test_mnist_survives_a_kill_and_admits_a_newcomer_then_tests(jobs, tmp_path):
    job = kill_then_grow(jobs, tmp_path, "mnist_elastic.py", "--epochs", "8")
    assert_trained_on(job)
    # test() after training averages the metrics over both workers: they agree.
    assert len({(e["test_loss"], e["test_accuracy"]) for e in job.of("done")}) == 1
    assert any("Test set: Average loss:" in line for line in job.lines)


def test_imagenet_with_fp16_predivide_and_accumulation_survives_a_kill_and_admits_a_newcomer(jobs, tmp_path):
    # Killed at its third step, before its first commit: its loop runs metric allreduces between step() and a
    # commit every 10 batches, so this first window is one no in-place commit could roll back; the first commit
    # is kept whole in host memory until the loop is known, and the survivor resumes from it exactly.
    job = kill_then_grow(jobs, tmp_path, "imagenet_resnet50_elastic.py", "--fp16-allreduce",
                         "--gradient-predivide-factor", "2", "--batches-per-allreduce", "2", "--epochs", "8",
                         "--checkpoint-format", str(tmp_path / "checkpoint-{epoch}.pth.tar"), "--log-dir",
                         str(tmp_path / "logs"), kill_at=lambda e: e["epoch"] == 0 and e["batch"] < 9)
    assert "training state lost" not in job.output() and "cannot restore" not in job.output()
    assert_trained_on(job, reset_callbacks=False)  # this example registers none
    assert [e["epoch"] for e in job.of("done")] == [8, 8]
    validated = job.of("validated", rank=0)
    assert validated[-1]["loss"] < validated[0]["loss"], validated
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [f"checkpoint-{i}.pth.tar" for i in range(1, 9)]
