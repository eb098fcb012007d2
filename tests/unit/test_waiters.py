"""Held control-plane requests are answered on their own news only (cloud_elastic.driver.runtime.condition).

Each held request gets a check that counts how often it is asked: a wake-up
nobody needed shows as an extra count. The last test goes through the real
server and client.
"""

from __future__ import annotations

import threading

import pytest

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.job.elastic_job import Assignment, ExitOrder
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.driver.runtime.condition import MAX_WAKE_PASSES, JobCondition
from cloud_elastic.protocol import PollReply, PollRequest
from cloud_elastic.providers.api import Drain
from cloud_elastic.worker.link.client import DriverClient
from tests.unit.test_job_incremental import T0, arrive, job_on

pytestmark = pytest.mark.timeout(20)

LONG = 60.0  # a held request's deadline, never reached in these tests


class CountingCheck:
    """A rendezvous check as the driver's: the worker's assignment, or nothing yet."""

    def __init__(self, job, worker: str) -> None:
        self.job, self.worker, self.calls, self.replies = job, worker, 0, []

    def __call__(self, final: bool):
        self.calls += 1
        reply = self.job.assignment(self.worker)
        if reply is None and not final:
            return None
        self.replies.append(reply)
        return {"status": type(reply).__name__}


def test_a_held_rendezvous_is_answered_when_its_worker_is_told_to_leave_and_not_asked_for_another():
    job, ids = job_on({"a": 1, "b": 1, "c": 1}, 3, min_np=2)
    cond = JobCondition()
    cond.watch(job)
    a, b, c = ids[0], next(w for w in ids if w.startswith("b")), next(w for w in ids if w.startswith("c"))
    with cond:
        arrive(job, a)
        arrive(job, b)
        check_a, check_b = CountingCheck(job, a), CountingCheck(job, b)
        held_a = cond.hold_rendezvous(a, check_a, LONG)
        held_b = cond.hold_rendezvous(b, check_b, LONG)
        assert cond.held() == (0, {a, b})
        job.notice("b", Drain(deadline=None, reason="spot interruption"), T0, source="test")
        cond.notify_all()
        assert held_b.answered and isinstance(check_b.replies[0], ExitOrder)
        assert not held_a.answered and check_a.calls == 0  # b's news did not concern a
        job.tick(T0)
        cond.notify_all()  # the loop's tick: nothing for a
        assert check_a.calls == 0
        arrive(job, c)  # the last one still starting: a round of a and c forms in this call
        cond.wake()
        assert held_a.answered and check_a.calls == 1 and isinstance(check_a.replies[0], Assignment)
        assert cond.held() == (0, set())


def test_held_heartbeats_are_asked_again_only_when_the_round_state_changes():
    job, ids = job_on({"a": 2, "b": 1}, 2, min_np=2, max_np=3)
    cond = JobCondition()
    cond.watch(job)
    calls = []

    def check(final: bool):
        calls.append(job.update_gen)
        return {"update_gen": job.update_gen} if job.update_gen != 0 or final else None

    with cond:
        arrive(job, ids[0])
        arrive(job, ids[1])
        cond.wake()  # as the driver does after each arrival: round 1 is news, before the hold
        held = cond.hold_poll(check, LONG)
        job.heartbeat(ids[0], T0, commits=3)
        job.tick(T0)
        cond.notify_all()
        assert calls == [] and not held.answered
        arrive(job, ids[2])  # a newcomer: the round is asked for an update
        cond.wake()
        assert calls == [1] and held.answered and cond.held() == (0, set())


def test_a_heartbeat_held_by_the_real_server_is_answered_with_the_new_update_generation():
    job, ids = job_on({"a": 2, "b": 1}, 2, min_np=2, max_np=3)
    cond = JobCondition()
    cond.watch(job)
    with cond:
        arrive(job, ids[0])
        arrive(job, ids[1])

    def handler(kind, message):
        with cond:
            request = PollRequest.from_wire(message)

            def check(final: bool):
                reply = job.heartbeat(message["worker"], T0, request.commits)
                changed = (reply.round, reply.update_gen, reply.abort_round) != (request.round, request.update_gen,
                                                                                  request.abort_round)
                return reply.to_wire() if changed or final else None

            return check(False) or cond.hold_poll(check, LONG)

    secret = new_secret()
    server = ControlServer(Codec(secret, "t"), handler)
    server.start()
    replies = []
    try:
        client = DriverClient(f"127.0.0.1:{server.port}", Codec(secret, "t"), ids[0])
        t = threading.Thread(target=lambda: replies.append(client.call("poll", PollRequest(1, 0, 0, 1).to_wire())))
        t.start()
        while True:  # until the server holds the request
            with cond:
                if cond.held()[0] == 1:
                    break
            t.join(0.01)
        with cond:
            arrive(job, ids[2])
            cond.wake()
        t.join(10)
    finally:
        server.close()
    reply = PollReply.from_wire(replies[0])
    assert (reply.round, reply.update_gen) == (1, 1)


def test_a_request_held_on_other_driver_state_is_answered_at_the_first_notify_after_it_changes():
    # As a restarted driver holds a rendezvous until its adoption window closes: nothing may block
    # the one server thread, so the request is held and asked again at each notify_all.
    job, _ = job_on({"a": 1}, 1)
    cond = JobCondition()
    cond.watch(job)
    adopting = [True]
    with cond:
        held = cond.hold(lambda final: None if adopting[0] and not final else {"status": "wait"}, LONG)
        cond.notify_all()
        assert not held.answered
        adopting[0] = False
        cond.notify_all()
        assert held.answered


def test_held_reports_whose_checks_notify_are_each_handled_once_when_the_adoption_window_closes():
    """A restarted driver holds ``completed`` reports until adoption ends; the check then hands the
    report to the job's rules, which notify. That notify used to re-enter the wake and run the same
    check again, and again, until RecursionError (seen after a driver adoption over SSH)."""
    job, _ids = job_on({"a": 1, "b": 1}, 2, min_np=1)
    cond = JobCondition()
    cond.watch(job)
    adopting = [True]
    handled: list[str] = []

    def held_report(worker: str):
        def check(final: bool):
            if adopting[0] and not final:
                return None
            handled.append(worker)  # the report reaches the job's rules ...
            cond.notify_all()  # ... which notify, as ElasticJob's handlers do
            return {"ok": True, "worker": worker}

        return check

    with cond:
        held = {w: cond.hold(held_report(w), LONG) for w in ("a", "b")}
        cond.notify_all()
        assert handled == [] and not any(h.answered for h in held.values())
        adopting[0] = False  # the window closes
        cond.notify_all()
    assert sorted(handled) == ["a", "b"]
    assert all(h.answered for h in held.values())
    with cond:
        cond.notify_all()  # nothing is left held to ask again
    assert sorted(handled) == ["a", "b"]


def test_a_check_that_notifies_while_it_waits_does_not_spin_the_wake():
    """A check that notifies and still answers nothing gets a bounded number of asks per wake."""
    job, _ids = job_on({"a": 1}, 1, min_np=1)
    cond = JobCondition()
    cond.watch(job)
    calls = [0]

    def check(final: bool):
        calls[0] += 1
        cond.notify_all()
        return {"ok": True} if final else None

    with cond:
        held = cond.hold(check, LONG)
        cond.notify_all()
    assert not held.answered
    assert 1 <= calls[0] <= MAX_WAKE_PASSES
