"""A local worker whose training function returned leaves its exit code in the job's directory as it exits; a driver
restarted after it exited reads it (s1 with only rank 0 saving: rank 1 had exited, 'did not come back', and the job
failed though every script exited 0)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cloud_elastic.driver.restart.record import exit_reports, remove_record
from cloud_elastic.protocol_reports import ExitingReport
from cloud_elastic.records import job_dir, write_driver_record
from cloud_elastic.worker.link.driver_link import DriverLinkMixin

pytestmark = pytest.mark.timeout(30)  # may import torch (conftest)


class _Link(DriverLinkMixin):
    _uncaught = None

    def __init__(self, worker_id: str, rank: int, done: bool = True) -> None:
        self.worker_id = worker_id
        self.settings = SimpleNamespace(job_id="j1")
        self.info = SimpleNamespace(round=3, rank=rank)
        self.training_done = done


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    write_driver_record("j1", "127.0.0.1:1", "s")
    return job_dir("j1")


def test_what_completed_workers_leave_is_what_the_restarted_driver_reads(runtime) -> None:
    _Link("localhost[1]#2", 1)._leave_exit_report(ExitingReport(0))
    _Link("localhost[2]#3", 2)._leave_exit_report(ExitingReport(2, "x"))
    _Link("localhost[3]#4", 3, done=False)._leave_exit_report(ExitingReport(0))  # still training: leaves nothing
    (runtime / ".exit-bad.json").write_text("{not json")
    (runtime / ".exit-big.json").write_text(json.dumps({"v": 1, "round": 3, "rank": 5, "code": 0, "pad": "x" * 9000}))
    assert exit_reports("j1", 3) == {1: ("localhost[1]#2", 0), 2: ("localhost[2]#3", 2)}
    assert exit_reports("j1", 4) == {}, "a report of another round counts for nothing"
    remove_record(runtime)
    assert not list(runtime.glob(".exit-*")), "the driver's end leaves no report behind"


def test_no_report_where_the_driver_keeps_no_record(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # a remote host: no driver record there
    _Link("h[1]#2", 1)._leave_exit_report(ExitingReport(0))
    assert not list(tmp_path.rglob("*"))
