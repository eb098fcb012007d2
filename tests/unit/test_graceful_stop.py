"""SIGINT/SIGTERM with ``--checkpoint-dir``: the workers stop at their next commit, rank 0 checkpoints it, and the
job ends once they have exited (or its time is up), saying which step the next run resumes from. Found by
review: a Ctrl-C lost everything since the last periodic checkpoint (step 220 trained, the rerun resumed at 154)."""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.elastic_job import ExitOrder, WorkerState
from cloud_elastic.driver.job.stopping import WRITE_S
from cloud_elastic.driver.launch.api import ExitStatus
from tests.unit.test_job import CRASH, Sim, assert_round

pytestmark = pytest.mark.timeout(10)

SIGINT = ("interrupted by SIGINT", 130)
GRACE = 20.0


def training(checkpointing: bool = True, *, every_s: float = 1.0) -> Sim:
    """Two workers (rank 0 on a) in round 1, both at commit 9, their heartbeats showing a commit every ``every_s``
    (the last just now); the periodic checkpoint holds commit 1 (step 10)."""
    sim = Sim(2, checkpointing=checkpointing)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    commits_at_pace(sim, ["a[0]", "b[0]"], 9, every_s)
    sim.job.checkpoint_saved(10, 1)
    return sim


def commits_at_pace(sim: Sim, slots: list[str], last: int, every_s: float) -> None:
    """The heartbeats of ``slots`` show commits ``last - 2`` to ``last``, ``every_s`` apart (two gaps: the time to
    the first rise seen is no gap between commits)."""
    for seq in (last - 2, last - 1, last):
        if seq > last - 2:
            sim.advance(every_s)
        for slot in slots:
            sim.job.heartbeat(sim.id(slot), sim.now, seq, seq)


def stop(sim: Sim, reason: str, exit_code: int, *, grace_s: float = 0.0) -> None:
    """A signal, as the driver's loop passes it on (``grace_s`` 0: the second one)."""
    sim.job.stop(reason, exit_code, sim.now, grace_s=grace_s)
    sim._collect()


def leave_at_commit(sim: Sim, seq: int, round_: int = 1) -> dict[str, ExitOrder]:
    """Both members saw the update, commit ``seq`` and come to rendezvous from ``round_``: their exit orders."""
    orders = {}
    for slot in ("a[0]", "b[0]"):
        wid = sim.id(slot)
        assert sim.job.workers[wid].state is WorkerState.DRAINING
        sim.job.rendezvous(wid, round_, "update", sim.now, seq, 0, seq)
        orders[slot] = sim.reply(slot)
        assert isinstance(orders[slot], ExitOrder), orders[slot]
    return orders


def exit_with_the_checkpoint_of(sim: Sim, step: int, seq: int) -> None:
    """Rank 0 reports the checkpoint of commit ``seq`` it wrote on its way out, and both exit: it is kept."""
    sim.job.checkpoint_saved(step, seq)
    for slot in ("a[0]", "b[0]"):
        sim.exit(slot, ExitStatus(0))
    assert sim.outcome is not None and sim.outcome.reason == (
        f"interrupted by SIGINT; checkpoint of step {step} written; the same command resumes from it")


def test_a_signal_drains_every_member_at_its_next_commit_and_ends_with_the_checkpoint_of_that_commit() -> None:
    sim = training()
    gen = sim.poll("a[0]").update_gen
    stop(sim, *SIGINT, grace_s=GRACE)
    sim.advance(2)
    assert sim.outcome is None  # the workers still hold the steps since the checkpoint
    assert sim.poll("a[0]").update_gen > gen  # every member leaves at the same next commit: no rollback
    sim.discover({"a": 1, "b": 1, "c": 1})  # nothing launches while the job stops
    orders = leave_at_commit(sim, 12)
    # The exit order asks the holders to checkpoint, within the stop's time less one margin to exit.
    assert orders["a[0]"].checkpoint_s == pytest.approx(GRACE - 2 - sim.job.policy.deadline_margin_s)
    sim.job.checkpoint_saved(120, 12)  # rank 0's report of the checkpoint it wrote on its way out
    sim.exit("a[0]", ExitStatus(0))
    assert sim.outcome is None
    sim.exit("b[0]", ExitStatus(0))
    assert sim.outcome is not None and (sim.outcome.success, sim.outcome.exit_code) == (False, 130)
    assert sim.outcome.reason == ("interrupted by SIGINT; checkpoint of step 120 written; the same command "
                                  "resumes from it")
    assert sim.slots_launched() == ["a[0]", "b[0]"] and sim.stops == []
    assert [e for e in sim.events if e[0] == "rollback"] == []


