"""Graceful membership changes driven by a discovery script, under an ElasticSampler.

Scale-up and scale-in alone (newcomer rank, no rollback, the leaver leaving at a commit) are
asserted on one job in test_events.py, beside what its events file records.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest

from tests.integration.harness import HostsFile, probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _run_args(hosts: HostsFile, *extra: str) -> list[str]:
    return [
        "run", "-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script", str(hosts.script),
        "--discovery-interval", "0.2", "--host-missing-grace", "0.5", *extra,
    ]


def _effective_batches(job) -> list:
    """The batch events that stayed in the training history: those rolled back by a failure are dropped.

    A worker prints its batch before the step (see probe.py): a ring allreduce can complete on
    rank 0, which commits the step with every member's gradients, and fail on a member that then
    rolls back without ever finishing the step (CI saw 8 samples "missing" that way).

    Each batch is tagged with the round its worker was in (the round of the worker's
    latest hello or reset, in that worker's own order of output). A step that a
    failure rolled back was trained again in a later round: for every step only
    the batches of the last round that trained it count. (Read by round, not by
    where a reset line falls among the other workers' lines: under load a
    survivor's reset can be printed after another's first batches of the new round.)
    """
    round_of: dict[str, int] = {}
    tagged = []
    for e in job.events:
        if e.kind in ("hello", "reset"):
            round_of[e["worker"]] = e["round"]
        elif e.kind == "batch" and not e.data.get("following"):  # a follower's (commit.follow) is not trained
            tagged.append((round_of[e["worker"]], e))
    last = {}
    for round_, e in tagged:
        last[e["step"]] = max(last.get(e["step"], round_), round_)
    return [e for round_, e in tagged if round_ == last[e["step"]]]


def _size_runs(job) -> list[int]:
    """The world sizes rank 0 trained at, in order, each run of equal sizes once: [3, 2, 3, 2]."""
    runs: list[int] = []
    for e in job.of("batch", rank=0):
        if not runs or runs[-1] != e["size"]:
            runs.append(e["size"])
    return runs


def test_elastic_sampler_processes_every_index_once_across_a_kill_a_grow_and_a_shrink(jobs, tmp_path):
    """One job, three membership changes mid-epoch: a worker SIGKILLed (the survivors roll back), a host
    added by discovery, a host removed from it. (Once two tests: the shrink-and-grow one here and
    test_worker_invariants.py's exactly-once across a kill -9.)"""
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    n = 240
    job = jobs(_run_args(hosts, "-np", "3", "--blacklist-cooldown-range", "300", "300",
                         # Three resets (kill, grow, shrink) before it may end, and it trains in the last round
                         # (one formed at the very end of the last epoch trains one more: CI saw [3, 2, 3]).
                         *probe_cmd("--sampler", str(n), "--epochs", "2", "--min-resets", "3", "--step-sleep", "0.05")))
    victim = job.wait_event("batch", rank=2, epoch=0, step=3)
    os.kill(victim["pid"], signal.SIGKILL)
    job.wait_for(lambda j: _size_runs(j)[:2] == [3, 2], what="training on at two after the kill")
    # Batches of size 3 from before a change (it takes effect at a commit, steps later) must not count
    # as the next growth: only the order of rank 0's sizes does (CI once saw that race).
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.4"])  # grow again (127.0.0.3's slot is blacklisted)
    job.wait_for(lambda j: _size_runs(j)[:3] == [3, 2, 3], what="grown")
    hosts.set(["127.0.0.1", "127.0.0.4"])  # shrink: 127.0.0.2 is scaled in
    assert job.finish() == 0, job.output()
    assert "killed by signal 9" in job.output()
    assert _size_runs(job) == [3, 2, 3, 2], f"{_size_runs(job)}\n{job.output()}"
    resets = job.of("reset")
    assert resets and {e["size"] for e in resets} == {2, 3}
    batches = _effective_batches(job)
    epochs = sorted({e["epoch"] for e in batches})
    assert epochs == list(range(len(epochs))) and len(epochs) >= 2
    for epoch in epochs:
        seen = Counter(i for e in batches if e["epoch"] == epoch for i in e["indices"])
        assert set(seen) == set(range(n)), \
            f"epoch {epoch}: missing {sorted(set(range(n)) - set(seen))[:10]}\n{job.output()}"
        assert max(seen.values()) == 1, \
            f"epoch {epoch}: processed twice: {[i for i, c in seen.items() if c > 1]}\n{job.output()}"
    # The kill happened mid-epoch 0: both sizes trained in it.
    assert any(e["size"] == 3 for e in batches if e["epoch"] == 0)
    assert any(e["size"] == 2 for e in batches if e["epoch"] == 0)


def test_a_reset_callback_that_commits_does_not_hang_an_admission(jobs, tmp_path):
    # Its commit's membership check was an allreduce of the round that had just formed, which its newcomer (it runs
    # no reset callback: it waits in the state sync) never joined: the admission hung until --progress-timeout gave
    # every holder up and the job ended "training state lost". In a reset callback a commit is a save.
    hosts = HostsFile(tmp_path, ["127.0.0.1", "127.0.0.2"])
    job = jobs(_run_args(hosts, "--max-np", "3", "--progress-timeout", "20",
                         *probe_cmd("--commit-in-reset", "--min-resets", "1", "--steps", "30", "--step-sleep", "0.02")))
    job.wait_event("commit", rank=0, step=3, timeout=60)
    hosts.set(["127.0.0.1", "127.0.0.2", "127.0.0.3"])
    assert job.finish(timeout=60) == 0, job.output()[-4000:]
    assert {e["size"] for e in job.of("reset")} == {3}, job.output()[-4000:]  # the admission, where the callback committed
    done = job.of("done")
    assert len(done) == 3 and len({(e["step"], e["checksum"]) for e in done}) == 1, done
