"""A planned next round ends with the job (cloud_elastic.driver.job.next_round): once rank 0 has returned from
its training function nothing is offered any more, so the members cancel their background formation at their
next heartbeat and none starts one again while it exits (worker.rounds.next_group)."""

from __future__ import annotations

import pytest

from tests.unit.test_job_next_round import grown, started

pytestmark = pytest.mark.timeout(10)


def test_once_rank_0_finished_training_the_plan_is_offered_to_nobody() -> None:
    sim = grown()
    plans = sim.job.rounds.next
    assert plans.offer_to(sim.id("a[0]")) is not None and sim.reply("b[0]").planned == 1
    rank0 = next(s for s in ("a[0]", "a[1]") if sim.job.workers[sim.id(s)].rank == 0)
    sim.complete(rank0)
    # Not to the members still in the round (heartbeats go on through their exit hooks), nor to the newcomer.
    assert all(plans.offer_to(sim.id(s)) is None for s in ("a[0]", "a[1]", "b[0]"))
    assert plans.assignment_for(sim.job.workers[sim.id("b[0]")]) is None
    sim.advance(0.5)
    assert all(plans.offer_to(sim.id(s)) is None for s in ("a[0]", "a[1]", "b[0]"))


def _not_rank0(sim) -> str:
    return next(s for s in ("a[0]", "a[1]") if sim.job.workers[sim.id(s)].rank != 0)


def test_a_plan_offered_before_a_member_returned_from_its_training_function_is_withdrawn() -> None:
    # rv8 a3: round 7 was planned with ranks 1 and 2, which returned 0.1 s later; rank 0 was still forming the
    # plan's group (with peers that would never form it) when its own script ended.
    sim = grown()
    plans = sim.job.rounds.next
    assert plans.offer_to(sim.id("a[0]")) is not None and sim.reply("b[0]").planned == 1
    member = _not_rank0(sim)
    sim.complete(member)  # waits for rank 0: the job is still running
    assert sim.job.workers[sim.id(member)].returned
    assert all(plans.offer_to(sim.id(s)) is None for s in ("a[0]", "a[1]", "b[0]"))
    assert plans.assignment_for(sim.job.workers[sim.id("b[0]")]) is None
    sim.advance(1)  # the newcomer still waits: no plan including the returned member is made again
    assert plans.plan is None or sim.id(member) not in plans.plan.ranks
    assert all(plans.offer_to(sim.id(s)) is None for s in ("a[0]", "a[1]"))


def test_no_round_is_planned_with_a_member_that_returned_from_its_training_function() -> None:
    sim = started(2, {"a": 2}, max_np=3, plan_admissions=True)
    sim.commit("a[0]", "a[1]")
    member = _not_rank0(sim)
    sim.complete(member)
    sim.discover({"a": 2, "b": 1})
    sim.join("b[0]")
    sim.advance(1)
    plans = sim.job.rounds.next
    assert plans.plan is None or sim.id(member) not in plans.plan.ranks
    assert all(plans.offer_to(sim.id(s)) is None for s in ("a[0]", "a[1]"))
