"""Parked members that end (review s59 rvO findings 1 and 2).

1. p4.sh k3: -np 4, ranks 1 and 2 parked at the last commit while rank 0 evaluates; rank 1 SIGKILLed (pending: it may
   hold the final state), then rank 3 killed in its own evaluation (the round aborted). Rank 1 dropped out of the
   parked set at the abort, and the next tick settled it as an early return: "killed by signal 9 after returning
   early ... no failure", rc 0. Without rank 3's loss the job failed naming rank 1, as it must.
2. wh.sh kill: under --whole-hosts, a parked early returner SIGKILLed before rank 0 reached a collective left as an
   early return, but its host-mate stayed at rendezvous for the rest of training, its host neither whole nor free
   (an early return found alive takes its host-mate along), and the result counted the dead one: "completed on 3
   worker(s)" for 2.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import WorkerState
from tests.unit.test_job import CLEAN, KILLED, failed, started
from tests.unit.test_job_whole_hosts import whole
from tests.unit.test_operator_drain_reply_cases import LAST

pytestmark = pytest.mark.timeout(30)

S = WorkerState


def at_commit(sim, commit: int, *slots: str) -> None:
    for slot in slots:
        wid = sim.id(slot)
        sim.commits[wid] = commit
        sim.job.heartbeat(wid, sim.now, commit, commit)


# ------------------------------------------------------------- finding 1
@pytest.mark.parametrize("third_lost", [True, False])
def test_a_killed_parked_holder_fails_the_job_even_when_another_member_is_lost_too(third_lost) -> None:
    sim = started(4, {"a": 1, "b": 1, "c": 1, "d": 1}, min_np=1, elastic_timeout_s=60)
    r0, r1, r2 = sim.id("a[0]"), sim.id("b[0]"), sim.id("c[0]")
    at_commit(sim, LAST, "a[0]", "b[0]", "c[0]", "d[0]")
    for wid in (r1, r2):
        assert sim.job.completed(wid, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1.5)
    sim.exit("b[0]", KILLED)  # rank 1, parked at the last commit: pending, it may hold the final state
    sim.advance(2)
    if third_lost:
        sim.exit("d[0]", KILLED)  # rank 3, still in its function (an evaluation): the round is aborted
        sim.advance(2)
        assert sim.job.abort_round == 1
    sim.advance(10)  # rank 0 evaluates on; ticks of the early-return rule after the abort
    assert sim.job.completion_reply(r2) is None  # rank 2 still waits for rank 0: it holds the final state
    assert not [f for kind, f in sim.events if kind == "worker_left" and f["worker"] == r1]
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r2) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("c[0]", CLEAN)
    if not third_lost:
        sim.exit("d[0]", CLEAN)
    sim.advance(31)
    failed(sim, f"rank 0 finished training, but worker {r1} (rank 1) killed by signal 9 after its training function "
                f"returned (commit {LAST}")
    assert [f["worker"] for kind, f in sim.events if kind == "worker_failed" and f["worker"] == r1] == [r1]


# ------------------------------------------------------------- finding 2
@pytest.mark.parametrize("when", ["before rank 0 reaches a collective", "while rank 0 waits in a collective"])
def test_a_dead_early_returners_host_mate_leaves_with_it_under_whole_hosts(when) -> None:
    # Two 2-slot hosts; b[1] (rank 3) returns early at commit 20, the others train on to 30.
    sim = whole(4, {"a": 2, "b": 2}, min_np=2, elastic_timeout_s=60)
    r0, r3, mate = sim.id("a[0]"), sim.id("b[1]"), sim.id("b[0]")
    at_commit(sim, 20, "a[0]", "a[1]", "b[0]", "b[1]")
    assert sim.job.completed(r3, sim.now, commit_seq=20, steps=20) == ("wait", "")
    sim.advance(1)
    if when == "while rank 0 waits in a collective":
        sim.job.heartbeat(r0, sim.now, 20, 20, waiting_s=1.0)  # below EARLY_RETURN_WAIT_S
        sim.exit("b[1]", KILLED)  # an early return at once: the round is aborted, rank 0 freed
        sim.advance(0.5)
        assert sim.job.abort_round == 1
        sim.join("a[0]", "a[1]", reason="failure")
    else:
        sim.exit("b[1]", KILLED)  # rank 0 computes outside any collective: it may still hold the final state
        sim.advance(1)
        assert sim.job.abort_round == 0
        sim.join("a[0]", "a[1]", "b[0]", reason="failure")  # the next allreduce fails: all back at rendezvous
    sim.advance(1)
    w = sim.job.workers[mate]
    assert w.state in (S.DRAINING, S.EXITING) and "of its host left" in w.why and "--whole-hosts" in w.why, \
        (w.state, w.why)
    left = [f for kind, f in sim.events if kind == "worker_left" and f["worker"] == r3]
    assert left and left[-1]["early_return"], left
    if w.state is S.DRAINING:  # still in the aborted round: it comes back to rendezvous and is told to exit there
        sim.join("b[0]", reason="failure")
        sim.advance(0.5)
    assert sim.job.workers[mate].state is S.EXITING
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sorted(sim.layout()) == ["a[0]", "a[1]"]
    at_commit(sim, 30, "a[0]", "a[1]")
    assert sim.job.completed(sim.id("a[1]"), sim.now, commit_seq=30, steps=30) == ("wait", "")
    assert sim.job.completed(r0, sim.now, commit_seq=30, steps=30) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CLEAN)
    sim.advance(31)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome
    assert "on 2 worker(s)" in sim.outcome.reason, sim.outcome.reason


# ------------------------------------------------------------- the review's suspicion: no event at all
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_dead_holder_is_named_in_the_events_when_rank_0_is_lost_too(checkpointing) -> None:
    # Ranks 1 and 2 parked at the last commit; rank 1 killed (pending), then rank 0 lost in its evaluation: the job
    # ends for the final state rank 2 holds. Before, rank 1's death had no worker_failed nor worker_left event.
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1, elastic_timeout_s=60, checkpointing=checkpointing)
    r1, r2 = sim.id("b[0]"), sim.id("c[0]")
    at_commit(sim, LAST, "a[0]", "b[0]", "c[0]")
    if checkpointing:
        sim.job.checkpoint_saved(1, 1)
    for wid in (r1, r2):
        assert sim.job.completed(wid, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1)
    sim.exit("b[0]", KILLED)
    sim.advance(1)
    sim.exit("a[0]", KILLED)
    sim.advance(2)
    if checkpointing:  # rank 2 writes the final state, then the job ends
        assert sim.job.completion_reply(r2)[0] == "leave"
        sim.job.checkpoint_saved(LAST, LAST)
        sim.exit("c[0]", CLEAN)
        sim.advance(20)  # the graceful stop's time for a replacement launched on b[0] meanwhile
    failed(sim, f"rank 0 was lost after the training loop's last commit (#{LAST})")
    ends = [(kind, f["reason"]) for kind, f in sim.events if kind in ("worker_failed", "worker_left")
            and f["worker"] == r1]
    assert ends == [("worker_failed", "killed by signal 9 after its training function returned")], ends


# ------------------------------------------------------------- the same, for a job stopped before it completes
@pytest.mark.parametrize("how", ["at once", "graceful"])
def test_a_dead_holder_is_named_in_the_events_when_a_signal_stops_the_job(how) -> None:
    # Rank 1 parked at the last commit and killed (pending) while rank 0 evaluates; then SIGINT stops the job: at once
    # without --checkpoint-dir, gracefully with it. Before, rank 1's death had no worker_failed nor worker_left event
    # (fixT d1.sh int/term: events.jsonl held only job_finished, or a replacement's worker_left).
    checkpointing = how == "graceful"
    sim = started(2, {"a": 1, "b": 1}, min_np=1, elastic_timeout_s=60, checkpointing=checkpointing)
    r1 = sim.id("b[0]")
    at_commit(sim, LAST, "a[0]", "b[0]")
    if checkpointing:
        sim.job.checkpoint_saved(1, 1)
    assert sim.job.completed(r1, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(1.5)
    sim.exit("b[0]", KILLED)
    sim.advance(2)
    assert not [f for kind, f in sim.events if kind in ("worker_failed", "worker_left") and f["worker"] == r1]
    sim.job.stop("interrupted by SIGINT", 130, sim.now, grace_s=20.0 if checkpointing else 0.0)
    sim.advance(21)
    assert sim.outcome is not None and sim.outcome.exit_code == 130, sim.outcome
    ends = [(kind, f["reason"]) for kind, f in sim.events if kind in ("worker_failed", "worker_left")
            and f["worker"] == r1]
    assert ends == [("worker_failed", "killed by signal 9 after its training function returned")], ends
