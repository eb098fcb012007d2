"""The driver core's small pieces on their own: the worker state machine, the running clock, the silence watch."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.liveness import EXIT_GRACE_S, RunningClock, SilenceWatch
from cloud_elastic.driver.job.workers import IllegalTransition, WorkerRecord, WorkerState

pytestmark = pytest.mark.timeout(10)
S = WorkerState


def record() -> WorkerRecord:
    return WorkerRecord("w1", Slot("a", 0), seq=1, launched_at=0.0, last_seen=0.0)


# ------------------------------------------------------------ worker state machine
def test_a_worker_lives_through_rounds_and_drains_at_a_commit() -> None:
    w = record()
    for state in (S.CONNECTED, S.WAITING, S.RUNNING, S.WAITING, S.RUNNING):
        w.to(state)
    w.round = 2
    assert w.member_of(2) and not w.member_of(1)
    w.to(S.DRAINING, "host leaving")
    assert w.member_of(2) and w.why == "host leaving"
    w.to(S.EXITING)
    assert w.alive and not w.member_of(2)
    w.to(S.EXITED)
    assert not w.alive


@pytest.mark.parametrize("path", [
    (S.RUNNING,),  # a round member must have registered and waited first
    (S.CONNECTED, S.RUNNING),
    (S.CONNECTED, S.WAITING, S.DRAINING),  # only a member can drain
    (S.CONNECTED, S.WAITING, S.RUNNING, S.DRAINING, S.WAITING),  # a leaver never rejoins
    (S.LOST, S.CONNECTED),  # given up is final but for the exit
    (S.EXITED, S.LOST),
])
def test_a_transition_the_machine_does_not_draw_is_refused(path: tuple[WorkerState, ...]) -> None:
    w = record()
    with pytest.raises(IllegalTransition, match="is not allowed"):
        for state in path:
            w.to(state)


def test_staying_in_a_state_is_not_a_transition_and_keeps_the_reason() -> None:
    w = record()
    w.to(S.CONNECTED)
    w.to(S.EXITING, "told to leave")
    w.to(S.EXITING)
    assert w.state is S.EXITING and w.why == "told to leave"


def test_a_worker_holds_state_once_it_committed_or_synced() -> None:
    w = record()
    assert not w.holds_state and w.label == "not yet ranked"
    w.commit_seq = 7  # synced rank 0's commit, made none of its own yet
    assert w.holds_state
    w.rank = 3
    assert w.label == "rank 3"


# ------------------------------------------------------------------ running clock
def test_running_time_follows_monotonic_time_while_the_driver_runs() -> None:
    clock = RunningClock(max_gap_s=1.0)
    assert [clock(t) for t in (100.0, 100.05, 100.9, 101.8)] == [100.0, 100.05, 100.9, 101.8]
    assert clock.stalled_s == 0.0


def test_a_stall_counts_only_up_to_the_largest_gap_a_running_driver_has() -> None:
    clock = RunningClock(max_gap_s=1.0)
    clock(100.0)
    assert clock(106.0) == pytest.approx(101.0)  # stopped 6 s: 5 s of it were not running time
    assert clock.stalled_s == pytest.approx(5.0)
    assert clock(106.5) == pytest.approx(101.5)  # and it runs on from there


def test_time_that_goes_backwards_never_moves_the_clock_back_or_counts_as_a_stall() -> None:
    clock = RunningClock(max_gap_s=1.0)
    clock(100.0)
    clock(100.5)
    assert clock(100.2) == pytest.approx(100.2)  # a late caller with an older reading
    assert clock(101.2) == pytest.approx(101.2)  # measured from 100.5, not from 100.2: no stall
    assert clock.stalled_s == 0.0


# ------------------------------------------------------------------ silence watch
def worker(seq: int, state: WorkerState, *, launched_at: float = 0.0, last_seen: float = 0.0) -> WorkerRecord:
    w = WorkerRecord(f"w{seq}", Slot("a", seq), seq=seq, launched_at=launched_at, last_seen=last_seen)
    w.state = state
    return w


def test_silent_and_never_registered_workers_are_overdue_with_what_they_did() -> None:
    watch = SilenceWatch(heartbeat_timeout_s=5.0, start_timeout_s=60.0)
    quiet = worker(1, S.RUNNING, last_seen=100.0)
    fresh = worker(2, S.WAITING, last_seen=104.0)
    late = worker(3, S.STARTING, launched_at=30.0)
    done = worker(4, S.COMPLETED, last_seen=50.0)  # exiting after its function returned: never given up
    found = watch.overdue([quiet, fresh, late, done], born=4, now=100.5, running_now=105.5)
    assert [(w.worker_id, what) for w, what in found] == [
        ("w1", "stopped answering heartbeats for 5.5s"), ("w3", "did not reach rendezvous within 60s")]


def test_a_registered_worker_that_never_reaches_rendezvous_is_given_up_at_the_start_timeout() -> None:
    """A worker joining a running job sets up before its first hvd.rank() (worker.context), heartbeating: one
    stuck there must not hold its slot, and the job's place, for good."""
    watch = SilenceWatch(heartbeat_timeout_s=5.0, start_timeout_s=60.0)
    setting_up = worker(1, S.CONNECTED, launched_at=50.0, last_seen=109.0)
    assert watch.overdue([setting_up], born=1, now=109.0, running_now=109.0, round_=1) == []
    assert watch.overdue([setting_up], born=1, now=110.0, running_now=110.0, round_=1) == []  # not due yet
    setting_up.last_seen = 110.5  # it heartbeats all along
    found = watch.overdue([setting_up], born=1, now=110.5, running_now=110.5, round_=1)
    assert [(w.worker_id, what) for w, what in found] == [
        ("w1", "did not reach rendezvous within 60s (its script's set-up before its first hvd.rank(), hvd.size() "
               "or elastic.run)")]


