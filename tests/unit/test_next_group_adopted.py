"""A worker adopted by a restarted driver forgets the dead driver's plan numbers (``NextGroupMixin._forget_plans``):
every driver numbers its plans from 1, so an old number read against the new driver's plans means another plan."""

from __future__ import annotations

import time

import pytest

from cloud_elastic.protocol import NextRound
from cloud_elastic.worker.rounds.groups import RoundInfo
from tests.unit.test_next_group import PLAN, RANKS, Ctx, later

pytestmark = pytest.mark.timeout(10)


def adopted_in_planned_round() -> Ctx:
    """A member of round 2, formed from the dead driver's plan 4, whose newcomer's report was still deferred."""
    ctx = Ctx()
    ctx.info = RoundInfo(*vars(RANKS).values(), round=2, needs_sync=True, update_gen=1, planned=4)
    ctx._seen_round = 2
    ctx.__dict__.update(_planned_at=time.monotonic(), _plan_was_member=False, _taken_offer=PLAN,
                        _report_deferred=object())
    ctx._forget_plans()
    return ctx


def test_the_adopted_round_is_not_taken_for_a_plan_the_new_driver_gave_up() -> None:
    ctx = adopted_in_planned_round()
    ctx._next_offered(None, 2, 0, later())  # the new driver: round 2, formed from no plan it knows
    assert not ctx._plan_given_up(2)
    assert (ctx.info.round, ctx.info.rank, ctx.info.size, ctx.info.planned) == (2, 1, 3, 0)
    assert ctx.next_plan == 0


def test_the_new_drivers_plan_with_the_old_number_is_formed_not_taken_for_the_one_joined() -> None:
    ctx = adopted_in_planned_round()
    offer = NextRound(4, 3, RANKS)  # the new driver's plan 4: round 3
    ctx._next_offered(offer, 2, 0, later())
    pending = ctx.__dict__.get("_next_pending")
    assert pending is not None and pending.offer == offer and ctx.next_plan == 4


def test_a_report_deferred_under_the_dead_driver_is_not_sent_to_the_new_one() -> None:
    ctx = adopted_in_planned_round()
    sent = []
    ctx._report_next = lambda pending, formed, reason="": sent.append(pending)
    ctx._first_collective_of_plan()
    assert sent == []
