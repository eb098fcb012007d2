"""A worker that cannot restore its last commit exactly (an in-place update's window, ``worker.window``)
never gives the state to the others."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment
from cloud_elastic.protocol import ControlPlaneError, RendezvousRequest
from tests.unit.test_job import KILLED, Sim, failed

pytestmark = pytest.mark.timeout(10)


def _arrive(sim: Sim, slot: str, seq: int, holds_commit: bool) -> None:
    w = sim.job.workers[sim.id(slot)]
    sim.job.rendezvous(sim.id(slot), w.round, "failure", sim.now, seq, 0, seq, holds_commit)
    sim._collect()


def _three_committed(**policy) -> Sim:
    sim = Sim(3, min_np=1, cooldown=(1000, 1000), **policy)
    sim.start({"a": 1, "b": 1, "c": 1})
    for slot in ("a[0]", "b[0]", "c[0]"):
        sim.job.heartbeat(sim.id(slot), sim.now, 5, 5)
    return sim


def test_the_newest_commit_is_not_taken_from_a_worker_that_lost_it() -> None:
    sim = _three_committed()
    sim.exit("c[0]", KILLED)
    _arrive(sim, "a[0]", 6, holds_commit=False)  # rank 0 updated in place, then its collective failed
    _arrive(sim, "b[0]", 5, holds_commit=True)
    replies = {slot: sim.reply(slot) for slot in ("a[0]", "b[0]")}
    assert all(isinstance(r, Assignment) and r.needs_sync and not r.from_checkpoint for r in replies.values())
    assert sim.layout() == ["b[0]", "a[0]"]  # b broadcasts its commit 5 to a


def test_when_no_survivor_holds_its_commit_the_job_resumes_from_the_checkpoint() -> None:
    sim = _three_committed(checkpointing=True)
    sim.exit("c[0]", KILLED)
    _arrive(sim, "a[0]", 6, holds_commit=False)
    _arrive(sim, "b[0]", 6, holds_commit=False)
    assert all(isinstance(sim.reply(s), Assignment) and sim.reply(s).from_checkpoint for s in ("a[0]", "b[0]"))


def test_when_no_survivor_holds_its_commit_and_there_is_no_checkpoint_the_job_stops_saying_why() -> None:
    sim = _three_committed()
    sim.exit("c[0]", KILLED)
    _arrive(sim, "a[0]", 6, holds_commit=False)
    _arrive(sim, "b[0]", 6, holds_commit=False)
    # Either cause the survivors may have logged: an in-place update cut short, or a newcomer still following.
    failed(sim, "training state lost", "could restore the last commit exactly", "CLOUD_ELASTIC_COMMIT_MODE=snapshot",
           "still receiving the commit in a follow window", "CLOUD_ELASTIC_FOLLOW=0")


def test_a_worker_that_synced_since_holds_the_state_again() -> None:
    sim = _three_committed()
    sim.exit("c[0]", KILLED)
    _arrive(sim, "a[0]", 6, holds_commit=False)
    _arrive(sim, "b[0]", 5, holds_commit=True)
    sim.exit("b[0]", KILLED)  # after the sync: a holds b's commit now, and says so at its next rendezvous
    _arrive(sim, "a[0]", 5, holds_commit=True)
    assert isinstance(sim.reply("a[0]"), Assignment) and not sim.reply("a[0]").from_checkpoint
    assert sim.outcome is None


def test_the_flag_is_checked_on_the_wire() -> None:
    wire = RendezvousRequest(3, "failure", 2, 1, 2, holds_commit=False).to_wire()
    assert RendezvousRequest.from_wire(wire).holds_commit is False
    del wire["holds_commit"]  # a worker of an older version
    assert RendezvousRequest.from_wire(wire).holds_commit is True
    with pytest.raises(ControlPlaneError, match="holds_commit"):
        RendezvousRequest.from_wire({**wire, "holds_commit": "no"})


def test_rank_0_is_chosen_by_the_commits_the_survivors_hold_now_not_by_a_higher_one_heard_before() -> None:
    # b's heartbeats once said commit 7; a sync to an older rank 0 then lowered it (``ledger.hold_commit``).
    # At rendezvous each survivor says what it would restore now: a holds 6, b 5. The newest is a's.
    sim = _three_committed()
    sim.job.heartbeat(sim.id("b[0]"), sim.now, 7, 7)
    sim.exit("c[0]", KILLED)
    _arrive(sim, "a[0]", 6, holds_commit=True)
    _arrive(sim, "b[0]", 5, holds_commit=True)
    assert all(isinstance(sim.reply(s), Assignment) for s in ("a[0]", "b[0]"))
    assert sim.layout() == ["a[0]", "b[0]"]  # a broadcasts its commit 6 to b; b's 7 is no longer there



def test_a_held_poll_sent_before_a_sync_lowered_a_commit_does_not_raise_it_again_at_rendezvous() -> None:
    # The control plane re-checks a held heartbeat at its deadline or when woken: the commit it carries was read
    # before the worker's sync lowered it. Once the worker waits at rendezvous, its request's value stands.
    sim = _three_committed()
    sim.job.heartbeat(sim.id("b[0]"), sim.now, 7, 7)
    sim.exit("c[0]", KILLED)
    _arrive(sim, "b[0]", 5, holds_commit=True)
    sim.job.heartbeat(sim.id("b[0]"), sim.now, 7, 7)  # the held poll, checked again
    _arrive(sim, "a[0]", 6, holds_commit=True)
    assert sim.layout() == ["a[0]", "b[0]"]
