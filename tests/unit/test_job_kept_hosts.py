"""A host missing from discovery past the grace that the job keeps (``driver/job/discovery_edge.py``) is a
leaving host for placement: a replacement is launched on a free slot, or a waiting spare joins, takes the
state from the kept workers in a round, and they leave at a commit with zero rollback.

Found by review: with default flags (``-np 2``: ``--min-np`` = ``--max-np`` = 2) a host swapped in
discovery was kept for ``--min-np`` forever and nothing was launched on the new one; with ``-np 1 --spares 1``
the member on the dropped host trained on forever while the ready spare stayed idle. Scripted timelines on a
fake clock.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder, WorkerState
from tests.unit.test_job import Sim, assert_round, started

pytestmark = pytest.mark.timeout(10)


def state(sim: Sim, slot: str) -> WorkerState:
    return sim.job.workers[sim.id(slot)].state


def removed(sim: Sim) -> list[str]:
    return [h["host"] for kind, f in sim.events if kind == "hosts_changed" for h in f["removed"]]


def no_rollback(sim: Sim) -> bool:
    formed = [f for kind, f in sim.events if kind == "round_formed"]
    return (sim.outcome is None and not any(kind == "rollback" for kind, _ in sim.events)
            and not any(f["from_checkpoint"] for f in formed) and sim.job.abort_round == 0)


def test_a_host_swapped_in_discovery_with_default_flags_is_replaced_and_leaves_at_a_commit() -> None:
    sim = started(2, {"a": 1, "b": 1}, missing_grace=1)  # -np 2: --min-np = --max-np = 2
    sim.commit("a[0]", "b[0]")
    sim.discover({"a": 1, "c": 1})
    sim.advance(1.5)
    assert state(sim, "b[0]") is WorkerState.RUNNING  # kept for --min-np: it trains on meanwhile
    assert sim.slots_launched() == ["a[0]", "b[0]", "c[0]"]  # and a replacement starts on the new host
    assert sim.join("c[0]") == {"c[0]": None}
    sim.advance(0.5)
    assert state(sim, "b[0]") is WorkerState.DRAINING and removed(sim) == ["b"]
    assert sim.poll("a[0]").update_gen == 1
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(replies["b[0]"], ExitOrder)
    assert_round({"a[0]": replies["a[0]"], "c[0]": sim.reply("c[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "c[0]"] and no_rollback(sim)


def test_the_only_host_swapped_in_discovery_hands_the_state_to_its_replacement() -> None:
    sim = started(1, {"a": 1}, missing_grace=1)
    sim.commit("a[0]")
    sim.discover({"c": 1})
    sim.advance(1.5)
    assert sim.slots_launched() == ["a[0]", "c[0]"]
    sim.join("c[0]")
    sim.advance(0.5)
    assert state(sim, "a[0]") is WorkerState.RUNNING and removed(sim) == []  # the last holder of the state
    assert sim.poll("a[0]").update_gen == 1
    replies = sim.join("a[0]", reason="update")
    assert_round({**replies, "c[0]": sim.reply("c[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "c[0]"]  # a is rank 0: c receives the state from it
    sim.commit("a[0]", "c[0]")
    sim.advance(0.5)
    assert state(sim, "a[0]") is WorkerState.DRAINING and removed(sim) == ["a"]
    replies = sim.join("a[0]", "c[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["c[0]"], Assignment)
    assert sim.layout() == ["c[0]"] and sim.job.round == 3 and no_rollback(sim)


def test_the_member_on_a_dropped_host_hands_the_state_to_the_ready_spare() -> None:
    sim = Sim(1, spares=1, min_np=1, missing_grace=1)
    sim.discover({"a": 1, "b": 1})
    assert_round(sim.join("a[0]"), 1, needs_sync=True)
    assert sim.join("b[0]") == {"b[0]": None}  # the spare waits
    sim.commit("a[0]")
    sim.discover({"b": 1})
    sim.advance(0.5)
    assert sim.poll("a[0]").update_gen == 0  # within the grace nothing changes
    sim.advance(1)
    assert state(sim, "a[0]") is WorkerState.RUNNING and sim.poll("a[0]").update_gen == 1
    replies = sim.join("a[0]", reason="update")
    assert_round({**replies, "b[0]": sim.reply("b[0]")}, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "b[0]"]
    sim.commit("a[0]", "b[0]")
    sim.advance(0.5)
    assert state(sim, "a[0]") is WorkerState.DRAINING and removed(sim) == ["a"]
    replies = sim.join("a[0]", "b[0]", reason="update")
    assert isinstance(replies["a[0]"], ExitOrder) and isinstance(replies["b[0]"], Assignment)
    assert sim.layout() == ["b[0]"] and no_rollback(sim)



def test_a_kept_host_listed_again_sends_its_surplus_replacement_away() -> None:
    # Else the replacement, beyond --max-np, waited at rendezvous and asked for an update every round.
    sim = started(2, {"a": 1, "b": 1}, missing_grace=1)
    sim.commit("a[0]", "b[0]")
    sim.discover({"a": 1, "c": 1})
    sim.advance(1.5)
    assert sim.slots_launched() == ["a[0]", "b[0]", "c[0]"]
    sim.discover({"a": 1, "b": 1, "c": 1})  # b is back, c still starting
    assert [s.worker_id for s in sim.stops] == [sim.id("c[0]")]
    sim.advance(5)
    assert sim.poll("a[0]").update_gen == 0 and state(sim, "b[0]") is WorkerState.RUNNING
    assert sim.slots_launched() == ["a[0]", "b[0]", "c[0]"] and removed(sim) == []


def test_the_removal_line_says_how_long_a_kept_host_was_missing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cloud_elastic.driver.job.discovery_edge")
    sim = started(1, {"a": 1}, missing_grace=1)
    sim.commit("a[0]")
    sim.discover({"c": 1})
    sim.advance(1.5)
    sim.join("c[0]")
    sim.advance(0.5)
    sim.join("a[0]", reason="update")
    sim.join("c[0]")
    sim.commit("a[0]", "c[0]")
    sim.advance(0.6)
    assert removed(sim) == ["a"]
    lines = [r.getMessage() for r in caplog.records if "stayed missing" in r.getMessage()]
    # Kept as the last holder past the 1 s grace: the line says how long it was missing in all.
    assert len(lines) == 1 and "stayed missing from discovery for 2s; removed" in lines[0], lines
