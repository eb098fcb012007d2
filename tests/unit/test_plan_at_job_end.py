"""A planned next round ends with the job (cloud_elastic.driver.job.next_round): once rank 0 has returned from
its training function nothing is offered any more, so the members cancel their background formation at their
next heartbeat and none starts one again while it exits (worker.rounds.next_group)."""

from __future__ import annotations

import pytest

from tests.unit.test_job_next_round import grown

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
