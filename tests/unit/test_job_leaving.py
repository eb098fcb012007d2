"""Leaving hosts on their own (cloud_elastic.driver.job.leaving): notices, draining, deadlines, release."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.actions import Phase, Release, Stop
from cloud_elastic.driver.job.hosts import GIVEN_BACK_GRACE_S, Slot
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from tests.unit.job_view import T0, FakeJob, S

pytestmark = pytest.mark.timeout(30)  # the first test may import torch (conftest)


def on_hosts(**ready: int) -> tuple[FakeJob, Leavers]:
    job = FakeJob(2, min_np=1, max_np=4)
    job.hosts.update(DiscoveredHosts(ready=ready), T0)
    job.phase, job.round = Phase.RUNNING, 1
    return job, Leavers(job)


def test_a_hard_notice_drains_the_hosts_members_and_sends_the_others_away() -> None:
    job, leavers = on_hosts(a=3, b=1)
    member = job.worker("a", 0, S.RUNNING, round_=1, rank=0)
    waiting = job.worker("a", 1, S.WAITING)
    starting = job.worker("a", 2, S.STARTING)
    other = job.worker("b", 0, S.RUNNING, round_=1, rank=1)
    assert leavers.notice("a", Drain(deadline=None, reason="spot interruption"), T0, source="aws")
    assert job.kinds() == ["notice"] and job.events[0][1]["action"] == "drain"
    assert leavers.sources == {"a": "aws"}
    leavers.mark()
    assert member.state is S.DRAINING and "spot interruption" in member.why  # leaves at its next commit
    assert waiting.state is S.EXITING and starting.state is S.EXITING
    # Not at rendezvous yet, it would get no exit order soon: it is stopped. (The waiting worker is
    # stopped too, although its exit order is on its way: see the report of issue 25.)
    assert starting.worker_id in [a.worker_id for a in job.actions]
    assert other.state is S.RUNNING
    assert leavers.members_may_drain(1) and not leavers.members_may_drain(2)


def test_a_notice_is_news_once_and_a_soft_one_only_keeps_new_workers_off() -> None:
    job, leavers = on_hosts(a=1)
    w = job.worker("a", 0, S.RUNNING, round_=1, rank=0)
    assert leavers.notice("a", Drain(deadline=None, reason="rebalance"), T0, source="aws", soft=True)
    assert not leavers.notice("a", Drain(deadline=None, reason="rebalance"), T0 + 1, source="aws", soft=True)
    assert job.events[0][1]["soft"] is True and job.events[0][1]["action"] == "no new workers"
    leavers.mark()
    assert w.state is S.RUNNING
    leavers.lapsed("a")
    assert leavers.sources == {}


def test_marking_skips_its_scan_until_a_host_changes_or_a_worker_is_born() -> None:
    job, leavers = on_hosts(a=1, b=1)
    leavers.mark()
    late = job.worker("b", 0, S.RUNNING, round_=1, rank=0)
    job.hosts.update(DiscoveredHosts(ready={"a": 1}), T0)  # b left the group
    leavers.mark()
    assert late.state is S.DRAINING and "left the group" in late.why


def test_a_leaver_still_in_its_round_near_the_deadline_is_removed_by_force_and_not_blacklisted() -> None:
    job, leavers = on_hosts(a=1, b=1)
    leaver = job.worker("a", 0, S.RUNNING, round_=1, rank=1)
    job.worker("b", 0, S.RUNNING, round_=1, rank=0)
    leavers.notice("a", Drain(deadline=T0 + 30, reason="spot interruption"), T0, source="aws")
    leavers.mark()
    leavers.enforce_deadlines(T0)  # the job steps on the notice: it sees the deadline now
    leavers.enforce_deadlines(T0 + 24.9)  # 5 s margin
    assert leaver.state is S.DRAINING and job.aborts == 0
    leavers.enforce_deadlines(T0 + 25)
    assert leaver.state is S.LOST and job.aborts == 1
    assert job.actions == [Stop(leaver.worker_id, leaver.why, immediate=True)]
    failed = dict(job.events)["worker_failed"]
    assert failed["blacklisted_s"] is None and "removed by force" in failed["reason"]
    assert job.last_failure.startswith(f"worker {leaver.worker_id}")


@pytest.mark.parametrize("lead", [-3.0, 7.0])
def test_a_deadline_past_or_close_when_it_arrives_leaves_a_margin_to_reach_a_commit(caplog, lead) -> None:
    # A pod's SIGTERM deadline or a cloud's notice time read on a clock a few seconds ahead of the driver's.
    caplog.set_level("WARNING", logger="cloud_elastic")
    job, leavers = on_hosts(a=1, b=1)
    leaver = job.worker("a", 0, S.RUNNING, round_=1, rank=1)
    job.worker("b", 0, S.RUNNING, round_=1, rank=0)
    leavers.notice("a", Drain(deadline=T0 + lead, reason="SIGTERM"), T0, source="sigterm")
    leavers.mark(T0)
    leavers.enforce_deadlines(T0)
    assert leaver.state is S.DRAINING and job.aborts == 0  # it leaves at its next commit, with no rollback
    leavers.enforce_deadlines(T0 + 4.9)  # a 5 s margin
    assert leaver.state is S.DRAINING and job.aborts == 0
    leavers.enforce_deadlines(T0 + 5)  # still in its round: the margin is a bound
    assert leaver.state is S.LOST and job.aborts == 1
    assert "after the driver learned of its host's deadline (SIGTERM), which was past or close" in leaver.why
    said = "already 3.0s past" if lead < 0 else "only 7.0s ahead"
    assert any(f"host a's deadline (SIGTERM) was {said} when the driver learned of it" in r.getMessage()
               for r in caplog.records), caplog.text


def test_a_drained_host_is_released_once_when_no_worker_is_left_on_it() -> None:
    job, leavers = on_hosts(a=1, b=1)
    w = job.worker("a", 0, S.RUNNING, round_=1, rank=0)
    leavers.notice("a", Drain(deadline=None, reason="scale-in"), T0, source="provider")
    leavers.release_drained(T0, rollback_pending=False)
    assert not job.actions  # its worker is still there
    w.state = S.EXITED
    leavers.release_drained(T0 + 1, rollback_pending=False)
    leavers.release_drained(T0 + 2, rollback_pending=False)
    assert job.actions == [Release("a", None)]


@pytest.mark.parametrize("soft", [False, True])
def test_a_host_released_for_a_hard_notice_waits_longer_to_take_a_worker_while_its_instance_is_listed(
        soft: bool) -> None:
    job, leavers = on_hosts(a=1, b=1)
    job.hosts.drain_soft = soft  # --drain-on-rebalance: a soft notice drains too, but is no termination
    pods = DiscoveredHosts(ready={"a": 1, "b": 1}, instances={"a": "pa/1/0", "b": "pb/2/0"})
    job.hosts.update(pods, T0)
    w = job.worker("a", 0, S.RUNNING, round_=1, rank=0)
    leavers.notice("a", Drain(deadline=T0 + 30, reason="why"), T0, source="sigterm", soft=soft)
    w.state = S.EXITED  # it left at a commit
    leavers.release_drained(T0 + 1, rollback_pending=False)
    assert job.actions == [Release("a", "pa/1/0")]
    later = T0 + 30 + 120 + GIVEN_BACK_GRACE_S - 1  # past the usual lapse (deadline + notice grace)
    lapsed = job.hosts.update(pods, later).lapsed
    assert lapsed == (("a",) if soft else ())
    assert (Slot("a", 0) in job.hosts.available_slots(later)) is soft


def test_a_forced_drain_waits_for_the_rollback_to_say_the_steps_lost() -> None:
    job, leavers = on_hosts(a=1, b=1)
    job.worker("a", 0, S.RUNNING, round_=1, rank=1)
    leavers.notice("a", Drain(deadline=T0 + 30, reason="spot interruption"), T0, source="aws")
    leavers.mark()
    leavers.enforce_deadlines(T0)
    leavers.enforce_deadlines(T0 + 25)
    leavers.release_drained(T0 + 25, rollback_pending=True)
    lines = leavers.take_forced_drains()
    assert len(lines) == 1 and "host a drained (spot interruption, notice from aws)" in lines[0]
    assert leavers.take_forced_drains() == []
