"""Honest endings in the driver state machine: who decides completion, what fails a finished job,
and the no-progress backstop for a round that is stuck while every member still heartbeats."""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.elastic_job import EARLY_RETURN_WAIT_S, STACKS_WAIT_S, Finish, Phase, WorkerState
from tests.unit.test_job import CLEAN, CRASH, KILLED, PAST_FIRST_COOLDOWN_S, Sim, assert_round, failed, started

pytestmark = pytest.mark.timeout(10)


def complete(sim: Sim, slot: str, **report) -> tuple[str, str]:
    decision = sim.job.completed(sim.id(slot), sim.now, **report)
    sim._collect()
    return decision


def reply(sim: Sim, slot: str) -> tuple[str, str] | None:
    return sim.job.completion_reply(sim.id(slot))


def beat(sim: Sim, slot: str, **fields) -> None:
    sim.job.heartbeat(sim.id(slot), sim.now, **fields)


# ----------------------------------------------------------- completion is rank 0's
def test_a_member_returning_first_waits_for_rank_0_and_rank_0_completes_the_job() -> None:
    sim = started(3, {"a": 3})
    assert complete(sim, "a[2]", commit_seq=40, steps=40) == ("wait", "")
    assert sim.job.phase is Phase.RUNNING and reply(sim, "a[2]") is None
    sim.advance(2)
    assert reply(sim, "a[2]") is None  # rank 0 is not waiting in a collective: it may still return
    assert complete(sim, "a[0]") == ("done", "")
    assert sim.job.phase is Phase.FINISHING
    assert reply(sim, "a[2]") == ("done", "")
    assert complete(sim, "a[1]") == ("done", "")
    for slot in ("a[0]", "a[1]", "a[2]"):
        sim.exit(slot, CLEAN)
    assert sim.outcome == Finish(True, "training completed on 3 worker(s) after 0 reset(s)", 0)


def test_a_member_that_returns_while_rank_0_trains_on_leaves_and_the_others_continue(caplog) -> None:
    """Horovod's MNIST example with a sampler sized once: the newcomer's epoch is shorter."""
    sim = started(3, {"a": 3}, min_np=1)
    sim.commit("a[0]", "a[1]", "a[2]", count=37)
    assert complete(sim, "a[2]", commit_seq=37, steps=37) == ("wait", "")
    sim.advance(1)
    beat(sim, "a[0]", waiting_s=EARLY_RETURN_WAIT_S + 0.5)  # rank 0 is stuck in the next step's allreduce
    sim.advance(0.5)
    decision, reason = reply(sim, "a[2]")
    assert decision == "leave"
    assert "while rank 0" in reason and "at commit 37" in reason
    assert "sized for another world size" in caplog.text  # the likely cause is the driver's to explain, once
    assert sim.job.abort_round == 1  # frees rank 0 from the collective the leaver will never join
    sim.exit("a[2]", CLEAN)
    left = [f for kind, f in sim.events if kind == "worker_left"]
    assert len(left) == 1 and left[0]["early_return"] is True and left[0]["commit_step"] == 37, left
    assert not any(kind == "worker_failed" for kind, _ in sim.events)
    # A newcomer there would run the same short loop: the slot backs off as after a failure (issue 44).
    assert sim.blocked("a[2]") and left[0]["blacklisted_s"] >= 10
    assert_round(sim.join("a[0]", "a[1]", reason="failure"), 2, needs_sync=True)
    sim.advance(PAST_FIRST_COOLDOWN_S)
    replacement = sim.id("a[2]")  # once it has cooled down, a new worker is started there
    assert replacement != left[-1]["worker"]
    assert complete(sim, "a[0]") == ("done", "")
    assert complete(sim, "a[1]") == ("done", "")
    assert replacement in [s.worker_id for s in sim.stops]  # it never joined: stopped at once
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CLEAN)
    sim.exit("a[2]", KILLED)
    assert sim.outcome == Finish(True, "training completed on 2 worker(s) after 1 reset(s)", 0)


