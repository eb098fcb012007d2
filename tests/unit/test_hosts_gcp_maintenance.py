"""A notice its metadata watcher still reports does not lapse once the host's workers have left with the watcher.

GCE's TERMINATE_ON_HOST_MAINTENANCE comes up to an hour before the VM is stopped, often with no time; the GCP
watcher re-sends it every 30 s while it lasts. On a statically listed host (no instance id) the notice lapsed
2 minutes after the workers left, so a new worker went there, its watcher reported the notice at once, and it
drained again at its next commit: a membership change every few minutes for the whole hour.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.hosts import GIVEN_BACK_GRACE_S, MAX_NOTICE_LEAD_S, Slot
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.notices.api import NOTICE_GRACE_S, SOURCE_AWS, SOURCE_AZURE, SOURCE_GCP
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
    """b's workers leave at their commit; the driver releases the host (and its watcher is gone with them)."""
    for w in job.workers.values():
        if w.slot.host == "b":
            w.state = S.EXITED
    leavers.release_drained(at, rollback_pending=False)


def takes_a_worker(job: FakeJob, at: float, snapshot: DiscoveredHosts = STATIC) -> bool:
    job.hosts.update(snapshot, at)
    return B0 in job.hosts.available_slots(at)


def listed(instance: str, slots: int = 1) -> DiscoveredHosts:
    """A group that lists b as the instance ``instance``."""
    return DiscoveredHosts(ready={"a": 1, "b": slots}, instances={"a": "i-a", "b": instance})


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


def test_another_instance_at_the_address_takes_workers_once_the_notice_lapses_as_usual() -> None:
    """The maintenance was the old VM's: a new one at the address (a recreated VM) inherits none of it."""
    job = FakeJob(2, min_np=1, max_np=4)
    job.hosts.update(listed("i-old"), T0)
    leavers = Leavers(job)
    job.worker("b", 0, S.RUNNING, round_=1, rank=1)
    leavers.notice("b", MAINTENANCE, T0, source=SOURCE_GCP, watcher="b[0]")
    leavers.notice("b", MAINTENANCE, T0 + 30, source=SOURCE_GCP, watcher="b[0]")  # re-sent: still pending
    worker_leaves(job, leavers, T0 + 40)
    assert not takes_a_worker(job, T0 + 290, listed("i-old"))
    assert takes_a_worker(job, T0 + 300, listed("i-new"))  # past the usual lapse (T0 + 150)


@pytest.mark.parametrize(("source", "drain"), [
    (SOURCE_AWS, Drain(T0 + 120, "Spot instance-action terminate at 2026-11-30T01:02:00Z")),
    (SOURCE_AZURE, Drain(T0 + 300, "Azure scheduled event Terminate 602d9444-d2cd-49c7-8624-8643e7171297")),
    (SOURCE_GCP, Drain(T0 + 30, "GCE preemption (instance/preempted is TRUE)")),
], ids=["aws-spot", "azure-terminate", "gcp-preemption"])
def test_a_notice_the_next_watcher_reported_again_lapses_as_before(source: str, drain: Drain) -> None:
    """b[0]'s watcher reports it, b[0] leaves, b[1]'s watcher takes over and reports it anew: no re-send, so once
    the host is given back the notice lapses as for any host given back (not an hour later)."""
    job = FakeJob(3, min_np=1, max_np=4)
    job.hosts.update(listed("i-b", slots=2), T0)
    leavers = Leavers(job)
    for i in (0, 1):
        job.worker("b", i, S.RUNNING, round_=1, rank=1 + i)
    leavers.notice("b", drain, T0, source=source, watcher="b[0]")
    leavers.notice("b", drain, T0 + 8, source=source, watcher="b[1]")
    worker_leaves(job, leavers, T0 + 13)
    lapse = drain.deadline + NOTICE_GRACE_S + GIVEN_BACK_GRACE_S
    assert not takes_a_worker(job, lapse - 1, listed("i-b", slots=2))
    assert takes_a_worker(job, lapse, listed("i-b", slots=2))


@pytest.mark.parametrize(("watchers", "held"), [(("b[0]", "b[1]"), False), (("b[0]", "b[1]", "b[1]"), True)],
                         ids=["next-watcher-only", "next-watcher-re-sent"])
def test_a_maintenance_notice_is_re_sent_only_by_the_same_watcher(watchers: tuple[str, ...], held: bool) -> None:
    """b[1]'s watcher took over from b[0]'s and reported it anew: that alone lapses as before, 2 minutes after;
    once b[1]'s watcher re-sent it (30 s later), it is still pending and holds."""
    two = DiscoveredHosts(ready={"a": 1, "b": 2})
    job = FakeJob(3, min_np=1, max_np=4)
    job.hosts.update(two, T0)
    leavers = Leavers(job)
    for i in (0, 1):
        job.worker("b", i, S.RUNNING, round_=1, rank=1 + i)
    for at, watcher in zip((T0, T0 + 8, T0 + 38), watchers):
        leavers.notice("b", MAINTENANCE, at, source=SOURCE_GCP, watcher=watcher)
    worker_leaves(job, leavers, T0 + 40)
    assert takes_a_worker(job, T0 + 38 + NOTICE_GRACE_S, two) is not held
