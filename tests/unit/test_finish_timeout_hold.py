"""--finish-timeout counts from rank 0's return, never from a peer's (review s57 rvG F1 of 682f33b).

682f33b started the clock at the first return at the newest commit, in RUNNING too, and stopped rank 0 past it
unless rank 0 was waiting in a collective. rvG's early_return_ft.sh: -np 2 --min-np 1 --finish-timeout 8, rank 1's
data shorter so it returned at commit 20, rank 0 then ran 12 s of rank-0-only validation (no collective) before
training on to step 30: the job failed rc 1 "rank 1 finished training, but worker ... (rank 0) was still in its
training function 8s after rank 1 ... returned ...; stopped" (before it: rank 1 sent away as an early return, rank 0
trained to 30, rc 0). The driver cannot tell rank 0's end-of-function work from training without collectives, so
rank 0 is never stopped while it is still in its training function: a peer that returned at the last commit waits
for it however long (no --min-np wait either: test_finishing_round_min_np.py), and --finish-timeout counts from rank
0's return (the job completing). A drain's reply during such a round says that rank 0's return completes the job.
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.completion import EARLY_RETURN_WAIT_S
from tests.unit.test_finishing_round_min_np import LAST
from tests.unit.test_job import CLEAN, Sim, failed, started

pytestmark = pytest.mark.timeout(10)


def rank1_parked(**policy) -> Sim:
    """Rank 0 on a, rank 1 on b, both at commit LAST (a checkpoint of step 1 stored); rank 1 returns and waits while
    rank 0 is still in its training function (heartbeating, in no collective)."""
    sim = started(2, {"a": 1, "b": 1}, elastic_timeout_s=20, **policy)
    for wid in (sim.id("a[0]"), sim.id("b[0]")):
        sim.commits[wid] = LAST
        sim.job.heartbeat(wid, sim.now, LAST, LAST)
    if policy.get("checkpointing"):
        sim.job.checkpoint_saved(1, 1)
    assert sim.job.completed(sim.id("b[0]"), sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    return sim


def advance_until_ended(sim: Sim, seconds: int) -> float:
    """Advance second by second for up to ``seconds`` or until the job has an outcome; returns the time taken."""
    start = sim.now
    for _ in range(seconds):
        sim.advance(1)
        if sim.outcome is not None:
            break
    return sim.now - start


def test_an_early_return_then_rank_0_only_validation_longer_than_the_finish_timeout_stops_nobody() -> None:
    """early_return_ft.sh: rank 0 validates alone for 12 s (--finish-timeout 8), then trains on: its allreduce finds
    rank 1 returned early, which leaves; rank 0 goes on. 682f33b stopped rank 0 8 s after rank 1's return."""
    sim = rank1_parked(finish_timeout_s=8, min_np=1)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    sim.advance(12)  # rank-0-only validation, no collective: past --finish-timeout
    assert sim.outcome is None and sim.stops == [] and sim.job.workers[r0].alive, sim.outcome
    assert sim.job.completion_reply(r1) is None  # still waiting for rank 0
    sim.job.heartbeat(r0, sim.now, waiting_s=EARLY_RETURN_WAIT_S + 0.5)  # its next allreduce needs rank 1
    sim.advance(0.5)
    assert sim.job.completion_reply(r1)[0] == "leave" and sim.job.workers[r1].returned_early
    sim.exit("b[0]", CLEAN)
    sim.advance(30)  # rank 0 trains on alone (--min-np 1), far past --finish-timeout
    assert sim.outcome is None and sim.job.workers[r0].alive and sim.stops == [], sim.outcome


def test_rank_0_evaluating_past_the_finish_timeout_after_a_peer_returned_is_waited_for() -> None:
    """finish_timeout_real.sh: --finish-timeout 10, rank 1 returned at commit 40, rank 0 evaluated 40 s in its
    training function: rc 0, the clock starting at rank 0's return."""
    sim = rank1_parked(checkpointing=True, finish_timeout_s=10)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    sim.advance(40)
    assert sim.outcome is None and sim.stops == [] and sim.job.completion_reply(r1) is None
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r1) == ("done", "")
    sim.exit("b[0]", CLEAN)
    sim.advance(5)
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome


def test_the_finish_timeout_counts_from_rank_0s_return() -> None:
    sim = rank1_parked(finish_timeout_s=30)
    sim.advance(20)
    assert sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("b[0]", CLEAN)
    sim.advance(29)
    assert sim.outcome is None  # rank 0's work after its function: 29 s after its return, 49 s after rank 1's
    took = advance_until_ended(sim, 20)
    assert took <= 2, took
    failed(sim, f"worker {sim.id('a[0]')} (rank 0) was still running 3", "after training completed",
           "(--finish-timeout 30)")


def test_an_early_return_is_still_sent_away() -> None:
    """Rank 1 returned early (rank 0 waits in a collective for it): the early-return rule sends it away and rank 0
    trains on; a --finish-timeout shorter than that rule's wait stops nobody."""
    sim = rank1_parked(finish_timeout_s=2)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    sim.advance(0.5)
    sim.job.heartbeat(r0, sim.now, waiting_s=0.5)
    sim.advance(4)
    assert sim.outcome is None and sim.stops == [] and sim.job.completion_reply(r1) is None
    sim.job.heartbeat(r0, sim.now, waiting_s=EARLY_RETURN_WAIT_S + 0.5)
    sim.advance(0.5)
    assert sim.job.completion_reply(r1)[0] == "leave" and sim.job.workers[r1].returned_early
    sim.exit("b[0]", CLEAN)
    sim.advance(10)
    assert sim.outcome is None and sim.job.workers[r0].alive and sim.stops == []


def test_the_clock_starts_again_in_a_next_training_function(caplog) -> None:
    """Two hvd.elastic.run functions: the first's end does not count against the second's."""
    caplog.set_level(logging.INFO)
    sim = rank1_parked(finish_timeout_s=30)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    sim.advance(10)
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r1) == ("done", "")
    for wid in (r1, r0):
        assert sim.job.completed(wid, sim.now, again=True) == ("done", "")
    sim.advance(100)  # the second function trains for longer than --finish-timeout
    for wid in (r0, r1):
        sim.commits[wid] = 2 * LAST
        sim.job.heartbeat(wid, sim.now, 2 * LAST, 2 * LAST)
    assert sim.job.completed(r1, sim.now, commit_seq=2 * LAST, steps=2 * LAST) == ("wait", "")
    sim.advance(45)  # rank 0's evaluation in the second function, past --finish-timeout too
    assert sim.outcome is None and sim.stops == []
    assert sim.job.completed(r0, sim.now, commit_seq=2 * LAST, steps=2 * LAST) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome


def test_a_drain_during_the_finishing_round_says_rank_0s_return_completes_the_job() -> None:
    """A fixed -H list, rank 1 (b) returned and waits, rank 0 (a) evaluates; `cloud-elastic drain b` said the job
    ends once its workers have left; it then succeeded."""
    sim = rank1_parked(checkpointing=True, hosts_fixed=True)
    ok, reply = sim.job.drain("b", None, sim.now)
    assert ok
    assert "the job completes when rank 0 returns" in reply and "the job ends" not in reply, reply
    sim.advance(40)
    assert sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome
