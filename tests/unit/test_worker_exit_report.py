"""What a worker tells its driver of its exit code as it exits (``exiting``): all a driver that adopted it learns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol_reports import MAX_ERROR_LINE, ExitingReport
from cloud_elastic.worker.link import driver_link
from cloud_elastic.worker.link.driver_link import DriverLinkMixin

pytestmark = pytest.mark.timeout(30)  # may import torch (conftest)


class _Link(DriverLinkMixin):
    _uncaught = None


@pytest.fixture
def link(monkeypatch):
    monkeypatch.delattr(sys, "last_value", raising=False)
    monkeypatch.setattr(driver_link, "_script_exit_code", None)
    return _Link()


def test_an_ending_whose_code_is_not_certain_says_none_never_0(link) -> None:
    """A plain interpreter shows no exit hook a top-level ``raise SystemExit(2)``: a seemingly clean end is unknown
    (it said 0, and a restarted driver took an adopted worker's ``exit(2)`` for a success)."""
    assert link._exit_report() == ExitingReport(None)
    link._uncaught = RuntimeError("the final save failed")
    assert link._exit_report() == ExitingReport(1, "RuntimeError: the final save failed")


def test_the_code_the_fork_server_saw_is_the_code_it_says(link) -> None:
    driver_link.note_exit_code(2)
    assert link._exit_report() == ExitingReport(2)
    driver_link.note_exit_code(0)
    assert link._exit_report() == ExitingReport(0)


ENDINGS = {
    "raise SystemExit(2)": 2, "exit(2)": 2, "from sys import exit as leave\nleave(2)": 2, "import sys\nsys.exit(3)": 3,
    "import sys\nsys.exit(256)": 0, "import sys\nsys.exit('bad')": 1, "import sys\nsys.exit()": 0, "pass": 0,
    "raise RuntimeError('x')": 1,
}


def test_the_fork_server_tells_the_worker_library_the_code_of_every_ending(tmp_path) -> None:
    """Each script ends as written, run as the fork server runs a worker (run_main): the code noted for the worker
    library's ``exiting`` message is the process's real exit status, however the script ended."""
    for i, text in enumerate(ENDINGS):
        (tmp_path / f"s{i}.py").write_text(text + "\n")
    runner = (
        "import json, os, sys\n"
        "import cloud_elastic.worker.link.driver_link as link\n"
        "from cloud_elastic.driver.launch.forkserver_child import run_main\n"
        "sys.excepthook = lambda *a: None\n"
        "seen = []\n"
        f"for i in range({len(ENDINGS)}):\n"
        "    link._script_exit_code = None\n"
        "    try:\n"
        "        run_main({'script': f's{i}.py', 'args': []})\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    seen.append(link._script_exit_code)\n"
        "sys.stdout.write(json.dumps(seen))\n"
    )
    out = subprocess.run([sys.executable, "-c", runner], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])), check=True)
    assert dict(zip(ENDINGS, json.loads(out.stdout.splitlines()[-1]))) == ENDINGS


def test_an_exiting_report_round_trips_and_a_malformed_one_names_the_field() -> None:
    report = ExitingReport(1, "RuntimeError: x")
    assert ExitingReport.from_wire(report.to_wire()) == report
    assert ExitingReport.from_wire({}) == ExitingReport(None)  # an older worker says nothing
    assert len(ExitingReport.from_wire({"code": 1, "error": "x" * 10_000}).error) == MAX_ERROR_LINE
    for bad in ({"code": "1"}, {"code": True}, {"code": 1 << 40}):
        with pytest.raises(ControlPlaneError, match="'code'"):
            ExitingReport.from_wire(bad)
