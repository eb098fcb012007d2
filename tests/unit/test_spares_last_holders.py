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

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, WorkerState
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, KILLED, T0, Sim, assert_round

pytestmark = pytest.mark.timeout(10)


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
