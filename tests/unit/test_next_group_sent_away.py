"""A worker sent away (its host drains) keeps the group of a planned round the driver already formed: it leaves at
that round's first commit, and its peers' sync waits for it there (cloud_elastic.worker.rounds.next_group).

Seen under load (test_kubernetes_jobs, a DisruptionTarget on rank 0's pod just after the admitting round formed
from its plan): rank 0's heartbeat brought the leave before its training thread switched; the group was dropped,
the round aborted, the survivors synced again and reported a rollback, and the probe's reset count fell one short."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tests.unit.test_next_group import PLAN, Ctx, later

pytestmark = pytest.mark.timeout(10)


def test_sent_away_after_the_round_formed_from_its_plan_it_keeps_the_group_and_starts_no_other() -> None:
    ctx = Ctx()
    ctx._next_offered(PLAN, 1, 0, time.monotonic())
    pending = ctx.__dict__["_next_pending"]
    ctx.sent_away = "host a is draining (DisruptionTarget: EvictionByEvictionAPI)"
    ctx._next_offered(None, 2, 4, later())  # round 2 formed from plan 4, and the worker will leave
    assert ctx.__dict__["_next_pending"] is pending and not pending.dropped and ctx.next_plan == 4
    ctx._next_offered(dataclasses.replace(PLAN, plan=5, round=3), 2, 4, later())
    assert ctx.__dict__["_next_pending"] is pending  # sent away: no other plan starts
    ctx._next_offered(None, 2, 0, later())  # a round 2 formed without it after all
    assert pending.dropped and ctx.next_plan == 0


def test_sent_away_before_the_round_formed_it_drops_the_plan() -> None:
    ctx = Ctx()
    ctx._next_offered(PLAN, 1, 0, time.monotonic())
    pending = ctx.__dict__["_next_pending"]
    ctx.sent_away = "host a is draining"
    ctx._next_offered(PLAN, 1, 0, later())  # still offered (the driver has not dropped it yet): it leaves anyway
    assert pending.dropped and ctx.next_plan == 0


def test_dismissed_it_drops_even_the_plan_its_round_formed_from() -> None:
    ctx = Ctx()
    ctx._next_offered(PLAN, 1, 0, time.monotonic())
    pending = ctx.__dict__["_next_pending"]
    ctx.dismissed = True
    ctx._next_offered(None, 2, 4, later())
    assert pending.dropped and ctx.next_plan == 0
