"""The repeat guards and Horovod's loop: a relaunch that redoes one commit and fails again is no progress.

Horovod's elastic loop (``for state.batch in range(state.batch, ...): ...; state.commit()``) redoes the committed
batch after each restore and commits it again before a deterministic bug recurs: each relaunch adds one commit,
so the job's commit never repeats, and the guards keyed on it (a slot's failures, every worker lost, a stall,
a hang) let the job retrain the same batch for ever (the review s60 rvS finding 1: 58 identical failures in
150 s). The rule (repeats.Mark.repeats): the same commit, or a round that restored the commit the previous
failing round restored or the next one and made at most one commit. A job that gets two commits further
between failures progresses and is never stopped.
"""

from __future__ import annotations

import random

import pytest

from cloud_elastic.driver.job.hosts import Blacklist, Slot
from cloud_elastic.driver.job.repeats import REPEATS, Hangs, Mark
from cloud_elastic.protocol import FlightEntry
from tests.unit.job_view import T0
from tests.unit.test_job import Sim, failed, started
from tests.unit.test_job_repeats import BUG, at_commit, crash, stalls

pytestmark = pytest.mark.timeout(30)

ALLREDUCE = FlightEntry(1, 9, "allreduce", "entered", 0.0)  # both ranks wait in it: it cannot complete


# ------------------------------------------------------------------ the rule
@pytest.mark.parametrize("before, after, repeats", [
    (Mark(6, 5), Mark(6, 5), True),     # the same commit
    (Mark(9, 6), Mark(9, 6), True),     # resumed from the checkpoint, trained up to the bug again
    (Mark(4, 3), Mark(5, 4), True),     # Horovod's loop: restored the next commit, redid one
    (Mark(4, 3), Mark(4, 4), True),     # restored the next commit, failed before its first
    (Mark(4, 3), Mark(3, 3), True),     # restored the same commit, no commit of its own
    (Mark(4, 3), Mark(6, 4), False),    # made two commits of its own
    (Mark(4, 3), Mark(6, 5), False),    # restored two commits further: the round before kept two
    (Mark(9, 3), Mark(12, 9), False),   # fails every 3 commits: progress
    (Mark(4, 3), Mark(3, 2), False),    # resumed from an older checkpoint: not where it failed before
    (Mark(4), Mark(5, 4), False),       # where the round before started is unknown: only the same commit counts
])
def test_a_failure_repeats_the_one_before_when_it_got_no_further_than_one_redone_commit(before, after, repeats):
    assert after.repeats(before) is repeats


# ------------------------------------------------------------------ a slot's failures
def test_a_slot_failing_each_relaunch_one_commit_further_is_blacklisted_for_good_at_the_third() -> None:
    blacklist = Blacklist((1.0, 2.0), random.Random(0))
    a = Slot("a", 0)
    assert blacklist.record_failure(a, T0, at_commit=Mark(3, 0)) < 3  # round 1 trained 3 commits first
    assert blacklist.record_failure(a, T0, at_commit=Mark(4, 3)) < 3
    assert blacklist.record_failure(a, T0, at_commit=Mark(5, 4)) < 3
    assert blacklist.record_failure(a, T0, at_commit=Mark(6, 5)) == float("inf")


def horovod_loop(sim: Sim, commit: int, per_round: int) -> None:
    """Round after round on a[0] and b[0]: from ``commit`` (what a[0] restored), both commit ``per_round`` times,
    then the script on b[0] raises the same error; a[0] rolls back to its last commit and a new worker on b[0]
    joins it once the slot cooled down. Stops once the job has ended."""
    at_commit(sim, "a[0]", commit + per_round)
    at_commit(sim, "b[0]", commit + per_round)
    crash(sim, "b[0]")
    sim.join("a[0]", reason="failure")
    sim.advance(3)
    if sim.outcome is None and not sim.job.hosts.blacklist.for_good(Slot("b", 0)):
        sim.join("b[0]")
        assert sim.layout() == ["a[0]", "b[0]"]


