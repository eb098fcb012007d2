"""A worker adopted by a restarted driver does its side of the adoption before it sends the request, not on the
reply: a reply lost (a timeout) after the driver adopted it leaves no second chance, since the next poll is answered
as usual (review s59 rvP finding 1). The real heartbeat loop of a real WorkerContext; only the driver is a fake that
answers as ``driver.job.window`` does (an unknown worker is told to re-register; an adopted one polls as usual)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cloud_elastic.protocol import AdoptRequest, NextRound, PollReply, RankInfo
from cloud_elastic.worker.context import RoundInfo, WorkerContext
from cloud_elastic.worker.link.pauses import Pauses
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(30)


def _context(info: RoundInfo, *, was_member: bool, seen_round: int) -> WorkerContext:
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address="127.0.0.1:2", job_id="j", worker_id="w1",
        secret="s" * 64, backend="gloo", collective_timeout_s=30.0, malloc_tuning=False))
    ctx.info = info
    ctx._seen_round = seen_round
    ctx._attempted_round = info.round
    ctx.__dict__.update(_planned_at=time.monotonic() - 5, _plan_was_member=was_member)
    return ctx


class _Driver:
    """The restarted driver. ``adopt_fails``: what each adopt call does ("lost": adopted, reply lost; "refused": not
    reached; "ok")."""

    def __init__(self, adopt_fails: list[str], next_round: NextRound | None = None) -> None:
        self.adopt_fails = adopt_fails
        self.next_round = next_round
        self.adopted = False
        self.requests: list[AdoptRequest] = []
        self.polls = 0

    def call(self, kind, payload=None, *, timeout_s=30.0):
        if kind == "adopt":
            self.requests.append(AdoptRequest.from_wire(payload))
            what = self.adopt_fails.pop(0) if self.adopt_fails else "ok"
            if what == "refused":
                raise ConnectionRefusedError("connection refused")
            self.adopted = True
            if what == "lost":
                raise socket.timeout("timed out")
            return {"ok": True}
        if kind == "poll":
            time.sleep(0.02)
            if not self.adopted:
                return PollReply(0, 0, 0, False, reregister=True).to_wire()
            self.polls += 1
            # the adopted round 2, formed from no plan this driver knows; then this driver's own plan 1
            return PollReply(2, 1, 0, False, round_plan=0, next_round=self.next_round if self.polls > 3 else None
                             ).to_wire()
        return {}


def _heartbeat(ctx: WorkerContext, driver: _Driver, until) -> None:
    thread = threading.Thread(target=ctx._heartbeats, args=(driver, Pauses()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)
    ctx._shutdown.set()
    thread.join(5)


def test_a_worker_whose_adopt_reply_was_lost_trains_on_in_its_round_and_forms_the_new_drivers_plan() -> None:
    info = RoundInfo(1, 3, 0, 1, 1, 3, round=2, needs_sync=True, update_gen=1, planned=1)
    ctx = _context(info, was_member=True, seen_round=2)  # in round 2, formed from the dead driver's plan 1
    started: list[int] = []
    ctx._start_next = lambda offer, **kw: started.append(offer.plan)
    driver = _Driver(["lost"], NextRound(1, 3, RankInfo(1, 4, 0, 1, 1, 4)))
    _heartbeat(ctx, driver, lambda: started)

    assert [r.round for r in driver.requests] == [2]  # adopted once, in its round
    assert not ctx._aborted(2)  # its collectives in the adopted round go on
    assert started[:1] == [1]  # the new driver's plan 1 is formed, not taken for the one it is in
    assert ctx._store_stale  # the next round forms on a new store client (the old one's server died)


def test_an_adopt_sent_again_tells_what_the_first_told() -> None:
    # A newcomer in the dead driver's plan 1 for round 2, which that driver never formed: adopted as a newcomer.
    info = RoundInfo(1, 3, 0, 1, 1, 3, round=2, needs_sync=True, update_gen=1, planned=1)
    ctx = _context(info, was_member=False, seen_round=1)
    driver = _Driver(["refused"])
    _heartbeat(ctx, driver, lambda: driver.polls > 0)

    assert [(r.round, r.ranks) for r in driver.requests] == [(0, None), (0, None)]