def test_a_wait_reported_before_the_member_returned_is_not_taken_for_an_early_return() -> None:
    sim = started(2, {"a": 2})
    beat(sim, "a[0]", waiting_s=EARLY_RETURN_WAIT_S + 3)  # a slow last allreduce, which a[1] did join
    sim.now += 0.1
    assert complete(sim, "a[1]") == ("wait", "")
    sim.job.tick(sim.now)
    assert reply(sim, "a[1]") is None
    assert complete(sim, "a[0]") == ("done", "")
    assert reply(sim, "a[1]") == ("done", "")


def test_the_job_never_succeeds_while_rank_0_has_not_finished() -> None:
    sim = started(2, {"a": 2}, finish_timeout_s=30)  # counts from rank 0's return (test_finish_timeout_hold.py)
    sim.commit("a[0]", "a[1]", count=5)
    complete(sim, "a[1]")
    sim.advance(60)  # no completion grace runs out: the job is not completing
    assert sim.outcome is None and sim.job.phase is Phase.RUNNING
    sim.exit("a[0]", KILLED)  # rank 0 dies before returning (its final save never ran)
    assert reply(sim, "a[1]")[0] == "leave"
    sim.exit("a[1]", CLEAN)
    # a[1] held the final state: the line says so (test_job_final_state_holders.py), not "training state lost".
    failed(sim, "rank 0 was lost after the training loop's last commit", "held by rank(s) 1")


# ------------------------------------------------- what fails a job that completed
def test_a_nonzero_exit_after_completion_fails_the_job_naming_the_worker_and_its_step() -> None:
    sim = started(2, {"a": 2})
    sim.commit("a[0]", "a[1]", count=12)
    complete(sim, "a[0]", commit_seq=12, steps=48)
    complete(sim, "a[1]", commit_seq=12, steps=48)
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CRASH)  # e.g. a final torch.save that failed
    failed(sim, "rank 0 finished training, but worker", "exited with code 1 after its training function returned",
           "commit 12", "48 optimizer step(s)")
    event = [f for kind, f in sim.events if kind == "worker_failed"][-1]
    assert event["exit_code"] == 1 and "after its training function returned" in event["reason"]


def test_a_final_checkpoint_that_was_not_written_fails_the_job() -> None:
    sim = started(2, {"a": 2})
    complete(sim, "a[1]")
    complete(sim, "a[0]", error="the final checkpoint (step 9) was not written: disk full")
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CLEAN)
    failed(sim, "rank 0 finished training", "the final checkpoint (step 9) was not written: disk full")


# ------------------------------------------------------------ the no-progress watch
def test_a_round_without_progress_is_aborted_once_its_members_sent_their_stacks() -> None:
    sim = started(2, {"a": 2}, progress_timeout_s=30)
    sim.advance(29)
    assert sim.poll("a[0]").stacks == 0
    sim.advance(2)
    stalled = [f for kind, f in sim.events if kind == "round_stalled"]
    assert len(stalled) == 1 and stalled[0]["round"] == 1 and stalled[0]["idle_s"] >= 30
    request = sim.poll("a[0]").stacks
    assert request > 0 and sim.poll("a[1]").stacks == request
    assert sim.job.abort_round == 0  # stacks first: they show the stuck state, not the recovery
    sim.job.stacks_received(sim.id("a[0]"), request)
    sim.job.stacks_received(sim.id("a[1]"), request)
    sim.advance(0.5)
    assert sim.job.abort_round == 1
    assert_round(sim.join("a[0]", "a[1]", reason="failure"), 2, needs_sync=True)
    assert len([kind for kind, _ in sim.events if kind == "round_stalled"]) == 1


def test_a_silent_stacks_request_does_not_delay_the_abort_past_its_wait() -> None:
    sim = started(2, {"a": 2}, progress_timeout_s=30)
    sim.advance(31)
    assert sim.job.abort_round == 0
    sim.advance(STACKS_WAIT_S + 0.5)
    assert sim.job.abort_round == 1


