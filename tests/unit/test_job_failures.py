"""What a failure costs, on its own (cloud_elastic.driver.job.failures)."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.actions import Phase, Stop
from cloud_elastic.driver.job.failures import Failures
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.providers.api import DiscoveredHosts
from tests.unit.job_view import T0, FakeJob, S

pytestmark = pytest.mark.timeout(30)  # the first test may import torch (conftest)


def failures(**policy) -> tuple[FakeJob, Failures, list]:
    job = FakeJob(2, min_np=1, **policy)
    job.hosts.update(DiscoveredHosts(ready={"a": 2, "b": 1}), T0)
    job.phase, job.round = Phase.RUNNING, 1
    leavers: list = []
    return job, Failures(job, lambda w, what, now: not leavers.append((w.worker_id, what))), leavers


def test_a_members_failure_blacklists_its_slot_and_aborts_the_round() -> None:
    job, fail, _ = failures()
    w = job.worker("a", 1, S.EXITED, round_=1, rank=1)
    job.worker("a", 0, S.RUNNING, round_=1, rank=0)
    fail.fail(w, "exited with code 1", T0, was_member=True, transport=False, exit_code=1)
    assert job.hosts.blacklist.blocked(Slot("a", 1), T0) and not job.hosts.blacklist.blocked(Slot("a", 0), T0)
    assert job.aborts == 1 and job.last_failure == f"worker {w.worker_id} (rank 1) exited with code 1"
    event = dict(job.events)["worker_failed"]
    assert (event["exit_code"], event["blacklisted_s"], event["whole_host"]) == (1, 10.0, False)


def test_an_unreachable_host_blacklists_every_slot_once_and_a_signal_is_named() -> None:
    job, fail, _ = failures()
    w = job.worker("a", 0, S.EXITED)
    job.worker("b", 0, S.RUNNING)
    fail.fail(w, "host unreachable", T0, was_member=False, transport=True, exit_code=-9)
    assert all(job.hosts.blacklist.blocked(Slot("a", i), T0) for i in (0, 1))
    event = dict(job.events)["worker_failed"]
    assert event["exit_code"] is None and event["signal"] == "SIGKILL" and event["whole_host"] is True
    assert job.aborts == 0 and job.outcome is None


def test_the_last_worker_failing_ends_the_job_unless_a_checkpoint_can_bring_the_state_back() -> None:
    job, fail, _ = failures()
    job.state_committed = True
    fail.fail(job.worker("a", 0, S.EXITED), "exited with code 1", T0, was_member=False, transport=False)
    assert "all workers failed; last: worker a[0]#1" in job.outcome.reason and "no --checkpoint-dir" in job.outcome.reason
    job, fail, _ = failures(checkpointing=True)
    job.state_committed = True
    fail.fail(job.worker("a", 0, S.EXITED), "exited with code 1", T0, was_member=False, transport=False)
    assert job.outcome is None


def test_a_leaver_given_up_costs_a_rollback_but_no_blacklisting() -> None:
    job, fail, leavers = failures()
    w = job.worker("a", 0, S.DRAINING, round_=1, rank=0)
    fail.give_up(w, "stopped answering heartbeats for 6.0s", T0)
    assert w.state is S.LOST and job.actions == [Stop(w.worker_id, "stopped answering heartbeats for 6.0s", True, stacks=True)]
    assert leavers == [(w.worker_id, "stopped answering heartbeats for 6.0s")] and job.aborts == 1
    assert not job.hosts.blacklist.blocked(Slot("a", 0), T0)


def test_the_state_is_lost_at_once_without_a_holder_or_a_checkpoint() -> None:
    job, fail, _ = failures()
    job.state_committed = True
    job.worker("a", 0, S.WAITING)  # never committed
    fail.check_state_kept()
    assert "training state lost: every worker that held committed state is gone" in job.outcome.reason
    job, fail, _ = failures(checkpointing=True)
    job.state_committed = True
    job.worker("a", 0, S.WAITING)
    fail.check_state_kept()
    assert job.outcome is None  # the next round loads the latest checkpoint


def test_a_host_not_reachable_before_the_first_round_is_marked_booting_and_one_after_it_is_not() -> None:
    job, fail, _ = failures()
    job.round = 0
    fail.fail(job.worker("a", 0, S.EXITED), "host unreachable", T0, was_member=False, transport=True)
    assert dict(job.events)["worker_failed"]["booting"] is True
    job.round = 1
    fail.fail(job.worker("b", 0, S.EXITED), "host unreachable", T0, was_member=False, transport=True)
    assert "booting" not in job.events[-1][1]
