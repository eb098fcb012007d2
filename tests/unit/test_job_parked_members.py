"""A member that returned from its training function before rank 0 (parked) while rank 0 is out of its round, its round
aborted, or after which the member itself dies (review s58 rvH, findings 1, 2 and 4).

1. Rank 0 back at rendezvous (its round aborted: a third member lost, its own collective timed out) when a peer
   returned: the peer's return completed the job as "succeeded" and rank 0 was sent away before finishing its data.
2. The no-progress watch aborted the round while rank 0 was in its function (an evaluation) and a peer waited at
   the newest commit: the peer was sent away unwritten ("cannot rejoin"), rank 0 given up, and the job failed
   resuming from the checkpoint of step 1.
4. A parked member SIGKILLed while rank 0 evaluated was taken for a mid-training loss (slot blacklisted, a
   replacement launched) and the job "succeeded".
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.completion import EARLY_RETURN_WAIT_S, STACKS_WAIT_S
from cloud_elastic.driver.job.elastic_job import Phase, WorkerState
from cloud_elastic.driver.job.exit_status import ExitStatus
from tests.unit.test_job import CLEAN, KILLED, Sim, assert_round, failed, started

pytestmark = pytest.mark.timeout(10)

S = WorkerState
LAST = 40


def at_commit(sim: Sim, commit: int, *slots: str) -> None:
    for slot in slots:
        wid = sim.id(slot)
        sim.commits[wid] = commit
        sim.job.heartbeat(wid, sim.now, commit, commit)


# ------------------------------------------------------------- finding 1: rank 0 back at rendezvous
@pytest.mark.parametrize("how", ["third member lost", "collective timed out"])
def test_a_return_while_rank_0_is_back_at_rendezvous_does_not_complete_the_job(how) -> None:
    # Uneven data: rank 1's loop ended at commit 20, ranks 0 (and 2) train on. Rank 0's next allreduce fails (rank 2
    # killed, or rank 1 evaluating locally past the collective timeout): rank 0 rolls back to rendezvous; then rank 1
    # returns. Before: "rank 1 finished training; round 1 is completing", rank 0 told "the job is finishing".
    np_ = 3 if how == "third member lost" else 2
    sim = started(np_, {"a": 1, "b": 1, "c": 1} if np_ == 3 else {"a": 1, "b": 1}, min_np=1)
    slots = ["a[0]", "b[0]", "c[0]"][:np_]
    at_commit(sim, 20, *slots)
    if np_ == 3:
        sim.exit("c[0]", KILLED)
    sim.join("a[0]", reason="failure")
    assert sim.job.workers[sim.id("a[0]")].state is S.WAITING
    r1 = sim.id("b[0]")
    assert sim.job.completed(r1, sim.now, commit_seq=20, steps=20) == ("wait", "")
    assert sim.job.phase is Phase.RUNNING
    sim.advance(0.5)
    # An early return (rank 0 trains on without it): it leaves, its slot backs off, rank 0 goes on in a new round.
    decision, why = sim.job.completion_reply(r1)
    assert decision == "leave" and "while rank 0" in why and "still training" in why, why
    assert sim.blocked("b[0]")
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is None
    at_commit(sim, 30, "a[0]")
    assert sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=30, steps=30) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success
    assert "on 1 worker(s)" in sim.outcome.reason


def test_a_return_while_rank_0_is_in_the_aborted_round_waits_for_rank_0_to_come_back() -> None:
    # Rank 2 killed, rank 0 not back yet (it learns of the abort at its next collective): rank 1, at rank 0's
    # commit, waits; rank 0 then comes back to rendezvous (it was still in its loop): rank 1 leaves as an early return.
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    at_commit(sim, 20, "a[0]", "b[0]", "c[0]")
    sim.exit("c[0]", KILLED)
    r1 = sim.id("b[0]")
    assert sim.job.completed(r1, sim.now, commit_seq=20, steps=20) == ("wait", "")
    sim.advance(2)
    assert sim.job.completion_reply(r1) is None and sim.outcome is None
    sim.join("a[0]", reason="failure")
    sim.advance(0.5)
    assert sim.job.completion_reply(r1)[0] == "leave" and sim.outcome is None
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)


# ------------------------------------------------------------- finding 2: the round aborted, rank 0 in its function
def parked_then_rank0_idle(progress_timeout: float = 10) -> tuple[Sim, str, str]:
    """-np 2 with --checkpoint-dir (the checkpoint of step 1 stored): rank 1 returns at commit ``LAST`` and waits; rank
    0 stays in its function making no progress (a remote evaluation) until the no-progress watch aborts the round."""
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True, progress_timeout_s=progress_timeout, elastic_timeout_s=60)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    at_commit(sim, LAST, "a[0]", "b[0]")
    sim.job.checkpoint_saved(1, 1)
    assert sim.job.completed(r1, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(progress_timeout + STACKS_WAIT_S + 1)
    assert sim.job.abort_round == 1 and sim.job.workers[r0].state is S.RUNNING
    return sim, r0, r1


def test_a_member_at_the_newest_commit_waits_through_an_abort_and_writes_it_when_rank_0_is_given_up() -> None:
    sim, r0, r1 = parked_then_rank0_idle()
    assert sim.job.completion_reply(r1) is None  # not "cannot rejoin": it holds the final state
    sim.advance(10 + STACKS_WAIT_S + 1)  # rank 0 still idle: given up for not coming back
    assert sim.job.workers[r0].state is S.LOST
    sim.advance(1)  # the next tick finds the final state held; the one after sends its holder away with it
    decision, why = sim.job.completion_reply(r1)
    seconds, writer = sim.job.leaving_checkpoint(r1)
    assert decision == "leave" and "cannot rejoin" not in why and writer and seconds, (why, seconds, writer)
    sim.job.checkpoint_saved(LAST, LAST)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST})",
           f"the final state is in the checkpoint (step {LAST})")
    assert "redoes" not in sim.outcome.reason


def test_rank_0_returning_after_the_abort_completes_the_job_with_the_waiting_member() -> None:
    sim, r0, r1 = parked_then_rank0_idle()
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r1) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success and "on 2 worker(s)" in sim.outcome.reason


def test_a_member_behind_rank_0s_commit_still_leaves_at_the_abort() -> None:
    # Rank 0 committed past it (it was still in its loop): it holds no final state, and leaves as before.
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True, progress_timeout_s=10, elastic_timeout_s=60)
    r1 = sim.id("b[0]")
    at_commit(sim, 30, "b[0]")
    at_commit(sim, 31, "a[0]")
    assert sim.job.completed(r1, sim.now, commit_seq=30, steps=30) == ("wait", "")
    sim.advance(10 + STACKS_WAIT_S + 1)
    assert sim.job.abort_round == 1
    assert sim.job.completion_reply(r1)[0] == "leave"


# ------------------------------------------------------------- finding 4: a parked member dies
@pytest.mark.parametrize("status, what", [(KILLED, "killed by signal 9"), (ExitStatus(1), "exited with code 1")])
def test_a_parked_member_that_dies_fails_the_job_naming_it_once_rank_0_returns(status, what) -> None:
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True, elastic_timeout_s=20)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    at_commit(sim, LAST, "a[0]", "b[0]")
    assert sim.job.completed(r1, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1)
    sim.exit("b[0]", status)
    sim.advance(5)
    # Not a mid-training loss: no abort (rank 0 evaluates on), its slot not blacklisted.
    assert sim.job.abort_round == 0 and not sim.blocked("b[0]")
    assert sim.outcome is None
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.advance(31)  # the replacement launched meanwhile is stopped (it had no part in the result)
    failed(sim, f"rank 0 finished training, but worker {r1} (rank 1) {what} after its training function returned "
                f"(commit {LAST}")
    assert [f["worker"] for kind, f in sim.events if kind == "worker_failed"] == [r1]


def test_a_parked_member_gone_silent_is_stopped_and_fails_the_job_naming_it_once_rank_0_returns() -> None:
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True, elastic_timeout_s=20)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    at_commit(sim, LAST, "a[0]", "b[0]")
    assert sim.job.completed(r1, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.silent.add(r1)  # its host lost
    sim.advance(sim.job.policy.heartbeat_timeout_s + 2)
    assert sim.job.workers[r1].state is S.LOST and [s.worker_id for s in sim.stops] == [r1]
    assert sim.job.abort_round == 0 and not sim.blocked("b[0]") and sim.outcome is None
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.advance(31)
    failed(sim, f"rank 0 finished training, but worker {r1} (rank 1) ", "after its training function returned")


# ------------------------------------------------------------- review s58 rvN finding 1: an early returner dies parked
def early_returner_parked() -> tuple[Sim, str, str]:
    """Uneven data, -np 2 --min-np 1: rank 1's loop ended at commit 20 (parked); rank 0's goes on to 30."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    at_commit(sim, 20, "a[0]", "b[0]")
    assert sim.job.completed(r1, sim.now, commit_seq=20, steps=20) == ("wait", "")
    sim.advance(1)
    return sim, r0, r1