def test_a_checkpoint_not_written_in_time_ends_the_job_at_the_bound_saying_the_steps_to_redo() -> None:
    sim = training()
    stop(sim, *SIGINT, grace_s=GRACE)
    leave_at_commit(sim, 12)  # rank 0 writes, but storage is too slow: no report
    sim.advance(GRACE - 1)
    assert sim.outcome is None
    sim.advance(1.5)
    assert sim.outcome is not None and sim.outcome.exit_code == 130
    assert sim.outcome.reason == (
        "interrupted by SIGINT; 2 worker(s) had not exited in time; the last checkpoint is of step 10, the last "
        "commit 12: the same command resumes from that checkpoint, and 11 committed step(s) will be redone")


def test_a_second_signal_stops_at_once() -> None:
    sim = training()
    stop(sim, *SIGINT, grace_s=GRACE)
    sim.advance(1)
    stop(sim, "terminated by SIGTERM", 143, grace_s=GRACE)  # a repeated graceful request: no change
    assert sim.outcome is None
    stop(sim, *SIGINT)  # the second signal
    assert sim.outcome is not None and sim.outcome.exit_code == 130
    assert sim.outcome.reason.startswith("interrupted by SIGINT during the graceful stop: stopped at once; the last "
                                         "checkpoint is of step 10, the last commit 9:")


LOST = ("; no --checkpoint-dir: cloud-elastic wrote no checkpoint, so the state the workers trained in memory is lost "
        "unless the script saved its own")


def test_without_a_checkpoint_dir_a_signal_ends_the_job_at_once_saying_the_trained_state_is_lost() -> None:
    """Review s63 rvU finding 8: the line said only "interrupted by SIGINT", and a torchrun user expects a checkpoint
    of the script's own: it now says the trained state was kept nowhere durable."""
    sim = training(checkpointing=False)
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is not None and (sim.outcome.reason, sim.outcome.exit_code) == (SIGINT[0] + LOST, 130)


def test_without_a_checkpoint_dir_a_signal_before_any_round_formed_says_nothing_of_lost_state() -> None:
    sim = Sim(2, checkpointing=False)
    sim.discover({"a": 1, "b": 1})
    sim.join("a[0]")  # b has not come: no round formed, nothing trained
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is not None and sim.outcome.reason == SIGINT[0]


def test_a_signal_before_any_worker_holds_state_ends_the_job_at_once() -> None:
    sim = Sim(2, checkpointing=True)
    sim.discover({"a": 1, "b": 1})
    sim.join("a[0]")  # b has not come: no round, nothing committed to keep
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is not None and sim.outcome.reason == SIGINT[0]


def test_holders_waiting_at_rendezvous_are_told_to_checkpoint_and_newcomers_just_exit() -> None:
    sim = Sim(2, max_np=3, checkpointing=True)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.commit("a[0]", "b[0]", count=5)
    sim.exit("b[0]", ExitStatus(1))  # b fails: a rolls back and waits for the next round
    sim.discover({"a": 1, "c": 1})
    assert sim.job.rendezvous(sim.id("a[0]"), 1, "failure", sim.now, 5, 0, 5) is None
    assert sim.reply("a[0]") is None
    stop(sim, *SIGINT, grace_s=GRACE)
    order = sim.reply("a[0]")
    assert isinstance(order, ExitOrder) and order.checkpoint_s == pytest.approx(GRACE - 5.0)
    newcomer = [w for w in sim.job.workers.values() if w.slot.host == "c"]
    assert all(w.state is WorkerState.EXITING for w in newcomer)
    assert [s.worker_id for s in sim.stops] == [w.worker_id for w in newcomer]  # not at rendezvous: stopped


