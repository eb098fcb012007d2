"""What the log says of workers that leave without a commit to leave at (``driver/job/discovery_edge.py``,
``driver/job/leaving.py``).

Found by review: a host dropped from discovery with no notice before any commit was removed as soon as its
replacement waited, which formed a round of its own from step 0 beside the member still training, and nothing said
the job started over; a draining worker killed before its commit was released as "its workers left at a commit; 0
steps lost". Scripted timelines on a fake clock.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, WorkerState
from cloud_elastic.driver.job.leaving import FIRST_COMMIT_HOLD_S
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import KILLED, T0, assert_round, started

pytestmark = pytest.mark.timeout(30)  # the first test of a run may import torch (conftest), on a loaded machine


def state(sim, slot: str) -> WorkerState:
    return sim.job.workers[sim.id(slot)].state


def formed(sim) -> list[dict]:
    return [f for kind, f in sim.events if kind == "round_formed"]


def test_a_host_dropped_before_the_first_commit_is_kept_until_its_worker_hands_the_commit_on() -> None:
    sim = started(1, {"a": 1}, missing_grace=1)
    sim.discover({"c": 1})  # a leaves the group with no notice, before any commit
    sim.advance(1.5)
    assert sim.join("c[0]") == {"c[0]": None}  # the replacement waits
    sim.advance(0.5)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.job.round == 1  # no round from step 0 beside it
    assert sim.poll("a[0]").update_gen == 1
    sim.commit("a[0]")  # its first commit, where it sees the update
    replies = sim.join("a[0]", reason="update")
    assert_round({**replies, "c[0]": sim.reply("c[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "c[0]"]  # a is rank 0: c receives its first commit
    sim.commit("a[0]", "c[0]")
    sim.advance(0.5)
    assert state(sim, "a[0]") is WorkerState.DRAINING
    replies = sim.join("a[0]", "c[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["c[0]"], Assignment)
    # Round 2 continues from a's commit (a step, not null: none started over); a left at a commit.
    assert [f["step"] is None for f in formed(sim)] == [True, False, False] and sim.outcome is None


def test_past_the_first_commit_hold_the_dropped_hosts_worker_stops_and_the_log_says_the_job_starts_over(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(1, {"a": 1}, missing_grace=1)
    sim.discover({"c": 1})
    sim.advance(1.5)
    sim.join("c[0]")
    sim.advance(FIRST_COMMIT_HOLD_S - 5)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.job.round == 1  # no commit yet: still held
    sim.advance(10)
    assert state(sim, "a[0]") is WorkerState.EXITING  # stopped, not training on beside the new round
    assert [s.worker_id for s in sim.stops] == [sim.id("a[0]")]
    assert_round({"c[0]": sim.reply("c[0]")}, 2, needs_sync=True)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "round 2 starts over from the initial weights" in said, said
    assert "other workers now hold the state" not in said, said


def test_a_draining_worker_killed_before_its_commit_is_reported_with_the_steps_its_peers_lost(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cloud_elastic")
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    sim.commit("a[0]", "b[0]")
    sim.discover({"a": 1}, {"b": Drain(T0 + 120, "spot interruption")})
    assert state(sim, "b[0]") is WorkerState.DRAINING
    sim.exit("b[0]", KILLED)  # killed before the commit it would leave at
    assert sim.poll("a[0]").abort_round == 1
    sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, rolled_back=2)
    sim._collect()
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    drained = [r.getMessage() for r in caplog.records if "drained" in r.getMessage()]
    assert len(drained) == 1 and "0 steps lost" not in drained[0] and "left at a commit" not in drained[0], drained
    assert drained[0].endswith(f"worker {sim.id('b[0]')} (rank 1) killed by signal 9 while draining, before leaving "
                               "at a commit; the survivors rolled back 2 step(s) to their last commit"), drained
