"""--finish-timeout bounds rank 0's own end-of-function work after a peer returned (review s57 rvF F2 of 35aadc1).

porting.md: "--finish-timeout counts from the first worker's return ...: a worker still running then is stopped and
the job fails naming it, never 'succeeded'". It counted only once rank 0 had returned (the job finishing): rank 1
returned at commit 40 and waited, rank 0 evaluated 40 s in its training function under --finish-timeout 10, and the
job ended rc 0 "succeeded" (finish_timeout_real.sh); with rank 1 sent away by a notice, 35aadc1's hold used the
timeout from when it was first seen and then started the --elastic-timeout wait, failing "fewer than --min-np 2
worker(s) for 20s" 50 s in, naming neither rank 0 nor --finish-timeout. Now the clock starts at the first return at
the newest commit (not an early return); past it rank 0 is stopped, a returned member writes that commit first, and
the job fails naming rank 0 and --finish-timeout. A drain's reply during such a round says that rank 0's return
completes the job (F3).
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.completion import EARLY_RETURN_WAIT_S
from tests.unit.test_finishing_round_min_np import LAST, rank1_left_with_the_final_state
from tests.unit.test_job import CLEAN, Sim, failed, started

pytestmark = pytest.mark.timeout(10)

STOPPED = "(rank 0) was still in its training function"


def rank1_parked(**policy) -> Sim:
    """Rank 0 on a, rank 1 on b, both at commit LAST (a checkpoint of step 1 stored); rank 1 returns and waits while
    rank 0 evaluates in its training function (heartbeating)."""
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


def test_rank_0_evaluating_past_the_finish_timeout_after_a_peer_returned_is_stopped_the_peer_writing_first() -> None:
    sim = rank1_parked(checkpointing=True, finish_timeout_s=30)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    sim.advance(29)
    assert sim.outcome is None and sim.stops == [] and sim.job.completion_reply(r1) is None
    sim.advance(2)
    assert [s.worker_id for s in sim.stops] == [r0]
    # The returned member holds the final state: it is told to leave writing it, and the job waits for it.
    decision, why = sim.job.completion_reply(r1)
    seconds, writer = sim.job.leaving_checkpoint(r1)
    assert decision == "leave" and writer and seconds, (decision, why)
    assert sim.outcome is None
    sim.job.checkpoint_saved(LAST, LAST)
    sim.exit("b[0]", CLEAN)
    sim.advance(0.5)
    failed(sim, f"rank 1 finished training, but worker {r0} {STOPPED} 3", "after rank 1 ", f"at commit {LAST} "
                "(--finish-timeout 30); stopped", f"the final state is in the checkpoint (step {LAST})")


def test_without_checkpoint_dir_the_job_fails_at_once_naming_rank_0_never_succeeded() -> None:
    sim = rank1_parked(finish_timeout_s=10)
    took = advance_until_ended(sim, 40)
    assert took <= 12, took
    failed(sim, f"worker {sim.id('a[0]')} {STOPPED}", "(--finish-timeout 10); stopped")


def test_rank_0_sent_on_after_the_member_left_with_the_final_state_fails_at_the_finish_timeout_not_min_np(
        caplog) -> None:
    """The 35aadc1 hold (rank 1 sent away by a notice, writing commit LAST): no --elastic-timeout wait after it."""
    sim, r0 = rank1_left_with_the_final_state(finish_timeout_s=30)  # about 15 s after rank 1's return
    took = advance_until_ended(sim, 60)
    assert 25 <= took <= 30, took  # 30 s from rank 1's return, a moment before the helper gave it back
    failed(sim, f"worker {r0} {STOPPED}", "(--finish-timeout 30); stopped",
           f"the checkpoint of step {LAST} holds the last commit")
    assert "elastic timeout" not in caplog.text and "below --min-np" not in caplog.text


def test_rank_0_returning_within_the_finish_timeout_succeeds_and_the_rest_counts_from_the_first_return() -> None:
    sim = rank1_parked(finish_timeout_s=30)
    sim.advance(20)
    assert sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("b[0]", CLEAN)
    sim.advance(9)
    assert sim.outcome is None  # rank 0's work after its function: 29 s after rank 1's return
    took = advance_until_ended(sim, 20)
    assert took <= 2, took
    failed(sim, f"worker {sim.id('a[0]')} (rank 0) was still running 3", "(--finish-timeout 30)")

    sim = rank1_parked(finish_timeout_s=30)
    sim.advance(20)
    sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=LAST, steps=LAST)
    sim.exit("b[0]", CLEAN)
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome


def test_an_early_return_starts_no_finish_timeout() -> None:
    """Rank 1 returned early (rank 0 waits in a collective for it): the early-return rule sends it away, rank 0 trains
    on, and a --finish-timeout shorter than that rule's wait stops nobody."""
    sim = rank1_parked(finish_timeout_s=2)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    sim.advance(0.5)
    sim.job.heartbeat(r0, sim.now, waiting_s=0.5)
    sim.advance(4)  # past --finish-timeout: rank 0 waits in a collective, which rank 1 will never join
    assert sim.outcome is None and sim.stops == [] and sim.job.completion_reply(r1) is None
    sim.job.heartbeat(r0, sim.now, waiting_s=EARLY_RETURN_WAIT_S + 0.5)
    sim.advance(0.5)
    assert sim.job.completion_reply(r1)[0] == "leave" and sim.job.workers[r1].returned_early
    sim.exit("b[0]", CLEAN)
    sim.advance(10)
    assert sim.outcome is None and sim.job.workers[r0].alive and sim.stops == []


def test_the_clock_starts_again_in_a_next_training_function(caplog) -> None:
    """Two hvd.elastic.run functions: the first's returns do not count against the second's end."""
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
    sim.advance(25)
    assert sim.outcome is None and sim.stops == []
    assert sim.job.completed(r0, sim.now, commit_seq=2 * LAST, steps=2 * LAST) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome


def test_a_drain_during_the_finishing_round_says_rank_0s_return_completes_the_job() -> None:
    """F3: a fixed -H list, rank 1 (b) returned and waits, rank 0 (a) evaluates; `cloud-elastic drain b` said the job
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

