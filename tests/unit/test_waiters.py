"""Held control-plane requests wake on their own news only (cloud_elastic.driver.waiters).

Real threads wait as the driver's request threads do; each records every time it
wakes. A wake-up nobody needed would show as an extra record.
"""

from __future__ import annotations

import threading
import time

import pytest

from cloud_elastic.driver.job import Assignment, ExitOrder
from cloud_elastic.driver.waiters import JobCondition
from cloud_elastic.providers.api import Drain
from tests.unit.test_job_incremental import T0, arrive, job_on

pytestmark = pytest.mark.timeout(20)

LONG = 60.0  # a held request's deadline, never reached in these tests


def wait_until_held(cond: JobCondition, polls: int = 0, rendezvous: set[str] = frozenset()) -> None:
    deadline = time.monotonic() + 10
    while True:
        with cond:
            held_polls, held_rdzv = cond.held()
        if held_polls >= polls and rendezvous <= held_rdzv:
            return
        assert time.monotonic() < deadline, "the waiting thread never got to wait"
        time.sleep(0.01)


def hold_rendezvous(cond: JobCondition, job, worker: str, wakes: list) -> threading.Thread:
    """A thread holding ``worker``'s rendezvous request until it has an answer, as Driver._rendezvous does."""

    def run() -> None:
        with cond:
            while True:
                cond.wait_rendezvous(worker, LONG)
                reply = job.assignment(worker)
                wakes.append(reply)
                if reply is not None:
                    return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_rendezvous_request_wakes_when_its_worker_is_told_to_leave_not_when_another_is():
    job, ids = job_on({"a": 1, "b": 1, "c": 1}, 3, min_np=2)
    cond = JobCondition()
    cond.watch(job)
    a, b = ids[0], next(w for w in ids if w.startswith("b"))
    with cond:
        arrive(job, a)
        arrive(job, b)
    wakes_a: list = []
    wakes_b: list = []
    ta = hold_rendezvous(cond, job, a, wakes_a)
    tb = hold_rendezvous(cond, job, b, wakes_b)
    wait_until_held(cond, rendezvous={a, b})
    with cond:
        job.notice("b", Drain(deadline=None, reason="spot interruption"), T0, source="test")
        cond.notify_all()
    tb.join(10)
    assert len(wakes_b) == 1 and isinstance(wakes_b[0], ExitOrder)
    # a's request slept through b's news; the round it forms with c wakes it, once.
    with cond:
        assert wakes_a == []
        arrive(job, ids[2])  # the last one still starting: a round of a and c forms in this call
        cond.wake()
    ta.join(10)
    with cond:
        assert not ta.is_alive() and wakes_a == [job.assignment(a)] and isinstance(wakes_a[0], Assignment)


def test_held_heartbeats_wake_on_a_new_update_generation_and_not_on_other_notifies():
    job, ids = job_on({"a": 2, "b": 1}, 2, min_np=2, max_np=3)
    cond = JobCondition()
    cond.watch(job)
    with cond:
        arrive(job, ids[0])
        arrive(job, ids[1])
    seen: list[int] = []
    ready = threading.Event()

    def poll() -> None:
        with cond:
            known = job.update_gen
            ready.set()
            while job.update_gen == known:
                cond.wait_poll(LONG)
                seen.append(job.update_gen)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    ready.wait(10)
    wait_until_held(cond, polls=1)
    with cond:
        job.heartbeat(ids[0], T0, commits=3)  # news for no held request
        cond.notify_all()
        job.tick(T0)
        cond.notify_all()
    wait_until_held(cond, polls=1)
    with cond:
        assert seen == []
        arrive(job, ids[2])  # a newcomer: the round is asked for an update
        assert job.update_gen == 1
        cond.wake()
    t.join(10)
    assert seen == [1]
