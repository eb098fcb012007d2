"""Spares next to the last holders of the state, and spares on doubtful hosts (cloud_elastic.driver.job.spares).

When every member's host gets a notice (``-np 1``, one multi-GPU host under
``--whole-hosts``), the members are the last holders of the training state: they
train on (see test_job_last_holders.py). A waiting spare must then join next to
them, receive the state, and take over when they leave at the following commit.
Found by review: the spare waited as if the round were full, and the round that
formed when the holders drained was the spare alone, "training state lost" (or a
rollback to the last checkpoint) while the holders still trained.

A spare on a host with a soft notice (or missing from discovery) is the last to
be taken, is not counted ready, and a healthy spare starts in its place.
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, WorkerState
from cloud_elastic.driver.job.leaving import FIRST_COMMIT_HOLD_S, HOLD_MARGINS
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, KILLED, T0, Sim, assert_round

pytestmark = pytest.mark.timeout(30)  # the first test of a run may import torch (conftest), on a loaded machine


def state(sim: Sim, slot: str) -> WorkerState:
    return sim.job.workers[sim.id(slot)].state


def formed(sim: Sim) -> list[dict]:
    return [f for kind, f in sim.events if kind == "round_formed"]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_member_on_a_noticed_host_hands_the_state_to_the_spare_then_leaves(checkpointing: bool) -> None:
    sim = Sim(1, spares=1, min_np=1, checkpointing=checkpointing)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    assert sim.join("b[0]") == {"b[0]": None}  # the spare waits
    sim.commit("a[0]")
    sim.advance(1)
    sim.discover({"b": 1}, {"a": Drain(T0 + 120, "spot interruption")})
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING  # the last holder trains on
    assert sim.poll("a[0]").update_gen == 1  # and is asked to stop at its next commit, for the spare
    replies = sim.join("a[0]", reason="update")
    assert_round({**replies, "b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "b[0]"]  # a is rank 0: b receives the state from it
    assert (formed(sim)[-1]["from_checkpoint"], formed(sim)[-1]["spares_taken"]) == (False, 1)
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING  # until b is known to hold the state
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.DRAINING
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["b[0]"], Assignment)
    assert sim.layout() == ["b[0]"] and sim.job.round == 3 and not formed(sim)[-1]["from_checkpoint"]
    assert sim.outcome is None and not [kind for kind, _ in sim.events if kind == "rollback"]


def test_one_whole_host_on_notice_hands_the_state_to_the_spare_host() -> None:
    sim = Sim(2, spares=1, min_np=2, whole_host_slots=2)
    sim.discover({"a": 2, "b": 2})
    assert_round(sim.join("a[0]", "a[1]"), 1, needs_sync=True)
    sim.join("b[0]", "b[1]")
    sim.commit("a[0]", "a[1]")
    sim.advance(1)
    sim.discover({"b": 2}, {"a": Drain(sim.now + 30, "GCE preemption")})
    sim.advance(0.5)
    assert sim.poll("a[0]").update_gen == 1
    replies = sim.join("a[0]", "a[1]", reason="update")
    assert_round({**replies, "b[0]": sim.reply("b[0]"), "b[1]": sim.reply("b[1]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]", "b[0]", "b[1]"]
    sim.commit("a[0]", "a[1]", "b[0]", "b[1]")
    sim.advance(0.5)
    replies = sim.join("a[0]", "a[1]", "b[0]", "b[1]", reason="update")
    assert [type(replies[s]) for s in ("a[0]", "a[1]")] == [ExitOrder, ExitOrder]
    assert sim.layout() == ["b[0]", "b[1]"] and sim.outcome is None


def test_a_spare_on_a_host_with_a_soft_notice_goes_last_is_not_ready_and_a_healthy_one_starts() -> None:
    sim = Sim(2, spares=2, min_np=1)
    sim.discover({"a": 1, "b": 1, "c": 1, "d": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.join("c[0]")
    sim.advance(1)
    sim.join("d[0]")  # c has waited longest: it would go first
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    sim.job.notice("c", Drain(None, "EC2 rebalance recommendation"), sim.now, source="aws", soft=True)
    sim.advance(1)
    assert state(sim, "c[0]") is WorkerState.WAITING  # a soft notice sends no one away
    assert sim.job.rounds.spare_ids == (sim.id("d[0]"),)
    assert [f["ready"] for kind, f in sim.events if kind == "spares"][-1] == 1
    sim.discover({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1})
    assert sim.slots_launched()[-1] == "e[0]"  # in c's place, on a healthy host
    sim.exit("b[0]", KILLED)
    replies = sim.join("a[0]", reason="failure")
    assert_round({**replies, "d[0]": sim.reply("d[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "d[0]"] and sim.reply("c[0]") is None


def test_a_spare_on_a_soft_noticed_host_leaves_once_its_healthy_replacement_is_ready() -> None:
    # Found by review: it kept waiting after its replacement was ready (one paid instance for nothing), and
    # stayed one spare too many if the notice lapsed.
    sim = Sim(2, spares=1, min_np=1)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.join("c[0]")
    sim.job.notice("c", Drain(None, "EC2 rebalance recommendation"), sim.now, source="aws", soft=True)
    sim.advance(1)
    assert state(sim, "c[0]") is WorkerState.WAITING  # the only spare there is: it stays for now
    sim.discover({"a": 1, "b": 1, "c": 1, "d": 1})
    assert sim.slots_launched()[-1] == "d[0]"
    sim.join("d[0]")
    sim.advance(1)
    assert isinstance(sim.reply("c[0]"), ExitOrder)  # sent away, not blamed
    sim.exit("c[0]", CLEAN)
    assert not sim.blocked("c[0]") and sim.job.rounds.spare_ids == (sim.id("d[0]"),)
    assert sim.poll("a[0]").update_gen == 0 and len(sim.launched) == 4  # the round went on; nothing relaunched


def test_a_spare_whose_host_misses_one_discovery_answer_is_kept_and_the_newest_leaves_when_it_is_back() -> None:
    # Found by review (h4, 2026-12-01): a host missing from one answer is kept for --host-missing-grace, but its
    # spare was sent away as soon as its replacement was ready: every glitch of a listing API cost a worker start.
    sim = Sim(2, spares=1, min_np=1, missing_grace=10.0)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.join("c[0]")
    assert sim.job.rounds.spare_ids == (sim.id("c[0]"),)
    sim.discover({"a": 1, "b": 1, "d": 1})  # c left out of one answer
    assert sim.slots_launched()[-1] == "d[0]"  # a replacement on a host that is there, in case c is gone
    sim.join("d[0]")
    sim.advance(1)
    assert state(sim, "c[0]") is WorkerState.WAITING and sim.reply("c[0]") is None  # kept within the grace
    assert sim.job.rounds.spare_ids == (sim.id("d[0]"),)
    sim.discover({"a": 1, "b": 1, "c": 1, "d": 1})  # back
    sim.advance(1)
    assert isinstance(sim.reply("d[0]"), ExitOrder)  # the newest spare is the one beyond --spares
    assert sim.reply("c[0]") is None and sim.job.rounds.spare_ids == (sim.id("c[0]"),)


# Found by review: a notice before the driver heard of any commit (the first not made yet, or its heartbeat still on
# the way) sent the member away at once; the spare formed a round of its own from step 0 beside it, the member's
# work was thrown away at the commit it left at, and the driver logged "0 steps lost".
def noticed_before_any_commit(deadline: float) -> Sim:
    """``-np 1 --spares 1``: round 1 on a, the spare waiting on b, then a notice for a (``deadline``) before any
    commit is heard of."""
    sim = Sim(1, spares=1, min_np=1)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    assert sim.join("b[0]") == {"b[0]": None}
    sim.discover({"b": 1}, {"a": Drain(deadline, "spot interruption")})
    return sim


@pytest.mark.parametrize("heard", [False, True], ids=["commit-not-heard", "commit-heard-on-the-way"])
def test_a_notice_before_any_commit_is_heard_keeps_the_member_training_until_the_spare_joins_next_to_it(
        heard: bool, caplog) -> None:
    caplog.set_level(logging.INFO, "cloud_elastic")
    sim = noticed_before_any_commit(T0 + 120)
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.reply("b[0]") is None  # no round of the spare alone
    assert sim.poll("a[0]").update_gen == 1  # a stops at its next commit, for the spare
    if heard:
        sim.commit("a[0]")
    else:  # its first commit reaches the driver only with its rendezvous
        sim.commits[sim.id("a[0]")] = 1
    replies = sim.join("a[0]", reason="update")
    assert_round({**replies, "b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "b[0]"] and formed(sim)[-1]["step"] is not None  # b receives a's commit
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["b[0]"], Assignment)
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.layout() == ["b[0]"] and sim.job.round == 3 and sim.outcome is None
    assert [r.getMessage() for r in caplog.records if "0 steps lost" in r.getMessage()]


def test_a_new_host_gets_a_replacement_next_to_a_member_noticed_before_any_commit() -> None:
    sim = Sim(1, min_np=1)
    sim.discover({"a": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    sim.discover({"b": 1}, {"a": Drain(T0 + 120, "spot interruption")})
    assert sim.slots_launched()[-1] == "b[0]"
    sim.join("b[0]")
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.reply("b[0]") is None
    sim.commit("a[0]")
    assert_round(sim.join("a[0]", reason="update"), 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "b[0]"]


# Found by review of the fix above: the hold was unbounded before the first commit. A member noticed too close to
# its deadline took its first commit with it ("training state lost"), one that never commits kept the spare idle
# until it was removed by force (for good under a drain without a deadline), and a recovery round after a kill -9
# waited for it. It is held only while its deadline leaves room (FIRST_COMMIT_HOLD_S without one), not after a loss
# aborted its round; past that, the spare starts over from step 0 at once and the member stops, not training on.
def started_over_without(sim: Sim, slot: str, caplog) -> None:
    """The spare b formed a round from step 0 alone, ``slot`` (on a leaving host) was stopped, and the log says so."""
    assert_round({"b[0]": sim.reply("b[0]")}, sim.job.round, needs_sync=True)
    assert sim.layout() == ["b[0]"] and formed(sim)[-1]["step"] is None
    assert state(sim, slot) is WorkerState.EXITING and [s.worker_id for s in sim.stops] == [sim.id(slot)]
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if "no commit was heard of" in m and "starts over from the initial weights" in m]
    assert not [m for m in said if f"host {slot[0]} " in m and "0 steps lost" in m]


def test_a_member_noticed_too_close_to_its_deadline_before_any_commit_stops_and_the_spare_starts_over(
        caplog) -> None:
    caplog.set_level(logging.INFO, "cloud_elastic")
    sim = noticed_before_any_commit(T0 + 8)  # within the hold's margins: no room for a commit and leaving
    sim.advance(1)
    started_over_without(sim, "a[0]", caplog)
    sim.commit("a[0]")  # a commit it made meanwhile is not the new round's: it is told to exit
    assert isinstance(sim.join("a[0]", reason="update")["a[0]"], ExitOrder)
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is None and sim.layout() == ["b[0]"] and sim.released
    said = [r.getMessage() for r in caplog.records if "host a drained" in r.getMessage()]
    assert len(said) == 1 and "stopped before any commit was heard of" in said[0], said


@pytest.mark.parametrize("deadline", [30.0, None], ids=["deadline", "no-deadline"])
def test_a_noticed_member_that_never_commits_is_held_for_a_bounded_time_then_the_spare_starts_over(
        deadline: float | None, caplog) -> None:
    caplog.set_level(logging.INFO, "cloud_elastic")
    sim = noticed_before_any_commit(None if deadline is None else T0 + deadline)
    held = FIRST_COMMIT_HOLD_S if deadline is None else deadline - HOLD_MARGINS * sim.job.policy.deadline_margin_s
    sim.advance(held - 1)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.reply("b[0]") is None  # held for its first commit
    said = [r.getMessage() for r in caplog.records if "every holder of the state is on a draining host (a)" in
            r.getMessage()]
    assert len(said) == 1 and said[0].count("before their host's deadline" if deadline else
                                            "before a deadline, where one is set") == 1, said
    sim.advance(1.5)
    started_over_without(sim, "a[0]", caplog)  # at once, not once it is removed by force (or never)
    assert not sim.stops[0].immediate and sim.outcome is None


def test_a_member_drained_without_a_deadline_before_any_commit_trains_on_past_the_bound_with_no_one_waiting() -> None:
    sim = Sim(1, min_np=1)
    sim.discover({"a": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    sim.discover({}, {"a": Drain(None, "drained by hand")})
    sim.advance(FIRST_COMMIT_HOLD_S + 30)
    assert state(sim, "a[0]") is WorkerState.RUNNING and not sim.stops  # sent away, it would take the state along
    sim.commit("a[0]")
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.outcome is None


@pytest.mark.parametrize("both", [False, True], ids=["c-stays", "c-noticed-too"])
def test_a_kill_beside_a_member_noticed_before_any_commit_does_not_wait_for_it(both: bool, caplog) -> None:
    caplog.set_level(logging.INFO, "cloud_elastic")
    sim = Sim(2, spares=1, min_np=1)
    sim.discover({"a": 1, "c": 1, "b": 1})
    sim.join("a[0]", "c[0]")
    sim.join("b[0]")
    notice = Drain(T0 + 120, "spot interruption")
    sim.discover({"b": 1} if both else {"b": 1, "c": 1}, {"a": notice, **({"c": notice} if both else {})})
    sim.advance(1)
    # c stays: a is not held; both noticed: both are held, until a loss aborts their round.
    assert state(sim, "a[0]") is (WorkerState.RUNNING if both else WorkerState.DRAINING)
    sim.exit("c[0]", KILLED)
    sim.advance(0.5)
    started_over_without(sim, "a[0]", caplog)  # the recovery round takes the spare, a does not train on


def test_a_fixed_size_script_noticed_before_it_ends_still_ends_normally() -> None:
    # It never commits: its member trains on as a prospective holder and the spare never starts over beside it.
    sim = noticed_before_any_commit(T0 + 120)
    sim.advance(5)
    assert sim.job.completed(sim.id("a[0]"), sim.now, steps=20, elastic=False) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success and sim.job.round == 1


def test_a_commit_the_stopped_member_reports_late_is_not_the_jobs_committed_state() -> None:
    """Review of d09da06: the member stopped when its spare started over from step 0 reported, in a heartbeat
    after the stop, the commit it had just made; the driver took the job for committed, and when the step-0
    round's member then died before its own first commit, the job ended "training state lost" with a spare
    waiting (with --checkpoint-dir, the next round was told to load a checkpoint never written)."""
    sim = Sim(1, spares=2, min_np=1)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    sim.join("b[0]")
    sim.join("c[0]")
    sim.discover({"b": 1, "c": 1}, {"a": Drain(T0 + 8, "spot interruption")})  # too close to hold for a commit
    sim.advance(1)
    assert sim.job.round == 2 and sim.job.workers[sim.id("a[0]")].state is WorkerState.EXITING
    sim.commit("a[0]")  # its heartbeat of a commit made just before the stop
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert not sim.job.state_committed
    member = sim.layout()[0]
    sim.exit(member, KILLED)  # the step-0 round's member dies before its own first commit
    sim.advance(3)
    assert sim.outcome is None and sim.job.round == 3 and len(sim.layout()) == 1 and member not in sim.layout()


def test_the_stopped_former_rank_0_feeds_neither_the_step_rate_nor_the_step_metric() -> None:
    """Review of b4aab3e: its late poll, as rank 0 still, put a step of a history no round continues into the
    job's steps/s and the step metric."""
    from types import SimpleNamespace

    from cloud_elastic.config import JobConfig
    from cloud_elastic.driver.runtime.condition import JobCondition
    from cloud_elastic.driver.runtime.control_plane import ControlPlane

    sim = Sim(1, spares=2, min_np=1)
    sim.discover({"a": 1, "b": 1, "c": 1})
    sim.join("a[0]")
    sim.join("b[0]")
    sim.join("c[0]")
    sim.discover({"b": 1, "c": 1}, {"a": Drain(T0 + 8, "spot interruption")})
    sim.advance(1)
    a = sim.job.workers[sim.id("a[0]")]
    assert sim.job.round == 2 and a.discarded
    steps: list[int] = []
    cond = JobCondition()
    cond.watch(sim.job)
    plane = ControlPlane(sim.job, cond, JobConfig(command=("x",), num_proc=1, min_np=1, max_np=3),
                         sinks=SimpleNamespace(sink=SimpleNamespace(emit=lambda *a, **k: None),
                                               metrics=SimpleNamespace(observe_progress=lambda *a: steps.append(a))),
                         clock=lambda: T0, stop=lambda *a: None, record_events=lambda: None, watch_cloud=None)
    plane.handle("poll", {"worker": a.worker_id, "round": 1, "update_gen": 0, "abort_round": 0, "commits": 5,
                          "commit_seq": 5})
    assert steps == [] and not plane.rate._samples


