"""Worker-side promises across real failures: a worker's GPU (local rank) never moves.

(That an ElasticSampler processes every sample exactly once across a ``kill -9`` is
asserted in test_membership.py, on the job that also grows and shrinks.)"""

from __future__ import annotations

import os
import re
import signal
from collections import defaultdict

import pytest

from tests.integration.harness import probe_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _slot(worker_id: str) -> int:
    return int(re.search(r"\[(\d+)\]", worker_id).group(1))


def test_local_rank_stays_the_slot_across_a_kill_and_a_replacement(jobs):
    # One host with two slots (two GPUs). Slot 0's worker is killed; the survivor
    # keeps local rank 1, and the replacement started on slot 0 takes local rank 0.
    job = jobs(["run", "-np", "2", "--min-np", "1", "--max-np", "2", "-H", "127.0.0.1:2",
                "--blacklist-cooldown-range", "1", "1", *probe_cmd("--steps", "100", "--min-resets", "2")])
    victim = job.wait_event("commit", rank=0, step=8)
    first = {e["worker"]: e for e in job.of("hello")}
    assert sorted(e["local_rank"] for e in first.values()) == [0, 1]
    os.kill(victim["pid"], signal.SIGKILL)
    replacement = job.wait_for(
        lambda j: [e for e in j.of("hello") if e["worker"] not in first], timeout=90, what="a replacement")[0]
    assert job.finish() == 0, job.output()
    assert _slot(replacement["worker"]) == _slot(victim["worker"])
    per_round: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for e in job.of("hello") + job.of("reset"):
        # A worker's local rank is its slot, from its first round to its exit.
        assert e["local_rank"] == _slot(e["worker"]), e.data
        assert 0 <= e["local_rank"] < e["local_size"], e.data
        per_round[e["round"]].append((e["worker"], e["local_rank"]))
    for round_, members in per_round.items():
        ranks = [lr for _, lr in set(members)]
        assert len(ranks) == len(set(ranks)), f"round {round_}: two live workers share a GPU: {members}"
    # The survivor really lived through rounds without its sibling and with the replacement.
    survivor = next(w for w in first if w != victim["worker"])
    sizes = {e["size"] for e in job.of("reset", worker=survivor)}
    assert sizes == {1, 2}, sizes
    assert {e["local_rank"] for e in job.of("reset", worker=survivor)} == {_slot(survivor)}