def test_a_rank_that_raises_at_the_same_batch_of_horovods_loop_ends_the_job_after_three_repeats() -> None:
    """The reviewer's repeat_failure.sh: each relaunch redoes the restored batch (one commit), and rank 1 raises
    again; it went on for ever (58 failures in 150 s)."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=5)
    horovod_loop(sim, 0, 3)  # round 1 trains 3 batches, then the bug
    for n in range(REPEATS):
        assert sim.outcome is None
        horovod_loop(sim, 3 + n, 1)
    sim.advance(10)
    assert sim.slots_launched().count("b[0]") == REPEATS + 1  # never a fifth
    failed(sim, "fewer than --min-np 2", f"exited with code 1: {BUG}",
           f"slot b[0] is blacklisted for the rest of the job: it failed {REPEATS} times in a row at commit 6")


@pytest.mark.parametrize("per_round", [2, 3, 1000])
def test_a_job_that_fails_the_same_way_every_few_commits_progresses_and_is_never_stopped(per_round) -> None:
    """A slow leak that kills rank 1 every ``per_round`` commits: each relaunch gets further; the slot only cools
    down, however many times it fails."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    for n in range(3 * REPEATS):
        horovod_loop(sim, n * per_round, per_round)
    assert sim.outcome is None and sim.job.hosts.blacklist.for_good_slots() == []
    assert sim.slots_launched().count("b[0]") == 3 * REPEATS + 1


def test_a_job_that_fails_once_then_trains_on_is_not_stopped() -> None:
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), elastic_timeout_s=60)
    horovod_loop(sim, 0, 3)
    for commit in range(4, 40):
        at_commit(sim, "a[0]", commit)
        at_commit(sim, "b[0]", commit)
        sim.advance(1)
    assert sim.outcome is None and sim.layout() == ["a[0]", "b[0]"]


# ------------------------------------------------------------------ every worker lost
def test_every_worker_failing_each_resume_one_commit_past_its_checkpoint_ends_the_resume_loop() -> None:
    """With --checkpoint-dir and a checkpoint at every commit: each attempt resumes from the checkpoint of the commit
    the one before redid, redoes that batch, checkpoints it, and every rank fails again."""
    sim = started(2, {"a": 1, "b": 1}, cooldown=(1.0, 2.0), checkpointing=True, elastic_timeout_s=60)
    at_commit(sim, "a[0]", 6)
    at_commit(sim, "b[0]", 6)
    crash(sim, "a[0]")
    crash(sim, "b[0]")
    for n in range(REPEATS):
        assert sim.outcome is None
        sim.advance(3)
        sim.join("a[0]", "b[0]")
        sim.job.checkpoint_loaded(6 + n, 6 + n, f"/ck/step{6 + n}")
        at_commit(sim, "a[0]", 7 + n)
        at_commit(sim, "b[0]", 7 + n)
        crash(sim, "a[0]")
        crash(sim, "b[0]")
    failed(sim, "every worker failed, ", "in a row at commit 9", "without getting further", BUG)


# ------------------------------------------------------------------ a stall loop
def test_a_collective_only_some_ranks_run_in_horovods_loop_ends_the_job_after_three_stalls() -> None:
    """The reviewer's repeat_stall.sh: each re-formed round redoes one batch, then stalls in the same place."""
    job = stalls([ALLREDUCE, ALLREDUCE], REPEATS, per_round=1)
    assert job.outcome is not None and not job.outcome.success and job.outcome.exit_code == 1
    assert f"stalled {REPEATS} times in a row at commit 9 with the same 2 worker(s)" in job.outcome.reason


def test_rounds_that_stall_after_getting_two_commits_further_each_time_never_end_the_job() -> None:
    job = stalls([ALLREDUCE, ALLREDUCE], 3 * REPEATS, per_round=2)
    assert job.outcome is None and job.aborts == 3 * REPEATS


# ------------------------------------------------------------------ a hang loop
def test_hangs_each_one_commit_further_count_in_a_row_and_two_further_start_again() -> None:
    """The reviewer's repeat_hang.sh: rank 1 deadlocks at the same batch of each relaunch (one redone commit)."""
    hangs = Hangs()
    assert hangs.given_up(Mark(3, 0), frozenset({("round", 1)}), "b#2", "b", "b[0]") == 1
    assert hangs.given_up(Mark(4, 3), frozenset({("round", 2)}), "b#3", "b", "b[0]") == 1  # round 1 trained 3
    assert hangs.given_up(Mark(5, 4), frozenset({("round", 3)}), "b#4", "b", "b[0]") == 2
    assert hangs.given_up(Mark(5, 4), frozenset({("round", 3)}), "b#4", "b", "b[0]") == 0  # the same round again
    assert hangs.given_up(Mark(6, 5), frozenset({("round", 4)}), "b#5", "b", "b[0]") == 3
    assert hangs.given_up(Mark(8, 6), frozenset({("round", 5)}), "b#6", "b", "b[0]") == 1  # two commits further
    assert "given up 3 times in a row at commit 6" in Hangs().line("b[0] (rank 1)", 6, 3, "deadlock")