def test_progress_of_any_member_keeps_the_round_going() -> None:
    sim = started(2, {"a": 2}, progress_timeout_s=30)
    for i in range(1, 20):
        sim.advance(5)
        beat(sim, "a[1]", progress=i)
    assert sim.job.abort_round == 0 and not any(kind == "round_stalled" for kind, _ in sim.events)


def test_a_progress_timeout_of_zero_never_aborts() -> None:
    sim = started(2, {"a": 2}, progress_timeout_s=0)
    sim.advance(600)
    assert sim.job.abort_round == 0


def test_a_member_that_does_not_come_back_after_an_abort_is_given_up_after_its_stacks() -> None:
    sim = started(3, {"a": 3}, min_np=1, progress_timeout_s=20)
    sim.exit("a[2]", KILLED)
    assert sim.job.abort_round == 1
    sim.join("a[0]", reason="failure")  # a[1] is stuck where the abort cannot reach it
    sim.advance(21)
    assert sim.poll("a[1]").stacks > 0 and sim.poll("a[0]") is not None
    sim.advance(STACKS_WAIT_S + 0.5)
    stuck = sim.job.workers[sim.id("a[1]")]
    assert stuck.state is WorkerState.LOST and "did not come back to rendezvous" in stuck.why
    assert [s.worker_id for s in sim.stops if s.immediate] == [sim.id("a[1]")]
    assert sim.blocked("a[1]")
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)


def test_survivors_computing_after_an_abort_are_waited_for_and_one_whose_progress_stops_is_given_up() -> None:
    # A local evaluation pass of minutes, no collective in it: the survivors learn of the peer's death only at
    # their next collective. Their counters keep growing (they compute): past --progress-timeout after the
    # abort they are working, not stuck. a[1] stops progressing 60 s after the abort (blocked): it is given up
    # a timeout later, as before.
    sim = started(3, {"a": 3}, min_np=1, progress_timeout_s=120)
    sim.commit("a[0]", "a[1]", "a[2]", count=50)
    sim.exit("a[2]", CRASH)
    assert sim.job.abort_round == 1
    for second in range(1, 201):
        beat(sim, "a[0]", progress=second)
        beat(sim, "a[1]", progress=min(second, 60))
        sim.advance(1)
    computing, blocked = sim.job.workers[sim.id("a[0]")], sim.job.workers[sim.id("a[1]")]
    assert computing.state is WorkerState.RUNNING and sim.outcome is None
    assert blocked.state is WorkerState.LOST and "with no progress for the last" in blocked.why, blocked.why
    stalled = [e for kind, e in sim.events if kind == "round_stalled"]
    assert [e["workers"] for e in stalled] == [[sim.id("a[1]")]] and stalled[0]["idle_s"] > 120, stalled
    sim.join("a[0]", reason="failure")  # its evaluation done, it reaches its next collective and comes back
    assert_round({"a[0]": sim.reply("a[0]")}, 2, needs_sync=True)


# ----------------------------------------------------------------- messages
@pytest.mark.parametrize("committed, says", [
    # Heartbeats tell of commits late: before one has, the driver cannot say the survivors start over.
    (False, "survivors roll back to their last commit (none reported yet: the initial state if none)"),
    (True, "survivors roll back to their last commit\n"),
])
def test_an_abort_says_what_the_survivors_do(caplog, committed, says) -> None:
    sim = started(2, {"a": 2}, min_np=1)
    if committed:
        sim.commit("a[0]", "a[1]")
    with caplog.at_level(logging.INFO, logger="cloud_elastic.driver.job"):
        sim.exit("a[1]", KILLED)
    assert f"round 1 aborted; {says}" in caplog.text


def test_an_abort_with_nobody_left_does_not_speak_of_survivors(caplog) -> None:
    sim = started(1, {"a": 1})
    with caplog.at_level(logging.INFO, logger="cloud_elastic.driver.job"):
        sim.exit("a[0]", KILLED)
    assert "round 1 aborted; no member is left in it" in caplog.text
    assert "survivors" not in caplog.text
