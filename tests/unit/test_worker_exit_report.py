"""What a worker tells its driver of its exit code as it exits (``exiting``): all a driver that adopted it learns."""

from __future__ import annotations

import sys

import pytest

from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol_reports import ExitingReport
from cloud_elastic.worker.link.driver_link import DriverLinkMixin

pytestmark = pytest.mark.timeout(30)  # may import torch (conftest)


class _Link(DriverLinkMixin):
    _uncaught = None


@pytest.fixture
def link(monkeypatch):
    monkeypatch.setattr(sys, "exit", sys.exit)  # put back whatever the test wraps
    monkeypatch.delattr(sys, "last_value", raising=False)
    return _Link()


def test_a_clean_end_says_code_0_and_an_uncaught_exception_says_1_with_it(link) -> None:
    assert link._exit_report() == ExitingReport(0)
    link._uncaught = RuntimeError("the final save failed")
    assert link._exit_report() == ExitingReport(1, "RuntimeError: the final save failed")


@pytest.mark.parametrize("arg, code", [(None, 0), (0, 0), (3, 3), (256, 0), (-1, 255), (True, 1), ("bad", 1)])
def test_what_the_script_gives_sys_exit_is_the_code_it_says(link, arg, code) -> None:
    link._note_exit()
    link._note_exit()  # once only: a second adoption does not wrap it again
    with pytest.raises(SystemExit):
        sys.exit(arg)
    assert link._exit_report().code == code


def test_an_exiting_report_round_trips_and_a_malformed_one_names_the_field() -> None:
    report = ExitingReport(1, "RuntimeError: x")
    assert ExitingReport.from_wire(report.to_wire()) == report
    assert ExitingReport.from_wire({}) == ExitingReport(None)  # an older worker says nothing
    assert len(ExitingReport.from_wire({"code": 1, "error": "x" * 10_000}).error) == 300
    for bad in ({"code": "1"}, {"code": True}, {"code": 1 << 40}):
        with pytest.raises(ControlPlaneError, match="'code'"):
            ExitingReport.from_wire(bad)
