"""A restarted driver does not wait out its adoption window for a local worker whose process had already ended.

The window (two heartbeat timeouts) waited its full length for every recorded worker: after the machine rebooted,
or with a worker that died beside its driver, a restarted driver sat through it for workers that could not come
back (h13, session 73). A local worker is recorded with its pid and start time: no process of that pid, or another
one started since, is a worker gone. Here the window is 60 s and the test's bound 30 s: before the fix it timed out.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cloud_elastic.control import new_secret
from cloud_elastic.driver.launch.local import process_start_time
from cloud_elastic.driver.restart.record import AdoptedWorker, AdoptionRecord
from cloud_elastic.driver.restart.window import AdoptionWindow, ended_locally
from cloud_elastic.protocol import AdoptRequest, RankInfo
from tests.unit.test_adopt_keeps_notices import restarted_job

pytestmark = pytest.mark.timeout(30)


def _gone_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("gone", ["no such pid", "another process at the pid"])
def test_a_local_worker_whose_process_ended_is_not_waited_for_and_is_named(gone) -> None:
    job, cond, plane = restarted_job(time.monotonic)
    pid, start = (_gone_pid(), None) if gone == "no such pid" else (os.getpid(), process_start_time(os.getpid()) + 1)
    alive = {"kind": "local", "pid": os.getpid(), "start": process_start_time(os.getpid())}
    workers = (AdoptedWorker("a[0]#1", "a", 0, 1, alive),
               AdoptedWorker("b[0]#2", "b", 0, 2, {"kind": "local", "pid": pid, "start": start}))
    assert ended_locally(workers) == {"b[0]#2": pid}
    secret = new_secret()
    record = AdoptionRecord("t", "", "127.0.0.1", "127.0.0.1", 1, 2, 60.0, 2, workers, secret)
    window = AdoptionWindow(record, job, cond, rules=plane.by_rules, clock=time.monotonic,
                            started_at=time.monotonic(), heartbeat_timeout_s=30.0, rendezvous_hold_s=10.0)
    window.open()
    request = AdoptRequest(1, RankInfo(0, 2, 0, 1, 0, 2), 1, 1, 0, 5, 0, 100, 5, 0.0)
    with cond:  # as the control plane calls it
        assert window.intercept("adopt", "a[0]#1", dict(request.to_wire(), worker="a[0]#1")) == {"ok": True}
    closed = window.wait(lambda: False)  # before the fix: 60 s, past this test's bound
    assert [w.worker_id for w in closed.adopted] == ["a[0]#1"]
    assert [w.worker_id for w in closed.missing] == ["b[0]#2"]
    # Rank 1 cannot come back: the adopted round is incomplete, and the reason names why.
    assert job.last_failure == (f"round 1 is incomplete after the driver restart (not back: b[0]#2 its process "
                                f"(pid {pid}) had ended when the window's wait began)"), job.last_failure