def test_under_whole_hosts_every_host_mate_drains_to_the_same_commit_and_none_is_killed() -> None:
    # Found by review: sending a[0] away took a[1] along (draining), then the stop's own loop moved a[1] to
    # exiting and killed it; the survivors' collective failed and they rolled back.
    sim = Sim(4, checkpointing=True, whole_host_slots=2)
    sim.discover({"a": 2, "b": 2})
    slots = ["a[0]", "a[1]", "b[0]", "b[1]"]
    assert_round(sim.join(*slots), 1, needs_sync=True)
    commits_at_pace(sim, slots, 9, 1.0)
    sim.stops.clear()
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is None and sim.stops == []
    assert [sim.job.workers[sim.id(s)].state for s in slots] == [WorkerState.DRAINING] * 4
    orders = {}
    for slot in slots:  # all leave at commit 12; the host of the first to leave checkpoints it, its first writing
        sim.job.rendezvous(sim.id(slot), 1, "update", sim.now, 12, 0, 12)
        orders[slot] = order = sim.reply(slot)
        assert isinstance(order, ExitOrder), (slot, order)
    assert [orders[s].checkpoint_s is not None for s in slots] == [True, True, False, False]
    assert [orders[s].writer for s in slots] == [True, False, False, False]
    sim.job.checkpoint_saved(120, 12)
    for slot in slots:
        sim.exit(slot, ExitStatus(0))
    assert sim.outcome is not None and sim.outcome.reason == (
        "interrupted by SIGINT; checkpoint of step 120 written; the same command resumes from it")
    assert [e for e in sim.events if e[0] == "rollback"] == []


def test_a_signal_before_any_commit_ends_the_job_at_once() -> None:
    # A round trains but has not committed (or never will: a fixed-size script): nothing to keep, no 20 s wait.
    sim = Sim(2, checkpointing=True)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.advance(3)  # heartbeats, no commit
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is not None and (sim.outcome.reason, sim.outcome.exit_code) == SIGINT


@pytest.mark.parametrize("every_s, since_s, why", [
    (60.0, 0.0, "the next commit is expected in 60s (one every 60s)"),
    (1.0, 15.0, "no commit for 15s, against one every 1s before"),
    # Due 14 s after the signal: rank 0 would have 1 s to write before its exit order's margin (5 s), under WRITE_S.
    (15.0, 1.0, "the next commit is expected in 14s (one every 15s)"),
], ids=["once-a-minute", "stalled", "too-late-to-write"])
def test_a_signal_ends_the_job_at_once_when_no_commit_is_expected_in_time_to_checkpoint_it(
        every_s, since_s, why, caplog) -> None:
    sim = training(every_s=every_s)
    sim.advance(since_s)
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is not None and (sim.outcome.reason, sim.outcome.exit_code) == SIGINT
    assert [r.getMessage() for r in caplog.records if "stopping at once" in r.getMessage()] == [
        "job t: interrupted by SIGINT: stopping at once: no commit is expected within 13s, in time to checkpoint it "
        f"({why}); the same command resumes from the latest checkpoint"]


@pytest.mark.parametrize("every_s, since_s", [(15.0, 2.0), (20.0, 8.0), (15.0, 29.0)],
                         ids=["15s-steps", "20s-steps", "a-step-twice-as-slow"])
def test_a_signal_waits_for_a_commit_due_in_time_to_checkpoint_it(every_s, since_s) -> None:
    # Found by review: waiting only for a commit due within half the grace (10 s), a Ctrl-C 2 s after a commit of
    # a job committing every 15 s stopped at once, losing every step since the last periodic checkpoint, although
    # the next commit came 7 s before the grace ran out.
    sim = training(every_s=every_s)
    sim.advance(since_s)
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is None
    waited = max(1.0, every_s - since_s)
    sim.advance(waited)
    orders = leave_at_commit(sim, 10)
    assert orders["a[0]"].checkpoint_s == pytest.approx(GRACE - waited - sim.job.policy.deadline_margin_s)
    assert orders["a[0]"].checkpoint_s >= WRITE_S
    exit_with_the_checkpoint_of(sim, 100, 10)


def test_the_time_to_the_first_commit_is_no_commit_gap_and_a_signal_after_it_waits() -> None:
    # Found by review: the 30 s from the workers' first heartbeat to their first commit (start-up on a GPU) was
    # taken for the time between commits, so a Ctrl-C just after that commit stopped at once. The pace is
    # unknown until two commits were seen: the stop waits, at worst the grace in vain.
    sim = Sim(2, checkpointing=True)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.advance(30)  # heartbeats, no commit yet
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is None
    orders = leave_at_commit(sim, 2)
    assert orders["a[0]"].checkpoint_s is not None and orders["a[0]"].checkpoint_s > 0
    exit_with_the_checkpoint_of(sim, 20, 2)


