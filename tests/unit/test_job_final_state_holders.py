"""Members that returned from their training function at the newest commit hold the final state (checkpoint review
s56, kill_final.py / kill_eval.py).

Rank 1 returned at commit 40 and waited (parked) for rank 0; rank 0 was killed during its final checkpoint write
or an evaluation at the end of its training function. The driver sent rank 1 away ("cannot rejoin after
returning"), logged "every worker that held the training state is gone" (false), then resumed from the checkpoint
of step 1, retrained 39 steps and reported success; without --checkpoint-dir it failed with "every worker that held
committed state is gone" (false too: rank 1 held it until it was sent away).
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.elastic_job import WorkerState
from tests.unit.test_job import CLEAN, KILLED, Sim, failed, started
from cloud_elastic.protocol import CompletionReply
from cloud_elastic.providers.api import Drain

pytestmark = pytest.mark.timeout(10)

S = WorkerState
LAST = 40


def rank1_parked_then_rank0_killed(checkpointing: bool) -> Sim:
    """Two members commit up to ``LAST`` (a checkpoint of step 1 stored); rank 1 returns and waits; rank 0 is
    killed before its training function returns (its final checkpoint write, an evaluation)."""
    sim = started(2, checkpointing=checkpointing)
    r0, r1 = sim.id("a[0]"), sim.id("a[1]")
    for wid in (r0, r1):
        sim.commits[wid] = LAST
        sim.job.heartbeat(wid, sim.now, LAST, LAST)
    if checkpointing:
        sim.job.checkpoint_saved(1, 1)
    assert sim.job.completed(r1, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1)
    sim.exit("a[0]", KILLED)
    return sim


def test_rank_0_lost_after_the_last_commit_a_returned_member_writes_it_and_the_job_fails_saying_so(caplog) -> None:
    caplog.set_level(logging.INFO)
    sim = rank1_parked_then_rank0_killed(checkpointing=True)
    launched = len(sim.launched)
    r1 = sim.id("a[1]")
    sim.advance(0.5)
    # It is told to leave with the time to write the newest commit, as the one writer (not "cannot rejoin").
    decision, why = sim.job.completion_reply(r1)
    seconds, writer = sim.job.leaving_checkpoint(r1)
    assert decision == "leave" and "cannot rejoin" not in why
    assert writer and seconds is not None and seconds > 0
    assert sim.outcome is None  # the job waits for its checkpoint
    sim.job.checkpoint_saved(LAST, LAST)
    sim.exit("a[1]", CLEAN)
    sim.advance(0.5)
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST}) while others had returned",
           f"the final state is in the checkpoint (step {LAST}): the same command resumes there and runs the end of "
           "the training function again")
    assert len(sim.launched) == launched  # nothing retrains from the checkpoint of step 1
    text = caplog.text
    assert "every worker that held the training state is gone" not in text
    assert "resumed from the checkpoint" not in text and "cannot rejoin" not in text


def test_the_final_state_unwritten_is_said_and_never_retrained_over() -> None:
    sim = rank1_parked_then_rank0_killed(checkpointing=True)
    sim.advance(0.5)
    sim.exit("a[1]", CLEAN)  # left without reporting its checkpoint stored
    sim.advance(0.5)
    failed(sim, "rank 0 was lost after the training loop's last commit (#40)",
           "the last checkpoint is of step 1, the last commit 40")
    assert sim.job.round == 1


def test_without_checkpoint_dir_the_end_line_says_who_held_the_final_state() -> None:
    sim = rank1_parked_then_rank0_killed(checkpointing=False)
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST}) while others had returned; the "
                "final state was held by rank(s) 1 but there is no --checkpoint-dir to write it to")
    assert "every worker that held committed state is gone" not in sim.outcome.reason


def three_at_the_last_commit_rank1_parked_rank0_killed() -> Sim:
    """Three members commit up to ``LAST`` (a checkpoint of step 1 stored); rank 1 returns and waits; rank 0 is
    killed in its final checkpoint write while rank 2 is still in its training function."""
    sim = started(3, checkpointing=True)
    for slot in ("a[0]", "a[1]", "a[2]"):
        wid = sim.id(slot)
        sim.commits[wid] = LAST
        sim.job.heartbeat(wid, sim.now, LAST, LAST)
    sim.job.checkpoint_saved(1, 1)
    assert sim.job.completed(sim.id("a[1]"), sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1)
    sim.exit("a[0]", KILLED)
    sim.advance(0.5)
    return sim


def test_a_parked_member_leaves_once_a_survivor_at_the_commit_comes_back_to_rendezvous() -> None:
    # Rank 2 (still in its training function, at the same commit) survives rank 0: it may return too (then it
    # holds the final state with rank 1) or come back to rendezvous (it was still in its loop): rank 1 waits.
    sim = three_at_the_last_commit_rank1_parked_rank0_killed()
    r1 = sim.id("a[1]")
    assert sim.outcome is None and sim.job.completion_reply(r1) is None
    sim.join("a[2]", reason="failure")  # it goes on with newcomers; rank 1 cannot rejoin
    sim.advance(0.5)
    assert sim.job.workers[r1].state is S.EXITING and sim.job.completion_reply(r1)[0] == "leave"
    assert sim.outcome is None


def test_rank_0_lost_a_survivor_that_returns_later_holds_the_final_state_with_the_parked_member(caplog) -> None:
    caplog.set_level(logging.INFO)
    sim = three_at_the_last_commit_rank1_parked_rank0_killed()
    r1, r2 = sim.id("a[1]"), sim.id("a[2]")
    assert sim.job.completion_reply(r1) is None  # not sent away: rank 2 may return too
    assert sim.job.completed(r2, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")  # not "done"
    sim.advance(1)
    told = {wid: (sim.job.completion_reply(wid)[0], *sim.job.leaving_checkpoint(wid)) for wid in (r1, r2)}
    assert all(decision == "leave" and seconds for decision, seconds, _ in told.values()), told
    assert sum(writer for _, _, writer in told.values()) == 1, told
    sim.job.checkpoint_saved(LAST, LAST)
    sim.exit("a[1]", CLEAN)
    sim.exit("a[2]", CLEAN)
    sim.advance(0.5)
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST}) while others had returned",
           f"the final state is in the checkpoint (step {LAST})")
    assert "cannot rejoin" not in caplog.text


@pytest.mark.parametrize("np_", [2, 3])
def test_rank0_killed_before_a_peer_returns_never_succeeds(np_) -> None:
    # review s56 rv10 kill_eval_order.py: rank 0 killed 1 s into its end-of-function evaluation, rank 1 returned
    # 2 s later and was told "done": "succeeded: training completed on 1 worker(s)", from the checkpoint of step 1.
    sim = started(np_, checkpointing=True)
    ids = [sim.id(f"a[{i}]") for i in range(np_)]
    for wid in ids:
        sim.commits[wid] = LAST
        sim.job.heartbeat(wid, sim.now, LAST, LAST)
    sim.job.checkpoint_saved(1, 1)
    if np_ == 3:
        assert sim.job.completed(ids[1], sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1)
    sim.exit("a[0]", KILLED)  # in its final checkpoint write / evaluation
    sim.advance(0.5)
    last = ids[-1]
    decision = sim.job.completed(last, sim.now, commit_seq=LAST, steps=LAST)
    assert decision == ("wait", "")
    sim.advance(1)
    assert sim.job.completion_reply(last)[0] == "leave"
    for i in range(1, np_):
        sim.exit(f"a[{i}]", CLEAN)
    sim.advance(35)
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST}) while others had returned")


def test_rank_0_lost_while_waiting_in_a_collective_after_an_early_return_relaunches_as_before() -> None:
    # review s56 rv10 sim_short.py: rank 1's sampler ran short (it returned at commit 30 of 100); rank 0, still
    # training, waited in its next allreduce and was killed 2 s later: the job failed, "rank 0 was lost after the
    # training loop's last commit (#30)", although its loop had not ended.
    sim = started(2, {"a": 1, "b": 1}, min_np=1, checkpointing=True)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    for wid in (r0, r1):
        sim.commits[wid] = 30
        sim.job.heartbeat(wid, sim.now, 30, 30)
    sim.job.checkpoint_saved(25, 25)
    assert sim.job.completed(r1, sim.now, commit_seq=30, steps=30) == ("wait", "")
    sim.job.heartbeat(r0, sim.now + 2, 30, 30, waiting_s=2.0)
    sim.advance(2)
    sim.exit("a[0]", KILLED)
    sim.advance(0.5)
    assert sim.job.completion_reply(r1) == (
        "leave", "its round ended before rank 0 finished training; it cannot rejoin after returning")
    sim.exit("b[0]", CLEAN)
    sim.advance(30)
    assert sim.outcome is None
    assert len(sim.slots_launched()) > 2  # relaunched: the next round resumes from the checkpoint


def rank1_parked(hosts: dict[str, int] | None, slots: tuple[str, str]) -> Sim:
    """Ranks 0 and 1 (on ``slots``) at commit ``LAST``, a checkpoint of step 1 stored; rank 1 returns and waits."""
    sim = started(2, hosts, checkpointing=True)
    r0, r1 = sim.id(slots[0]), sim.id(slots[1])
    for wid in (r0, r1):
        sim.commits[wid] = LAST
        sim.job.heartbeat(wid, sim.now, LAST, LAST)
    sim.job.checkpoint_saved(1, 1)
    assert sim.job.completed(r1, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1)
    return sim


def rank1_parked_with_a_notice_on_its_host() -> Sim:
    """Rank 0 on host a, rank 1 on host b (:func:`rank1_parked`); then a spot notice for host b, 120 s ahead."""
    sim = rank1_parked({"a": 1, "b": 1}, ("a[0]", "b[0]"))
    sim.discover({"a": 1}, {"b": Drain(deadline=sim.now + 120, reason="spot interruption")})
    sim.advance(1)
    return sim


def test_a_notice_on_a_parked_members_host_lets_it_wait_for_rank_0_and_run_the_rest_of_its_script() -> None:
    # review s56 rv10 sim_notice.py: rank 1 was told to leave at once, so the code after train() never ran on it.
    sim = rank1_parked_with_a_notice_on_its_host()
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    assert sim.job.completion_reply(r1) is None  # it waits for rank 0, as before
    assert sim.job.leaving_checkpoint(r1) == (None, False)
    sim.advance(3)
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r1) == ("done", "")
    sim.exit("b[0]", CLEAN)
    sim.exit("a[0]", CLEAN)
    sim.advance(35)
    assert sim.outcome is not None and sim.outcome.success and "on 2 worker(s)" in sim.outcome.reason, sim.outcome


def test_a_completion_replys_time_to_checkpoint_travels_and_an_older_drivers_reply_has_none() -> None:
    reply = CompletionReply("leave", "the job is failing", 12.5, True)
    assert CompletionReply.from_wire(reply.to_wire()) == reply
    assert CompletionReply.from_wire({"ok": True, "decision": "leave", "reason": "x"}) == CompletionReply("leave", "x")


def test_whole_hosts_another_host_returned_at_the_last_commit_writes_its_shards_when_host_0s_rank_0_is_lost() -> None:
    from tests.unit.test_job_whole_hosts import whole

    sim = whole(4, {"a": 2, "b": 2}, min_np=2, checkpointing=True)
    for slot in ("a[0]", "a[1]", "b[0]", "b[1]"):
        wid = sim.id(slot)
        sim.commits[wid] = LAST
        sim.job.heartbeat(wid, sim.now, LAST, LAST)
    for slot in ("a[1]", "b[0]", "b[1]"):
        assert sim.job.completed(sim.id(slot), sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.exit("a[0]", KILLED)  # host 0's rank 0, in its final sharded write
    sim.advance(0.5)
    told = {slot: (sim.job.completion_reply(sim.id(slot))[0], *sim.job.leaving_checkpoint(sim.id(slot)))
            for slot in ("a[1]", "b[0]", "b[1]")}
    assert all(decision == "leave" for decision, _, _ in told.values()), told
    # b writes (b[0] the one writer, b[1] its shards beside it); a[1], taken along with its host, does not.
    assert told["b[0]"][1] and told["b[0]"][2] and told["b[1]"][1] and not told["b[1]"][2], told
    assert told["a[1]"][1:] == (None, False), told
    for slot in ("a[1]", "b[0]", "b[1]"):
        sim.exit(slot, CLEAN)
    sim.advance(0.5)
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST}) while others had returned")


def test_a_parked_member_on_a_host_with_a_notice_writes_its_commit_at_the_leave_by_time(caplog) -> None:
    # review s56 rv13 sim_notice_all_deadline.py (F1): rank 1 returned and waited; rank 0 ran a long evaluation; a
    # notice for their host: rank 1 was never told to leave, both were removed by force and commit 40 was lost.
    caplog.set_level(logging.INFO)
    sim = rank1_parked(None, ("a[0]", "a[1]"))
    r0, r1 = sim.id("a[0]"), sim.id("a[1]")
    deadline = sim.now + 60
    sim.discover({}, {"a": Drain(deadline=deadline, reason="spot interruption")})
    told = None
    while told is None and sim.now < deadline:
        sim.advance(0.5)
        sim.job.heartbeat(r0, sim.now, LAST, LAST)  # rank 0 is still in its evaluation
        told = sim.job.completion_reply(r1)
    assert told is not None and told[0] == "leave", told
    seconds, writer = sim.job.leaving_checkpoint(r1)
    assert writer and seconds is not None and seconds > 0
    assert f"{r1} (rank 1) had not left" not in caplog.text  # not removed by force


def test_a_parked_member_drained_by_a_notice_writes_the_final_state_when_rank_0_is_lost() -> None:
    # review s56 rv13 sim_notice_then_kill.py (F2): rank 1, drained by a notice, left as an early return; the job
    # resumed from the checkpoint of step 1 and succeeded.
    sim = rank1_parked_with_a_notice_on_its_host()
    r1 = sim.id("b[0]")
    launched = len(sim.launched)
    sim.exit("a[0]", KILLED)
    sim.advance(0.5)
    decision, why = sim.job.completion_reply(r1)
    seconds, writer = sim.job.leaving_checkpoint(r1)
    assert decision == "leave" and "cannot rejoin" not in why
    assert writer and seconds is not None and seconds > 0
    sim.job.checkpoint_saved(LAST, LAST)
    sim.exit("b[0]", CLEAN)
    sim.advance(0.5)
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST}) while others had returned",
           f"the final state is in the checkpoint (step {LAST})")
    assert len(sim.launched) == launched  # nothing retrains from the checkpoint of step 1
