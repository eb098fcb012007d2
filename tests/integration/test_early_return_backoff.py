"""Horovod's MNIST elastic example with a newcomer whose sampler runs short (issue 44, finding 10).

The example builds its ``DistributedSampler`` once, from ``hvd.size()`` at start-up: a worker that
joins two running ones shards the data three ways, so its epochs are shorter and its training function
returns while rank 0 trains on. It is sent away; its slot then backs off like a failed one (the
blacklist's exponential cooldown), so the slot is refilled a few times with growing waits, not at once
over and over, and the likely cause is explained once. Rank 0's speed with and without such a newcomer
is a benchmark (``benchmarks/early_return.py``), not an assertion here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.events_check import of, read_events
from tests.integration.harness import REPO, HostsFile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MNIST = REPO / "tests" / "integration" / "horovod_examples" / "mnist_elastic.py"


def test_a_newcomer_whose_sampler_runs_short_backs_off_with_growing_cooldowns(jobs, tmp_path: Path):
    events = tmp_path / "events.jsonl"
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    slow = tmp_path / "slow"  # while it exists each step sleeps 0.2 s (instrument.step)
    slow.touch()
    # 96 images in batches of 16: 3 batches an epoch on each of two workers, 2 on each of three. In lockstep a
    # newcomer runs out of epochs after two thirds of rank 0's steps, and its successor, which starts at rank 0's
    # epoch, again before rank 0 is done: 40 epochs (120 steps of rank 0, 0.2 s each) leave the second newcomer
    # about 40 steps (8 s) to be launched and join in, where one second sufficed.
    job = jobs(["run", "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(hosts.script),
                "--discovery-interval", "0.2", "--blacklist-cooldown-range", "1", "60", "--events-file", str(events),
                sys.executable, str(MNIST), "--epochs", "40", "--train-size", "96", "--log-interval", "1000"],
               env={"PYTHONPATH": str(REPO), "CE_EXAMPLE_SLOW": str(slow)})
    job.wait_for(lambda j: len(j.of("step", size=2)) >= 6, 90, "two workers training")
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    # Every newcomer sent away says why as it leaves: wait for the second.
    job.wait_for(lambda j: j.output().count("leaving the job: returned from its training function") >= 2, 150,
                 "a second early return on 127.0.0.3")
    slow.unlink()
    assert job.finish(120) == 0, job.output()
    out = job.output()

    # The likely cause once, however many newcomers returned early.
    assert out.count("sized for another world size") == 1, out
    recorded = read_events(events)
    left = [e for e in of(recorded, "worker_left") if e.get("early_return")]
    started = [e for e in of(recorded, "worker_started") if e["host"] == "127.0.0.3"]
    assert len(left) >= 2 and {e["host"] for e in left} == {"127.0.0.3"}, left
    # Each newcomer there returned early and its slot waited about twice as long as the time before
    # (1 s, 2 s, 4 s ... plus up to 10 % jitter): a few refills, never one at once.
    waits = [e["blacklisted_s"] for e in left]
    assert waits[0] >= 1 and all(b >= 1.8 * a for a, b in zip(waits, waits[1:])), waits
    assert len(started) <= len(left) + 1, (started, left)  # the last one may have been stopped at the end
    assert out.count("returned early too") == len(left) - 1, out
    assert not of(recorded, "worker_failed")
    done = {e["worker"].split("[")[0] for e in job.of("done")}
    assert {"127.0.0.1", "127.0.0.2"} <= done, job.of("done")  # the two first workers finished training
    assert "training completed on 2 worker(s)" in job.lines[-1], job.lines[-3:]
