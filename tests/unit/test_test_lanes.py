"""scripts/run_tests.py: which lane a test runs in, how the caller's arguments are read, how lanes are summed."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_tests", REPO / "scripts" / "run_tests.py")
run_tests = sys.modules["run_tests"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_tests)


def test_every_test_directory_is_in_exactly_one_lane():
    chosen = run_tests.lanes()
    dirs = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    owners = [{p for p in lane.paths if p.startswith("tests/") and p.count("/") == 1} for lane in chosen]
    # tests/gpu* are run on a GPU machine by hand, not by ./dev test (as before lanes).
    assert dirs - {d for d in dirs if d.startswith("tests/gpu")} == set().union(*owners)
    assert sum(len(o) for o in owners) == len(set().union(*owners)), owners


def test_a_fast_lane_file_that_runs_a_job_is_moved_to_the_jobs_lane():
    """Real jobs (the integration harness's Job) compete for the CPU: one at a time, in the jobs lane."""
    starts_jobs = re.compile(r"\bJob\(|\bjobs\(\[")
    fast = [lane for lane in run_tests.lanes() if lane.name == "fast"][0]
    offenders = []
    for directory in (p for p in fast.paths if p.startswith("tests/")):
        for path in sorted((REPO / directory).rglob("test_*.py")):
            rel = path.relative_to(REPO).as_posix()
            if starts_jobs.search(path.read_text()) and rel not in run_tests.JOB_FILES:
                offenders.append(rel)
    assert offenders == [], "add them to JOB_FILES in scripts/run_tests.py"
    for rel in run_tests.JOB_FILES:
        assert (REPO / rel).is_file() and f"--ignore={rel}" in fast.paths


def test_test_paths_among_the_arguments_mean_plain_pytest():
    assert run_tests.picks_tests(["tests/unit", "-x"])
    assert run_tests.picks_tests(["tests/unit/test_job.py::test_nothing", "-q"])
    assert not run_tests.picks_tests(["-q", "-ra"])
    assert not run_tests.picks_tests(["-k", "tests", "-m", "not ray"])  # option values are not paths
    assert not run_tests.picks_tests(["--timeout", "60", "-x"])


def test_lane_summaries_are_summed_into_one_closing_line(capsys):
    class Done:
        def __init__(self, rc):
            self.returncode = rc

    lanes = [run_tests.Lane("jobs", ()), run_tests.Lane("fast", ())]  # a lane of each outcome is enough
    lanes[0].proc, lanes[0].lines = Done(1), ["...", "FAILED tests/integration/test_x.py::test_y - AssertionError: z",
                                              "=== 1 failed, 90 passed, 2 skipped in 500.00s (0:08:20) ==="]
    lanes[1].proc, lanes[1].lines = Done(0), ["1300 passed, 3 skipped, 1 warning in 100.0s"]
    assert run_tests.report(lanes) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "total: 1390 passed, 1 failed, 5 skipped"
    assert "lane jobs: exit 1" in "\n".join(out) and "failed lanes: jobs" in out
    # the failed test is named again at the end, under its lane's line
    assert "  jobs: FAILED tests/integration/test_x.py::test_y - AssertionError: z" in out

    lanes[0].proc, lanes[0].lines = Done(2), ["INTERNALERROR> boom"]
    assert run_tests.report(lanes) == 1  # a lane without a summary line fails the run
    lanes[0].proc, lanes[0].lines = Done(0), ["90 passed in 5s"]
    assert run_tests.report(lanes) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "total: 1390 passed, 0 failed, 3 skipped"
