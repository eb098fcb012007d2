"""A notice its metadata watcher still reports does not lapse once the host's workers have left with the watcher.

GCE's TERMINATE_ON_HOST_MAINTENANCE comes up to an hour before the VM is stopped, often with no time; the GCP
watcher re-sends it every 30 s while it lasts. On a statically listed host (no instance id) the notice lapsed
2 minutes after the workers left, so a new worker went there, its watcher reported the notice at once, and it
drained again at its next commit: a membership change every few minutes for the whole hour.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.hosts import MAX_NOTICE_LEAD_S, Slot
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.notices.api import NOTICE_GRACE_S, SOURCE_GCP
from cloud_elastic.providers.api import DiscoveredHosts, Drain
from tests.unit.job_view import T0, FakeJob, S

pytestmark = pytest.mark.timeout(30)  # the first test may import torch (conftest)

MAINTENANCE = Drain(None, "GCE host maintenance: TERMINATE_ON_HOST_MAINTENANCE (the VM will be stopped)")
STATIC = DiscoveredHosts(ready={"a": 1, "b": 1})  # -H a:1,b:1: no instance ids
B0 = Slot("b", 0)


def job_on_static_hosts() -> tuple[FakeJob, Leavers]:
    job = FakeJob(2, min_np=1, max_np=4)
    job.hosts.update(STATIC, T0)
    return job, Leavers(job)


def worker_leaves(job: FakeJob, leavers: Leavers, at: float) -> None:
    """b's worker leaves at its commit; the driver releases the host (and its watcher is gone with it)."""
    for w in job.workers.values():
        if w.slot == B0:
            w.state = S.EXITED
    leavers.release_drained(at, rollback_pending=False)


def takes_a_worker(job: FakeJob, at: float) -> bool:
    job.hosts.update(STATIC, at)
    return B0 in job.hosts.available_slots(at)


def test_a_maintenance_notice_re_sent_until_the_workers_left_keeps_the_static_host_drained() -> None:
    job, leavers = job_on_static_hosts()
    job.worker("b", 0, S.RUNNING, round_=1, rank=1)
    assert leavers.notice("b", MAINTENANCE, T0, source=SOURCE_GCP)
    assert not leavers.notice("b", MAINTENANCE, T0 + 30, source=SOURCE_GCP)  # re-sent: still pending
    worker_leaves(job, leavers, T0 + 40)
    for later in (T0 + 30 + NOTICE_GRACE_S, T0 + 600, T0 + 1800, T0 + 30 + MAX_NOTICE_LEAD_S + NOTICE_GRACE_S - 1):
        assert not takes_a_worker(job, later), f"{later - T0:.0f}s after the notice"
    # Bounded: an hour is the longest GCE warns ahead, so the host may be tried again (a watcher there
    # reports the notice at once if the maintenance is still pending).
    assert takes_a_worker(job, T0 + 30 + MAX_NOTICE_LEAD_S + NOTICE_GRACE_S)


def test_workers_that_left_before_the_first_re_send_drain_the_host_once_more_at_most() -> None:
    job, leavers = job_on_static_hosts()
    job.worker("b", 0, S.RUNNING, round_=1, rank=1)
    leavers.notice("b", MAINTENANCE, T0, source=SOURCE_GCP)
    worker_leaves(job, leavers, T0 + 5)  # a job that commits every few seconds
    assert takes_a_worker(job, T0 + NOTICE_GRACE_S)  # nothing says it is still pending: it lapses as before
    leavers.release_drained(T0 + NOTICE_GRACE_S, rollback_pending=False)  # the driver's next tick
    job.worker("b", 0, S.RUNNING, round_=2, rank=1)  # placed there again; its watcher reports it at once
    assert leavers.notice("b", MAINTENANCE, T0 + 125, source=SOURCE_GCP)
    worker_leaves(job, leavers, T0 + 130)
    for later in (T0 + 125 + NOTICE_GRACE_S, T0 + 900, T0 + 2400):
        assert not takes_a_worker(job, later), f"{later - T0:.0f}s after the notice"


def test_a_notice_the_watcher_stopped_re_sending_while_the_workers_stay_lapses_its_grace_after_the_last() -> None:
    job, leavers = job_on_static_hosts()
    job.worker("b", 0, S.RUNNING, round_=1, rank=1)  # commits every few minutes: still there
    leavers.notice("b", MAINTENANCE, T0, source=SOURCE_GCP)
    leavers.notice("b", MAINTENANCE, T0 + 30, source=SOURCE_GCP)
    # maintenance-event back to NONE: no more re-sends
    assert not takes_a_worker(job, T0 + 30 + NOTICE_GRACE_S - 1)
    assert takes_a_worker(job, T0 + 30 + NOTICE_GRACE_S)


def test_a_pending_notice_goes_with_its_host_and_one_that_comes_back_starts_afresh() -> None:
    job, leavers = job_on_static_hosts()
    job.worker("b", 0, S.RUNNING, round_=1, rank=1)
    leavers.notice("b", MAINTENANCE, T0, source=SOURCE_GCP)
    leavers.notice("b", MAINTENANCE, T0 + 30, source=SOURCE_GCP)
    worker_leaves(job, leavers, T0 + 40)
    job.hosts.update(DiscoveredHosts(ready={"a": 1}), T0 + 50)  # b left discovery (a script, a group)
    assert "b" not in job.hosts.notices
    assert takes_a_worker(job, T0 + 60)  # back: no notice
    leavers.notice("b", MAINTENANCE, T0 + 70, source=SOURCE_GCP)  # its first report since it came back
    worker_leaves(job, leavers, T0 + 75)
    assert takes_a_worker(job, T0 + 70 + NOTICE_GRACE_S)


@pytest.mark.parametrize(("source", "reports"), [("sigterm", 2), ("aws-imds", 1)])
def test_notices_no_watcher_re_sent_lapse_as_before_on_a_static_host(source: str, reports: int) -> None:
    """Two workers' SIGTERMs are no re-send, nor is a Spot notice its watcher reported once."""
    job, leavers = job_on_static_hosts()
    job.worker("b", 0, S.RUNNING, round_=1, rank=1)
    for i in range(reports):
        leavers.notice("b", Drain(T0 + 30, "interruption"), T0 + i, source=source)
    worker_leaves(job, leavers, T0 + 10)
    assert not takes_a_worker(job, T0 + 30 + NOTICE_GRACE_S - 1)
    assert takes_a_worker(job, T0 + 30 + NOTICE_GRACE_S)