def rank0_trains_on_alone_and_succeeds(sim: Sim, r0: str, r1: str) -> None:
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)
    at_commit(sim, 30, "a[0]")
    assert sim.job.completed(r0, sim.now, commit_seq=30, steps=30) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.advance(31)  # a replacement launched on b[0] before the early return was known is stopped
    assert sim.outcome is not None and sim.outcome.success, sim.outcome
    assert not [f for kind, f in sim.events if kind == "worker_failed"]
    left = [f for kind, f in sim.events if kind == "worker_left" and f["worker"] == r1]
    assert left and left[-1]["early_return"] and left[-1]["commit_step"] == 20, left


@pytest.mark.parametrize("how", ["killed", "silent"])
def test_an_early_returner_lost_while_rank_0_waits_for_it_leaves_and_the_job_succeeds(how) -> None:
    # kill_early.sh: rank 0 is in its step-21 allreduce when rank 1 (parked at 20) is OOM-killed or its host lost.
    # Before: no abort until the early-return rule, and rc 1 "rank 0 finished training, but worker ... (rank 1)
    # ... after its training function returned (commit 20 ...)" once rank 0 had trained to 30.
    sim, r0, r1 = early_returner_parked()
    sim.job.heartbeat(r0, sim.now, 20, 20, waiting_s=1.0)  # below EARLY_RETURN_WAIT_S: the rule alone waits on
    if how == "killed":
        sim.exit("b[0]", KILLED)
    else:
        sim.silent.add(r1)
        sim.advance(sim.job.policy.heartbeat_timeout_s + 2)
        assert sim.job.workers[r1].state is S.LOST
    sim.advance(0.5)
    assert sim.job.abort_round == 1  # at once: rank 0 is freed from the collective that needs it
    sim.join("a[0]", reason="failure")
    rank0_trains_on_alone_and_succeeds(sim, r0, r1)


@pytest.mark.parametrize("then", ["rank 0 waits in its next collective", "rank 0's next collective fails"])
def test_an_early_returner_killed_before_rank_0_reaches_a_collective_leaves_and_the_job_succeeds(then) -> None:
    # kill_early_slow0.sh: rank 0 computes outside any collective when rank 1 is killed; only later does it show
    # that it trains on (a wait in a collective, or back at rendezvous after the collective's error).
    sim, r0, r1 = early_returner_parked()
    sim.exit("b[0]", KILLED)
    sim.advance(1)
    assert sim.job.abort_round == 0 and sim.outcome is None  # it may still hold the final state: rank 0 may return
    if then == "rank 0 waits in its next collective":
        sim.job.heartbeat(r0, sim.now, 20, 20, waiting_s=EARLY_RETURN_WAIT_S + 0.5)
        sim.advance(0.5)
        assert sim.job.abort_round == 1
    sim.join("a[0]", reason="failure")
    rank0_trains_on_alone_and_succeeds(sim, r0, r1)