def test_on_a_fixed_list_a_hand_drain_of_the_only_member_waits_for_the_spare_still_setting_up() -> None:
    """Review h24: `-np 1 --spares 1 -H a:1,b:1`, the spare still in its set-up after hvd.init() (8 s in the repro),
    `cloud-elastic drain JOB a`: the member was sent away at once, as if nobody could ever take the state over (the
    spare's slot was counted as occupied, not as a successor), and the job failed "training state lost"."""
    sim = Sim(1, spares=1, min_np=1, hosts_fixed=True)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    assert state(sim, "b[0]") is WorkerState.STARTING  # the spare has not reached rendezvous yet
    sim.commit("a[0]")
    sim.advance(1)
    done, _ = sim.job.drain("a", None, sim.now)
    assert done
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.outcome is None  # the last holder trains on
    sim.advance(8)  # the spare's set-up
    sim.join("b[0]")  # it arrives at rendezvous: it joins next to the holder
    replies = sim.join("a[0]", reason="update")
    assert_round({**replies, "b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "b[0]"]  # b receives the state from a
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.DRAINING
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["b[0]"], Assignment)
    assert sim.layout() == ["b[0]"] and sim.outcome is None


def test_a_holder_drained_right_after_a_spare_took_its_place_leaves_without_a_false_state_lost(caplog) -> None:
    """Review h24: `-np 2 --spares 1` on three fixed hosts; a's host drained (the spare c takes its place), then b's
    right after that round formed, before c's first commit was heard of: b was marked a last holder for good, wrote
    an exit checkpoint, and its release said "holding the last copy of the training state: the training state is
    lost" while c held that very commit and the job went on from it."""
    sim = Sim(2, spares=1, min_np=1, hosts_fixed=True)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    assert sim.join("c[0]") == {"c[0]": None}  # the spare waits
    sim.commit("a[0]", "b[0]")
    sim.advance(1)
    assert sim.job.drain("a", None, sim.now)[0]
    sim.advance(1)
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder)
    assert_round({"b[0]": replies["b[0]"], "c[0]": sim.reply("c[0]")}, 2, needs_sync=True)
    sim.exit("a[0]", CLEAN)
    assert sim.job.drain("b", None, sim.now)[0]  # before c's first commit is heard of
    sim.advance(1)
    sim.commit("b[0]", "c[0]")  # the commit b leaves at: c holds it too
    sim.advance(1)
    with caplog.at_level(logging.INFO, logger="cloud_elastic"):
        replies = sim.join("b[0]", "c[0]", reason="update")
        assert isinstance(replies["b[0]"], ExitOrder) and isinstance(replies["c[0]"], Assignment)
        sim.exit("b[0]", CLEAN)
        sim.advance(1)
    assert sim.layout() == ["c[0]"] and sim.outcome is None
    assert "the training state is lost" not in caplog.text, caplog.text
    assert f"host b drained (drained by hand" in caplog.text and "its workers left at a commit" in caplog.text
    assert not sim.job.leavers.checkpoint_s  # no exit checkpoint asked of b
