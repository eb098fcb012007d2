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


def test_a_fast_lane_file_that_runs_a_job_is_moved_to_the_cloud_jobs_lane():
    """Real jobs (the integration harness's Job) compete for the CPU: not in the fast lane, but in the cloud-jobs lane."""
    starts_jobs = re.compile(r"\bJob\(|\bjobs\(\[")
    fast = [lane for lane in run_tests.lanes() if lane.name == "fast"][0]
    offenders = []
    for directory in (p for p in fast.paths if p.startswith("tests/")):
        for path in sorted((REPO / directory).rglob("test_*.py")):
            rel = path.relative_to(REPO).as_posix()
            if starts_jobs.search(path.read_text()) and rel not in run_tests.JOB_FILES:
                offenders.append(rel)
    assert offenders == [], "add them to JOB_FILES in scripts/run_tests.py"
    cloud_jobs = [lane for lane in run_tests.lanes() if lane.name == "cloud-jobs"][0]
    assert cloud_jobs.after == "fast" and "worksteal" in cloud_jobs.options
    for rel in run_tests.JOB_FILES:  # each runs once: in the cloud-jobs lane, not in the fast or the jobs lane
        assert (REPO / rel).is_file() and f"--ignore={rel}" in fast.paths and rel in cloud_jobs.paths
        for lane in run_tests.lanes():
            if lane.name != "cloud-jobs" and f"--ignore={rel}" not in lane.paths:
                assert not any(rel.startswith(path + "/") or rel == path for path in lane.paths), (lane.name, rel)


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


def test_each_job_worker_starts_with_its_share_of_the_longest_tests_and_every_test_still_runs():
    from tests import lane_order

    ids = [f"t{i}" for i in range(11)]
    longest = {"t9": 100, "t10": 60, "t8": 50, "t1": 45}
    order = lane_order.reorder(ids, 3, longest)
    assert sorted(order) == list(range(11))  # a permutation: nothing dropped, nothing twice
    sizes = lane_order.shares(11, 3)
    assert sizes == [3, 4, 4] and sum(sizes) == 11
    blocks, at = [], 0
    for size in sizes:
        blocks.append([ids[i] for i in order[at: at + size]])
        at += size
    # Longest first, each to the share with the least long work so far: t9 (100) | t10 (60) | t8 + t1 (95).
    assert [b[:2] for b in blocks] == [["t9", "t0"], ["t10", "t3"], ["t8", "t1"]], blocks
    short = [t for b in blocks for t in b if t not in longest]
    assert short == [t for t in ids if t not in longest]  # the others keep their order
    jobs = [lane for lane in run_tests.lanes() if lane.name == "jobs"][0]
    assert ("-p", "tests.lane_order") == tuple(jobs.options[-2:]) and "worksteal" in jobs.options


def test_every_test_the_jobs_lane_starts_first_exists():
    from tests import lane_order

    for nodeid in lane_order.LONGEST:
        path, name = nodeid.split("::")
        assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), nodeid


def test_the_fast_lane_hands_out_its_longest_files_first_and_keeps_each_file_together():
    from tests import lane_order

    ids = ["tests/unit/a.py::x", "tests/unit/a.py::y", "tests/kubernetes/m.py::p", "tests/unit/b.py::z",
           "tests/kubernetes/m.py::q", "tests/contract/c.py::r"]
    order = lane_order.files_first(ids, {"tests/kubernetes/m.py": 300, "tests/contract/c.py": 200})
    assert [ids[i] for i in order] == ["tests/kubernetes/m.py::p", "tests/kubernetes/m.py::q", "tests/contract/c.py::r",
                                       "tests/unit/a.py::x", "tests/unit/a.py::y", "tests/unit/b.py::z"]
    fast = [lane for lane in run_tests.lanes() if lane.name == "fast"][0]
    assert ("-p", "tests.lane_order") == tuple(fast.options[-2:]) and "loadfile" in fast.options
    for path in lane_order.LONGEST_FILES:  # a file renamed away would silently drop out of the order
        assert (REPO / path).is_file(), path


def test_every_ray_test_file_runs_in_exactly_one_of_the_two_ray_lanes():
    """tests/ray is split in two lanes, each with a Ray cluster of its own: none of its files runs twice or never."""
    by_name = {lane.name: lane for lane in run_tests.lanes()}
    ray, ray_jobs = by_name["ray"], by_name["ray-jobs"]
    assert ray.after == ray_jobs.after == "fast"
    for rel in run_tests.RAY_JOB_FILES:
        assert (REPO / rel).is_file() and rel in ray_jobs.paths and f"--ignore={rel}" in ray.paths
    assert all(p.startswith("tests/ray/") for p in ray_jobs.paths) and "tests/ray" in ray.paths


def test_the_preparation_collects_every_lanes_directory_once():
    prepared = [*run_tests.PREPARED[0], *run_tests.PREPARED[1]]
    in_lanes = {p for lane in run_tests.lanes() for p in lane.paths if p.startswith("tests/") and p.count("/") == 1}
    assert sorted(prepared) == sorted(in_lanes)


def test_a_fresh_clone_is_collected_once_before_the_lanes_and_an_edit_or_named_tests_are_not(tmp_path, monkeypatch):
    import os

    import pytest

    monkeypatch.setattr(run_tests, "REPO", tmp_path)
    monkeypatch.setattr(run_tests, "PREPARED", (("tests/unit",), ("tests/ssh",)))
    monkeypatch.setattr(run_tests, "PREPARE_AT_LEAST", 3)
    unit, ssh = tmp_path / "tests" / "unit", tmp_path / "tests" / "ssh"
    for directory in (unit, ssh):
        (directory / "__pycache__").mkdir(parents=True)
    (unit / "helper.py").write_text("")  # not a test module: pytest does not rewrite it
    modules = (unit / "test_a.py", unit / "conftest.py", ssh / "test_b.py")
    for path in modules:
        path.write_text("def test(): pass\n")
    started = []

    class Collection:
        def __init__(self, argv, **kwargs):
            started.append(argv[argv.index("--collect-only"):])

        def wait(self, timeout):
            return 0

    monkeypatch.setattr(run_tests.subprocess, "Popen", Collection)
    assert sorted(run_tests.stale_rewrites()) == sorted(modules)  # a fresh clone
    assert run_tests.prepare(["tests/unit/test_a.py"]) == 0 and not started  # named tests: plain pytest
    assert run_tests.prepare(["-x"]) == 0
    assert started == [["--collect-only", "-q", "tests/unit"], ["--collect-only", "-q", "tests/ssh"]]

    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}"
    for path in modules:
        (path.parent / "__pycache__" / f"{path.stem}.{sys.implementation.cache_tag}-pytest-0.1.pyc").write_bytes(b"")
    assert len(run_tests.stale_rewrites()) == 3  # another pytest's rewrites are not used
    for path in modules:
        (path.parent / "__pycache__" / f"{path.stem}.{tag}.pyc").write_bytes(b"")
    assert run_tests.stale_rewrites() == []
    os.utime(ssh / "test_b.py", (2e9, 2e9))  # edited since
    assert run_tests.stale_rewrites() == [ssh / "test_b.py"]
    started.clear()
    assert run_tests.prepare([]) == 0 and not started  # one stale module: the lanes rewrite it themselves
