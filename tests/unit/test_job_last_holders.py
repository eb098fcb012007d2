"""A notice for every host at once (a zone-wide reclaim, a one-host job on a disrupted node): the members are
the last holders of the training state, so they train on and leave only once a new worker holds it, or close
to their hosts' deadline. Sent away at once (as before, found by review), they took the state with them: the
job ended "training state lost" at the next commit, with 100 s of the notice and the elastic timeout left."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import ExitOrder, WorkerState
from cloud_elastic.driver.job.leaving import HOLD_MARGINS
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import T0, assert_round, started

pytestmark = pytest.mark.timeout(10)


def state(sim, slot: str) -> WorkerState:
    return sim.job.workers[sim.id(slot)].state


def test_the_last_holders_train_on_until_close_to_the_deadline_then_leave_at_a_commit() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, max_np=2)
    sim.commit("a[0]", "b[0]")
    sim.discover({}, {"a": Drain(T0 + 100, "spot"), "b": Drain(T0 + 100, "spot")})
    sim.advance(1)
    assert {state(sim, "a[0]"), state(sim, "b[0]")} == {WorkerState.RUNNING} and sim.outcome is None
    assert sim.poll("a[0]").update_gen == 0  # nothing asks them to stop
    margin = sim.job.policy.deadline_margin_s
    sim.advance(100 - HOLD_MARGINS * margin - 1 - sim.now + T0)  # just before the hold ends
    assert state(sim, "a[0]") is WorkerState.RUNNING
    sim.advance(2)
    assert {state(sim, "a[0]"), state(sim, "b[0]")} == {WorkerState.DRAINING}  # they leave at their next commit
    assert sim.poll("a[0]").update_gen == 1


def test_a_new_worker_takes_the_state_from_the_last_holders_then_they_leave() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, max_np=3)
    sim.commit("a[0]", "b[0]")
    sim.discover({"c": 1}, {"a": Drain(T0 + 300, "spot"), "b": Drain(T0 + 300, "spot")})
    assert sim.slots_launched()[-1] == "c[0]"
    sim.join("c[0]")  # ready: the running round admits it at a commit
    assert sim.poll("a[0]").update_gen == 1
    assert_round(sim.join("a[0]", "b[0]", reason="update"), 2, needs_sync=True)  # c receives the state
    assert sorted(sim.layout()) == ["a[0]", "b[0]", "c[0]"]
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING  # until c is known to hold the state
    sim.commit("a[0]", "b[0]", "c[0]")  # the round's first commit: c holds the state now
    sim.advance(1)
    assert {state(sim, "a[0]"), state(sim, "b[0]")} == {WorkerState.DRAINING}
    replies = sim.join("a[0]", "b[0]", "c[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["b[0]"], ExitOrder)
    assert sim.layout() == ["c[0]"] and not [kind for kind, _ in sim.events if kind == "rollback"]


def test_a_notice_without_a_deadline_never_sends_the_last_holders_away_on_its_own() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, max_np=2)
    sim.commit("a[0]", "b[0]")
    sim.discover({}, {"a": Drain(None, "rebalance"), "b": Drain(None, "rebalance")})
    sim.advance(100)  # longer than any deadline margin: nothing comes closer
    assert {state(sim, "a[0]"), state(sim, "b[0]")} == {WorkerState.RUNNING} and sim.outcome is None
    assert sim.poll("a[0]").update_gen == 0


def test_a_new_host_gets_a_worker_in_the_place_of_the_last_holders_of_a_full_job_and_it_takes_the_state() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, max_np=2)
    sim.commit("a[0]", "b[0]")
    sim.discover({"c": 1}, {"a": Drain(T0 + 300, "spot"), "b": Drain(T0 + 300, "spot")})
    assert sim.slots_launched()[-1] == "c[0]"  # the holders are leaving: they hold no place of --max-np
    sim.join("c[0]")
    assert sim.poll("a[0]").update_gen == 1
    assert_round(sim.join("a[0]", "b[0]", reason="update"), 2, needs_sync=True)
    assert sorted(sim.layout()) == ["a[0]", "b[0]", "c[0]"]  # beyond --max-np until the holders leave
    sim.commit("a[0]", "b[0]", "c[0]")
    sim.advance(1)
    replies = sim.join("a[0]", "b[0]", "c[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["b[0]"], ExitOrder)
    assert sim.layout() == ["c[0]"] and sim.outcome is None
