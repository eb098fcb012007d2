"""The worker's side of a planned next round (cloud_elastic.worker.rounds.next_group): which heartbeat replies
start, keep or drop the plan it acts on, and when a planned round it joined counts as given up."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from cloud_elastic.protocol import NextRound, RankInfo
from cloud_elastic.worker.exceptions import CollectiveError
from cloud_elastic.worker.rounds.groups import RoundInfo
from cloud_elastic.worker.rounds.next_group import NextGroupMixin
from cloud_elastic.worker.rounds.reclaim import Reaper

pytestmark = pytest.mark.timeout(10)

RANKS = RankInfo(1, 3, 0, 1, 1, 3)
PLAN = NextRound(4, 2, RANKS)


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
    ctx.info = RoundInfo(*vars(RANKS).values(), round=2, needs_sync=True, update_gen=1, planned=4)
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
    info = RoundInfo(*vars(RANKS).values(), round=2, needs_sync=True, update_gen=1, planned=4)
    with pytest.raises(CollectiveError, match="planned round 2"):
        ctx._planned_group(info)  # NCCL: it cannot form the group in the background
    assert ctx.next_plan == 0


class GlooCtx(Ctx):
    """On Gloo, with a stand-in for the group's formation: it starts (recorded), and ends when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.backend = "gloo"
        self.progress = type("P", (), {"waiting": lambda self: contextlib.nullcontext()})()
        self._form_limit_s = lambda: 5.0
        self._aborted = lambda round_: False
        self.formations: list = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.at_lock = None  # once: run just before some thread next takes the plan lock
        self._form_next = self._fake_form

    def _next_lock(self):
        hook, self.at_lock = self.at_lock, None
        if hook is not None:
            hook()
        return super()._next_lock()

    def _fake_form(self, pending) -> None:
        self.formations.append(pending)
        self.started.set()
        self.release.wait(5)
        with super()._next_lock():
            if not pending.dropped:
                pending.group = object()
        pending.done.set()


def assignment(offer: NextRound) -> RoundInfo:
    return RoundInfo(*vars(offer.ranks).values(), round=offer.round, needs_sync=True, update_gen=1, planned=offer.plan)


def test_a_newcomer_told_of_the_plan_by_heartbeat_and_rendezvous_at_the_same_moment_forms_its_group_once() -> None:
    ctx = GlooCtx()
    taken: dict = {}

    def training_thread() -> None:
        try:
            taken["group"] = ctx._planned_group(assignment(PLAN))
        except CollectiveError as exc:
            taken["error"] = exc

    trainer = threading.Thread(target=training_thread)

    def assignment_arrives() -> None:  # the rendezvous answer, while the heartbeat thread handles the same plan
        trainer.start()
        assert ctx.started.wait(5)

    ctx.at_lock = assignment_arrives
    ctx._next_offered(PLAN, 1, 0, time.monotonic())
    ctx.release.set()
    trainer.join(5)
    assert "error" not in taken and taken.get("group") is not None
    assert len(ctx.formations) == 1  # a second formation of its rank: peers meet one, the other waits out its deadline


def test_an_offer_of_the_plan_whose_group_the_training_thread_took_starts_no_second_formation() -> None:
    ctx = GlooCtx()
    ctx.release.set()
    assert ctx._planned_group(assignment(PLAN)) is not None
    ctx._next_offered(PLAN, 1, 0, later())  # answered before the round's info was set: still offered
    assert len(ctx.formations) == 1 and ctx.__dict__.get("_next_pending") is None
