"""The worker's side of a planned next round (cloud_elastic.worker.rounds.next_group): which heartbeat replies
start, keep or drop the plan it acts on, and when a planned round it joined counts as given up."""

from __future__ import annotations

import time

import pytest

from cloud_elastic.protocol import NextRound, RankInfo
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.rounds.groups import RoundInfo
from cloud_elastic.worker.rounds.next_group import NextGroupMixin
from cloud_elastic.worker.rounds.reclaim import Reaper

pytestmark = pytest.mark.timeout(10)

RANKS = RankInfo(1, 3, 0, 1, 1, 3)
PLAN = NextRound(4, 2, RANKS, ("a", "b", "c"))


class Ctx(NextGroupMixin):
    """Just what the mixin uses; on NCCL, so a plan's formation ends at once (reported as not possible)."""

    def __init__(self) -> None:
        self.info: RoundInfo | None = None
        self._seen_round = 1
        self.backend = "nccl"
        self._formations: list = []
        self._reaper = Reaper()
        self._codec = None  # no driver to report to
        self.worker_id = "w"


def later() -> float:
    return time.monotonic() + 1


def test_an_offer_starts_the_plan_a_reply_without_it_before_its_round_drops_it() -> None:
    ctx = Ctx()
    ctx._next_offered(PLAN, 1, 0, time.monotonic())
    assert ctx.next_plan == 4
    pending = ctx.__dict__["_next_pending"]
    assert pending.failed and pending.done.is_set()  # NCCL: no group in the background
    ctx._next_offered(PLAN, 1, 0, later())  # offered again: nothing changes
    assert ctx.__dict__["_next_pending"] is pending
    ctx._next_offered(None, 1, 0, later())
    assert ctx.next_plan == 0 and pending.dropped


def test_a_reply_showing_the_plans_round_formed_from_it_keeps_the_plan_and_another_round_drops_it() -> None:
    ctx = Ctx()
    ctx._next_offered(PLAN, 1, 0, time.monotonic())
    ctx._next_offered(None, 2, 4, later())  # the round formed from the plan: the training thread takes it
    assert ctx.next_plan == 4
    ctx._next_offered(None, 2, 0, later())  # a round 2 formed without it (a recovery)
    assert ctx.next_plan == 0


def test_a_reply_to_a_heartbeat_sent_before_the_plan_was_made_does_not_drop_it() -> None:
    ctx = Ctx()
    sent = time.monotonic()
    ctx._next_offered(PLAN, 1, 0, later())
    ctx._next_offered(None, 1, 0, sent)
    assert ctx.next_plan == 4


def test_a_joined_planned_round_the_driver_dropped_counts_as_aborted_and_fails_the_next_collective() -> None:
    ctx = Ctx()
    ctx.info = RoundInfo(*vars(RANKS).values(), round=2, needs_sync=True, update_gen=1, hosts=PLAN.hosts, planned=4)
    ctx.__dict__["_planned_at"] = time.monotonic()
    assert ctx.next_plan == 4  # told in its heartbeats until the driver formed the round
    ctx._next_offered(PLAN, 1, 0, later())
    assert not ctx._plan_given_up(2) and ctx.__dict__.get("_next_pending") is None  # its own plan: not formed twice
    ctx._next_offered(None, 2, 4, later())
    assert not ctx._plan_given_up(2)  # formed from the plan
    ctx._next_offered(None, 1, 0, later())
    assert ctx._plan_given_up(2) and not ctx._plan_given_up(3)


def test_a_planned_assignment_without_its_group_fails_the_round_here() -> None:
    ctx = Ctx()
    ctx.progress = type("P", (), {"waiting": lambda self: __import__("contextlib").nullcontext()})()
    ctx._form_limit_s = lambda: 1.0
    ctx._aborted = lambda round_: False
    info = RoundInfo(*vars(RANKS).values(), round=2, needs_sync=True, update_gen=1, hosts=PLAN.hosts, planned=4)
    with pytest.raises(CollectiveError, match="planned round 2"):
        ctx._planned_group(info)  # NCCL: it cannot form the group in the background
    assert ctx.next_plan == 0
