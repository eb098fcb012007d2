"""A slot whose workers keep returning early backs off like a failing one (issue 44, finding 10).

Horovod's MNIST elastic example builds its ``DistributedSampler`` once, at start-up: a newcomer's
sampler is sized for the larger world it joined, so its epochs are shorter and its training
function returns while rank 0 trains on. It is sent away; refilled at once, its slot made a
restart loop (20 newcomers in 190 s, two resets each). These timelines script that newcomer on
the job's fake clock.
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.elastic_job import EARLY_RETURN_WAIT_S, WorkerState
from tests.unit.test_job import CLEAN, Sim, assert_round, started

pytestmark = pytest.mark.timeout(10)


def admit_newcomer(sim: Sim, round_: int) -> None:
    """The latest worker on b[0] registers; a[0] and a[1] (which have committed) leave their round for it:
    round ``round_`` forms."""
    sim.commit("a[0]", "a[1]")
    assert sim.join("b[0]") == {"b[0]": None}
    assert_round(sim.join("a[0]", "a[1]", reason="update"), round_, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]", "b[0]"]


def newcomer_returns_early(sim: Sim) -> dict:
    """b[0] returns from its training function; rank 0 is seen waiting in a collective; b[0] is sent away
    and exits; the others come back from the aborted round. Returns b[0]'s ``worker_left`` event."""
    worker = sim.id("b[0]")
    assert sim.job.completed(worker, sim.now, commit_seq=3, steps=3) == ("wait", "")
    sim.advance(0.5)
    sim.job.heartbeat(sim.id("a[0]"), sim.now, waiting_s=EARLY_RETURN_WAIT_S + 0.5)
    sim.advance(0.5)
    decision, _ = sim.job.completion_reply(worker)
    assert decision == "leave"
    sim.exit("b[0]", CLEAN)
    sim.join("a[0]", "a[1]", reason="failure")
    return [f for kind, f in sim.events if kind == "worker_left" and f["worker"] == worker][-1]


def newcomer_loop(sim: Sim, seconds: float) -> list[dict]:
    """For ``seconds`` of the fake clock, every newcomer on b[0] joins and returns early; their worker_left events."""
    left = []
    end = sim.now + seconds
    while sim.now < end:
        launched = len(sim.launched)
        sim.advance(0.5)
        if len(sim.launched) > launched and sim.slots_launched()[-1] == "b[0]":
            admit_newcomer(sim, sim.job.round + 1)
            left.append(newcomer_returns_early(sim))
    return left


def test_a_slot_whose_newcomers_return_early_is_refilled_after_growing_cooldowns() -> None:
    sim = started(2, {"a": 2}, min_np=2, max_np=3, cooldown=(10.0, 300.0))
    sim.discover({"a": 2, "b": 1})
    admit_newcomer(sim, 2)
    first = newcomer_returns_early(sim)
    assert first["early_return"] and 10 <= first["blacklisted_s"] <= 11, first
    assert sim.blocked("b[0]")
    sim.advance(5)
    assert sim.slots_launched().count("b[0]") == 1  # not refilled at once: that was the restart loop
    left = [first] + newcomer_loop(sim, 190)
    # In 195 s, four refills, after about 10, 20, 40 and 80 s of cooldown (plus up to 10 % jitter): five
    # newcomers in all, where the run had twenty.
    assert sim.slots_launched().count("b[0]") == len(left) == 5, sim.slots_launched()
    waits = [e["blacklisted_s"] for e in left]
    assert all(b > 1.8 * a for a, b in zip(waits, waits[1:])), waits
    assert sim.outcome is None and sim.layout() == ["a[0]", "a[1]"]


def test_the_likely_cause_is_explained_once_and_each_later_early_return_gets_one_line(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_elastic.driver.job")
    sim = started(2, {"a": 2}, min_np=2, max_np=3, cooldown=(1.0, 300.0))
    sim.discover({"a": 2, "b": 1})
    admit_newcomer(sim, 2)
    newcomer_returns_early(sim)
    newcomer_loop(sim, 20)
    early = [r.getMessage() for r in caplog.records if "returned" in r.getMessage() and "b[0]" in r.getMessage()]
    assert len(early) >= 3, early
    assert sum("sized for another world size" in m for m in early) == 1, early
    assert "sized for another world size" in early[0] and "doubles that wait" in early[0]
    assert all("explained above" in m and "a new worker starts on slot b[0] in" in m for m in early[1:]), early
    # What the worker itself is told (and prints as it leaves) is the fact, not the explanation again.
    assert all("sized for another world size" not in w.why for w in sim.job.workers.values())


def test_a_parked_member_whose_rank_0_failed_leaves_without_blacklisting_its_slot() -> None:
    sim = started(3, {"a": 3}, min_np=1)
    sim.commit("a[0]", "a[1]", "a[2]", count=4)
    assert sim.job.completed(sim.id("a[2]"), sim.now, commit_seq=4, steps=4) == ("wait", "")
    sim.exit("a[0]")  # rank 0 crashes: a failure, its own slot is blacklisted
    assert sim.job.completion_reply(sim.id("a[2]"))[0] == "leave"
    sim.exit("a[2]", CLEAN)
    left = [f for kind, f in sim.events if kind == "worker_left"]
    assert len(left) == 1 and "early_return" not in left[0], left
    assert sim.blocked("a[0]") and not sim.blocked("a[2]")


def test_a_cooldown_range_of_zero_refills_the_slot_at_once_as_before() -> None:
    sim = started(2, {"a": 2}, min_np=2, max_np=3, cooldown=(0.0, 0.0))
    sim.discover({"a": 2, "b": 1})
    admit_newcomer(sim, 2)
    assert newcomer_returns_early(sim)["blacklisted_s"] == 0
    sim.advance(0.5)
    assert sim.slots_launched().count("b[0]") == 2
    assert sim.job.workers[sim.id("b[0]")].state is WorkerState.STARTING


def test_host_mates_returning_early_together_back_their_host_off_once() -> None:
    from tests.unit.test_job_whole_hosts import whole

    sim = whole(4, {"a": 2, "b": 2}, min_np=2)
    sim.commit("a[0]", "a[1]", "b[0]", "b[1]", count=12)
    for slot in ("b[0]", "b[1]"):
        assert sim.job.completed(sim.id(slot), sim.now, commit_seq=12, steps=12) == ("wait", "")
    sim.advance(1)
    sim.job.heartbeat(sim.id("a[0]"), sim.now, waiting_s=EARLY_RETURN_WAIT_S + 0.5)
    sim.advance(0.5)
    blacklist = sim.job.hosts.blacklist
    assert [blacklist.failures(s) for s in (Slot("b", 0), Slot("b", 1))] == [1, 1]
    cooldowns = {sim.job.workers[sim.id(s)].cooldown_s for s in ("b[0]", "b[1]")}
    assert len(cooldowns) == 1 and 10 <= cooldowns.pop() <= 11  # a first back-off, not a second one
