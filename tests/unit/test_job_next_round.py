"""The planned next round (cloud_elastic.driver.job.next_round): a newcomer is admitted through a round whose
group its members form in the background; the running round is asked to change only once all have formed it,
and any failure, notice or delay drops the plan and the job goes on as without it."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Assignment
from cloud_elastic.driver.job.next_round import FORM_DEADLINE_S
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import KILLED, Sim, assert_round, started

pytestmark = pytest.mark.timeout(10)


def grown() -> Sim:
    """Two workers on host a train in round 1 (one commit made); host b is added and its newcomer waits."""
    sim = started(2, {"a": 2}, max_np=3, plan_admissions=True)
    sim.commit("a[0]", "a[1]")
    sim.discover({"a": 2, "b": 1})
    sim.join("b[0]")
    return sim


def offer(sim: Sim, slot: str):
    return sim.job.rounds.next.offer_to(sim.id(slot))


def formed(sim: Sim, *slots: str, ok: bool = True) -> None:
    plan = sim.job.rounds.next.plan
    assert plan is not None
    for slot in slots:
        sim.job.rounds.next.report(sim.id(slot), plan.plan, ok, "" if ok else "connection refused")


def test_a_ready_newcomer_is_offered_a_planned_round_and_answered_at_once_while_the_round_runs_on() -> None:
    sim = grown()
    a0, a1 = offer(sim, "a[0]"), offer(sim, "a[1]")
    assert a0 is not None and a1 is not None and (a0.round, a0.plan) == (2, 1)
    assert sorted([a0.ranks.rank, a1.ranks.rank]) == [0, 1] and a0.ranks.size == 3
    newcomer = sim.reply("b[0]")  # answered at rendezvous with the planned round, before the running round stops
    assert isinstance(newcomer, Assignment) and (newcomer.round, newcomer.planned, newcomer.ranks.rank) == (2, 1, 2)
    assert newcomer.needs_sync
    assert a0.peers_in_store and newcomer.peers_in_store  # every member gave its addresses: write them in the store
    assert sim.poll("a[0]").update_gen == 0  # the running round is not asked to change yet
    assert sim.job.round == 1 and sim.layout() == ["a[0]", "a[1]"]


def test_the_update_is_raised_only_once_every_member_formed_the_group_and_the_round_forms_from_the_plan() -> None:
    sim = grown()
    formed(sim, "a[0]", "b[0]")
    sim.advance(1)
    assert sim.poll("a[0]").update_gen == 0  # a[1] has not formed it yet
    formed(sim, "a[1]")
    assert sim.poll("a[0]").update_gen == 1
    planned = {s: offer(sim, s).ranks.rank for s in ("a[0]", "a[1]")}
    replies = sim.join("a[0]", "a[1]", reason="update")
    assert_round(replies, 2, needs_sync=True)
    assert all(r.planned == 1 and r.ranks.rank == planned[s] and r.update_gen == 1 for s, r in replies.items())
    assert sim.reply("b[0]").planned == 1 and sim.reply("b[0]").update_gen == 1
    assert sim.layout() == ["a[0]", "a[1]", "b[0]"]
    assert offer(sim, "a[0]") is None  # nothing left to offer once its round formed
    assert sim.job.rounds.planned == 1


def test_a_failure_while_planned_drops_the_plan_and_recovery_forms_as_before_without_the_told_newcomer() -> None:
    sim = started(3, {"a": 3}, max_np=4, min_np=2, plan_admissions=True)
    sim.commit("a[0]", "a[1]", "a[2]")
    sim.discover({"a": 3, "b": 1})
    sim.join("b[0]")
    assert sim.reply("b[0]").planned == 1
    formed(sim, "a[0]", "a[1]", "b[0]")
    sim.exit("a[2]", KILLED)
    sim.advance(0.5)
    assert sim.job.rounds.next.plan is None and offer(sim, "a[0]") is None
    replies = sim.join("a[0]", "a[1]", reason="failure")
    assert_round(replies, 2, needs_sync=True)
    assert all(r.planned == 0 for r in replies.values())
    assert sim.layout() == ["a[0]", "a[1]"]  # the newcomer waits in the dropped plan's group until it learns
    assert sim.reply("b[0]") is None
    update = sim.poll("a[0]").update_gen
    assert sim.join("b[0]", reason="failure")["b[0]"].planned == 2  # it came back: the new round plans again
    formed(sim, "a[0]", "a[1]", "b[0]")
    assert sim.poll("a[0]").update_gen == update + 1
    assert_round(sim.join("a[0]", "a[1]", reason="update"), 3, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]", "b[0]"] and sim.reply("b[0]").planned == 2


def test_a_plan_not_formed_within_the_deadline_falls_back_to_the_usual_update() -> None:
    sim = grown()
    formed(sim, "a[0]", "a[1]")  # the newcomer never reports
    sim.advance(FORM_DEADLINE_S - 1)
    assert sim.job.rounds.next.plan is not None and sim.poll("a[0]").update_gen == 0
    sim.advance(2)
    assert sim.job.rounds.next.plan is None
    assert sim.poll("a[0]").update_gen == 1  # asked the usual way, and never planned again in this round
    assert sim.job.rounds.next.plan is None
    sim.join("b[0]", reason="failure")  # it learned the plan is gone, and is back
    replies = sim.join("a[0]", "a[1]", reason="update")
    assert_round(replies, 2, needs_sync=True)
    assert sim.layout() == ["a[0]", "a[1]", "b[0]"] and all(r.planned == 0 for r in replies.values())


def test_a_member_that_cannot_form_the_group_drops_the_plan_at_once() -> None:
    sim = grown()
    formed(sim, "a[1]", ok=False)
    assert sim.job.rounds.next.plan is None
    sim.advance(0.5)
    assert sim.poll("a[0]").update_gen == 1


def test_a_notice_for_a_members_host_while_planned_drops_the_plan() -> None:
    sim = started(2, {"a": 1, "c": 1}, max_np=3, min_np=1, plan_admissions=True)
    sim.commit("a[0]", "c[0]")
    sim.discover({"a": 1, "c": 1, "b": 1})
    sim.join("b[0]")
    assert offer(sim, "a[0]") is not None
    sim.discover({"a": 1, "b": 1}, {"c": Drain(reason="spot interruption")})
    sim.advance(0.5)
    assert sim.job.rounds.next.plan is None and offer(sim, "a[0]") is None
    assert sim.poll("a[0]").update_gen == 1  # the usual update: c leaves at the next commit


def test_without_the_policy_the_newcomer_asks_for_the_update_at_once() -> None:
    sim = started(2, {"a": 2}, max_np=3)
    sim.discover({"a": 2, "b": 1})
    sim.join("b[0]")
    assert sim.job.rounds.next.plan is None and sim.reply("b[0]") is None
    assert sim.poll("a[0]").update_gen == 1


@pytest.mark.parametrize("first", ["the survivor's failure", "the kill's detection"])
def test_a_newcomer_back_from_a_dropped_plan_before_the_recovery_round_forms_is_taken_into_it(first: str) -> None:
    # As in test_planned_round: a member (c[0]) is killed while the plan's group forms; the survivor's collective
    # fails at once, the kill is found on its own clock, and the newcomer learns of the drop in its heartbeat.
    sim = started(2, {"a": 1, "c": 1}, max_np=3, min_np=1, plan_admissions=True)
    sim.commit("a[0]", "c[0]")
    sim.discover({"a": 1, "c": 1, "b": 1})
    sim.join("b[0]")
    assert sim.reply("b[0]").planned == 1
    if first == "the survivor's failure":
        assert sim.join("a[0]", reason="failure")["a[0]"] is None  # its peer's death is not known yet
    else:
        sim.exit("c[0]", KILLED)
    sim.advance(0.5)
    assert sim.job.rounds.next.plan is None
    assert sim.join("b[0]", reason="failure")["b[0]"] is None  # back at rendezvous: it counts for rounds again
    if first == "the survivor's failure":
        sim.exit("c[0]", KILLED)
        sim.advance(0.5)
    else:
        sim.join("a[0]", reason="failure")
    replies = {s: sim.reply(s) for s in ("a[0]", "b[0]")}
    assert_round(replies, 2, needs_sync=True)  # the recovery round admits it: one reset, not two
    assert sim.layout() == ["a[0]", "b[0]"] and all(r.planned == 0 for r in replies.values())
    assert sim.job.rounds.next.told == {}