def test_a_signal_just_after_a_round_formed_after_an_outage_waits() -> None:
    # The 20 s the survivors took to come back after c's crash is no pause of the new round: its pace is unknown
    # until it committed twice, so the stop waits (it stopped at once, the last commit 21 s ago).
    sim = Sim(3, min_np=2, checkpointing=True)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert_round(sim.join("a[0]", "b[0]", "c[0]"), 1, needs_sync=True)
    commits_at_pace(sim, ["a[0]", "b[0]", "c[0]"], 9, 1.0)
    sim.exit("c[0]", CRASH)
    sim.advance(20)  # the survivors' collective times out
    for slot in ("a[0]", "b[0]"):
        sim.job.rendezvous(sim.id(slot), 1, "failure", sim.now, 9, 0, 9)
    assert_round({s: sim.reply(s) for s in ("a[0]", "b[0]")}, 2, needs_sync=True)
    sim.advance(1)
    stop(sim, *SIGINT, grace_s=GRACE)
    assert sim.outcome is None
    sim.advance(1)
    leave_at_commit(sim, 10, round_=2)
    sim.exit("c[0]", ExitStatus(-15))  # its replacement, still starting, was stopped
    exit_with_the_checkpoint_of(sim, 100, 10)


def test_training_that_completes_during_the_stop_succeeds() -> None:
    sim = training()
    stop(sim, *SIGINT, grace_s=GRACE)
    sim.advance(1)
    # The training function returns (its last step) before the next commit's update check: b waits for rank 0.
    assert sim.job.completed(sim.id("b[0]"), sim.now, commit_seq=12, steps=120) == ("wait", "")
    assert sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=12, steps=120) == ("done", "")
    for slot in ("a[0]", "b[0]"):
        sim.exit(slot, ExitStatus(0))
    sim.advance(0.5)
    assert sim.outcome is not None and (sim.outcome.success, sim.outcome.exit_code) == (True, 0), sim.outcome


def test_a_checkpoint_ahead_of_the_heartbeats_is_not_taken_for_the_checkpoint_on_the_way_out() -> None:
    # The periodic checkpoint of commit 13 is reported while the heartbeats still said 9; then no member reaches
    # its next commit in time: commits after 13 may be lost, and the end line must not say the last one is kept.
    sim = training()
    stop(sim, *SIGINT, grace_s=GRACE)
    sim.job.checkpoint_saved(130, 13)
    sim.advance(GRACE + 0.5)
    assert sim.outcome is not None and sim.outcome.exit_code == 130
    assert sim.outcome.reason == (
        "interrupted by SIGINT; 2 worker(s) had not exited in time; the workers stopped before reaching a commit to "
        "checkpoint: the same command resumes from the last checkpoint, of step 130, and redoes any step committed "
        "after it")


def test_holders_waiting_after_host_0_was_lost_are_the_ones_told_to_write_the_checkpoint() -> None:
    # Found by review: host 0 lost, host 1's workers waited at rendezvous (below --min-np) holding commit 12;
    # told to checkpoint on a stop, none wrote (their last round's cross rank was 1): 11 committed steps redone.
    sim = Sim(4, checkpointing=True, whole_host_slots=2)
    sim.discover({"a": 2, "b": 2})
    slots = ["a[0]", "a[1]", "b[0]", "b[1]"]
    assert_round(sim.join(*slots), 1, needs_sync=True)
    sim.commit(*slots, count=12)
    sim.exit("a[0]", ExitStatus(1))
    sim.exit("a[1]", ExitStatus(0))
    for slot in ("b[0]", "b[1]"):
        sim.job.rendezvous(sim.id(slot), 1, "failure", sim.now, 12, 0, 12)
    stop(sim, *SIGINT, grace_s=GRACE)
    orders = [sim.reply(slot) for slot in ("b[0]", "b[1]")]
    assert all(isinstance(o, ExitOrder) and o.checkpoint_s is not None for o in orders), orders
    assert sum(o.writer for o in orders) == 1  # one writer of a replica's checkpoint; both of a sharded one's
