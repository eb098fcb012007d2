"""A worker that has heard nothing from its driver for longer than the heartbeat timeout waits for a current view
before each collective (``DriverLinkMixin.await_current_view``). It said so at every collective: dozens of lines a
second while a restarted driver was away, the same silence each time. Now once a silence, and not at all once the
driver counts as lost (training on without it is the grace's business; the wait ended at once there anyway)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from cloud_elastic.worker.context import WorkerContext
from cloud_elastic.worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(30)


def _silent_worker() -> WorkerContext:
    ctx = WorkerContext(WorkerSettings(
        standalone=False, driver_address="127.0.0.1:1", store_address="127.0.0.1:1", job_id="quiet",
        worker_id="w0", secret="s" * 64, backend="gloo", malloc_tuning=False,
    ))
    ctx._heartbeat = threading.Thread(target=lambda: None)  # never started: not alive, so nothing is waited for
    ctx.view_as_of = time.monotonic() - 10 * ctx.heartbeat_timeout_s  # the last answer, long ago
    return ctx


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no word from the driver" in r.getMessage()]


def test_a_silence_is_warned_once_however_many_collectives_wait_in_it(caplog):
    ctx = _silent_worker()
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            ctx.await_current_view()
        assert len(_warnings(caplog)) == 1
        ctx.view_as_of = time.monotonic() - 10 * ctx.heartbeat_timeout_s + 1  # heard once, then a new silence
        ctx.await_current_view()
        ctx.await_current_view()
        assert len(_warnings(caplog)) == 2


def test_no_warning_once_the_driver_counts_as_lost(caplog):
    ctx = _silent_worker()
    ctx.driver_lost = True
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            ctx.await_current_view()
    assert _warnings(caplog) == []