def test_before_the_first_round_a_workers_set_up_is_not_bounded() -> None:
    """With --spares every first worker joins after its set-up (worker.context): the first round waits for it, as
    a first sync would have, however long it takes."""
    watch = SilenceWatch(heartbeat_timeout_s=5.0, start_timeout_s=60.0)
    setting_up = worker(1, S.CONNECTED, launched_at=50.0, last_seen=500.0)
    assert watch.overdue([setting_up], born=1, now=500.0, running_now=500.0, round_=0) == []
    setting_up.last_seen = 506.0  # heartbeating; the next scan is due within a heartbeat timeout at the latest
    assert [w.worker_id for w, _ in watch.overdue([setting_up], born=1, now=506.0, running_now=506.0,
                                                     round_=1)] == ["w1"]  # once a round runs, it is bounded


def test_a_worker_that_said_it_is_exiting_gets_the_exit_grace_not_the_heartbeat_timeout() -> None:
    watch = SilenceWatch(heartbeat_timeout_s=5.0, start_timeout_s=60.0)
    leaving = worker(1, S.RUNNING, last_seen=100.0)
    leaving.exiting_at = 100.0  # past its exit hooks: no more heartbeats, its exit status is on the way
    assert watch.overdue([leaving], born=1, now=130.0, running_now=130.0) == []  # a slow teardown, not silence
    found = watch.overdue([leaving], born=1, now=100.0 + EXIT_GRACE_S + 1, running_now=100.0 + EXIT_GRACE_S + 1)
    assert [(w.worker_id, what) for w, what in found] == [
        ("w1", f"has been exiting for {EXIT_GRACE_S + 1:.1f}s and its process has not ended")]


def test_the_scan_is_skipped_until_someone_can_be_overdue_or_a_worker_is_born() -> None:
    watch = SilenceWatch(heartbeat_timeout_s=5.0, start_timeout_s=60.0)
    a = worker(1, S.RUNNING, last_seen=100.0)
    assert watch.overdue([a], born=1, now=100.0, running_now=100.0) == []
    b = worker(2, S.RUNNING, last_seen=90.0)  # already silent, but it is not there for the watch yet
    assert watch.overdue([a, b], born=1, now=104.0, running_now=104.0) == []  # skipped: nobody new, nobody due
    assert [w.worker_id for w, _ in watch.overdue([a, b], born=2, now=104.0, running_now=104.0)] == ["w2"]
    assert [w.worker_id for w, _ in watch.overdue([a], born=2, now=105.5, running_now=105.5)] == ["w1"]
