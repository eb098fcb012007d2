"""Who watches a host's metadata notices, and what a notice does (cloud_elastic.driver.job.notice_policy)."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.notice_policy import (
    STAYS_ON_SIGTERM,
    NoticeAction,
    WatcherChoice,
    host_vacated,
    notice_action,
    notice_watcher,
    watched_cloud,
)
from tests.unit.job_view import FakeJob, S

pytestmark = pytest.mark.timeout(10)


def test_the_cloud_watched_is_the_flags_or_with_auto_the_providers_when_it_has_notices() -> None:
    assert watched_cloud("auto", "aws") == "aws" and watched_cloud("auto", "azure") == "azure"
    assert watched_cloud("auto", "static") is None and watched_cloud("auto", "kubernetes") is None
    assert watched_cloud("none", "aws") is None and watched_cloud("gcp", "static") == "gcp"


def test_one_watcher_per_host_the_first_live_worker_then_whoever_asks_after_it_goes() -> None:
    job = FakeJob()
    first, second = job.worker("h", 0, S.RUNNING), job.worker("h", 1, S.RUNNING)
    assert notice_watcher("aws", first, None) == WatcherChoice("aws", takes_over=True)
    assert notice_watcher("aws", first, first) == WatcherChoice("aws")
    assert notice_watcher("aws", second, first) == WatcherChoice(None)
    first.state = S.LOST
    assert notice_watcher("aws", second, first) == WatcherChoice("aws", takes_over=True)
    assert notice_watcher("aws", first, second) == WatcherChoice(None)  # a dead worker watches nothing
    assert notice_watcher(None, second, None) == WatcherChoice(None)  # nothing to watch
    assert notice_watcher("aws", None, None) == WatcherChoice(None)  # not a worker of the job


def test_a_leaving_watcher_hears_its_host_vacated_only_once_every_other_worker_there_exited() -> None:
    """Its acknowledgement lets Azure evict the VM: not while rank 0 still writes the last checkpoint."""
    job = FakeJob()
    rank0, watcher = job.worker("h", 0, S.EXITING), job.worker("h", 1, S.EXITING)
    elsewhere = job.worker("g", 0, S.RUNNING)
    assert not host_vacated(watcher, job.workers.values())
    rank0.state = S.EXITED
    assert host_vacated(watcher, job.workers.values())  # another host's worker does not count, nor itself
    assert not host_vacated(elsewhere, [elsewhere, job.worker("g", 1, S.DRAINING)])


def test_a_terminate_notice_drains_the_host_and_a_recommendation_drains_it_softly() -> None:
    for state in S:
        assert notice_action("terminate", own=False, state=state, job_over=False) == NoticeAction(True, soft=False)
    assert notice_action("rebalance", own=False, state=S.RUNNING, job_over=False) == NoticeAction(True, soft=True)
    assert notice_action("maintenance", own=False, state=S.RUNNING, job_over=True) == NoticeAction(True, soft=True)


def test_a_workers_own_sigterm_keeps_it_until_the_drain_unless_the_term_was_the_drivers() -> None:
    for state in S:
        action = notice_action("terminate", own=True, state=state, job_over=False)
        if state in STAYS_ON_SIGTERM:
            assert action == NoticeAction(True, soft=False, stay=True)
        else:  # the driver TERMs only workers it no longer wants
            assert action == NoticeAction(False, stay=False)
    assert notice_action("terminate", own=True, state=S.RUNNING, job_over=True) == NoticeAction(False, stay=False)
