"""The whole test suite in lanes side by side, or plain pytest when the caller picks tests.

``./dev test`` runs this (through ``scripts/test.sh``). With no test paths among its
arguments it runs these pytest processes:

- ``jobs``: the tests that run real jobs or an sshd (integration, chaos, ssh) over ``pytest-xdist``
  workers (``CLOUD_ELASTIC_TEST_JOB_WORKERS``, default 4), each test on whichever is free;
- ``fast``: the tests that start no job (unit, contract, emulator, terraform, kubernetes) over
  ``CLOUD_ELASTIC_TEST_WORKERS`` xdist workers (default 4), a module's tests one after
  another on one worker;
- ``ray``, ``ray-jobs``, ``spark`` and ``cloud-jobs``: tests/ray (its two longest files,
  :data:`RAY_JOB_FILES`, in ``ray-jobs``) and tests/spark, each one test at a time (a local Ray
  cluster or Spark session each), and the emulator and Kubernetes files that run real jobs
  (:data:`JOB_FILES`) over two xdist workers, all started when ``fast`` has ended, side by side:
  most of their time is spent waiting on their clusters' daemons, on emulated clouds and on the
  jobs' own timeouts, not on the CPU.

Each lane is plain pytest with the project's configuration, so every test keeps its
pytest-timeout bound. Every lane's output is shown as it comes, each line prefixed
with the lane's name; at the end each lane's own summary line is repeated, with the
FAILED and ERROR lines of its short summary (``-ra``), and a total follows on the
last line (``total: N passed, N failed, N skipped``). The exit code is 0 only when
every lane passed.

Arguments:

- options only (``-x``, ``-q -ra``, ``-k EXPR``, ``-m EXPR``, ``--timeout 60`` ...)
  go to every lane, after the lane's own (so a user's ``-n`` wins in every lane);
- any test path or node id (``tests/unit``, ``tests/unit/test_job.py::test_x``)
  means the caller chose the tests: this runs ``pytest -p no:cacheprovider ARGS``
  alone, in the foreground, exactly as ``./dev test ARGS`` did before lanes;
- ``CLOUD_ELASTIC_TEST_LANES=serial`` runs the whole suite as one plain pytest
  (the old ``./dev test``).

Every mode runs with ``OMP_NUM_THREADS=1`` unless it is set (see :func:`main`). ``--prepare`` (first, followed by
the run's arguments) is what ``./dev test`` runs before the tests: it collects a fresh clone's tests once and runs
none (:func:`prepare`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = ["-m", "pytest", "-p", "no:cacheprovider"]

#: Options of pytest (and its plugins used here) that take a value as the next argument:
#: that value is not a test path even when a file of that name exists.
_TAKES_VALUE = {
    "-k", "-m", "-p", "-o", "-c", "-n", "-W", "--rootdir", "--basetemp", "--junitxml", "--junit-xml",
    "--timeout", "--timeout-method", "--durations", "--durations-min", "--maxfail", "--deselect", "--ignore",
    "--ignore-glob", "--confcutdir", "--log-level", "--log-file", "--tb", "-r", "--dist", "--numprocesses",
    "--maxprocesses", "--import-mode", "--capture", "--override-ini", "--config-file",
}


@dataclass
class Lane:
    """One pytest process over some test directories; with ``after``, started once that lane has ended."""

    name: str
    paths: tuple[str, ...]
    options: tuple[str, ...] = ()
    after: str | None = None
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    def command(self, user_args: list[str]) -> list[str]:
        return [sys.executable, *BASE, *self.paths, *self.options, *user_args]


#: Files outside the job directories whose tests run real jobs (``tests.integration.harness.Job``): the fast lane
#: leaves them out, and they run in the ``cloud-jobs`` lane once it has ended. In the jobs lane they were a sixth of
#: its time, and that lane was the run's longest path (CI of stop 57: 712 s of 767); after the fast lane, beside the
#: cluster lanes (about 220 s, mostly waiting), two workers take them in about as long.
JOB_FILES = ("tests/emulator/test_cli.py", "tests/emulator/test_aws_notice_cli.py",
             "tests/emulator/test_kubernetes_jobs.py", "tests/kubernetes/test_pod_job.py",
             "tests/kubernetes/test_pod_sigterm.py",
             "tests/emulator/test_multi_source.py", "tests/emulator/test_fallback_handoff.py")


#: The Ray files that run whole elastic jobs on the cluster (about half of tests/ray's time): a lane of their own,
#: with a Ray cluster of its own, beside the rest of tests/ray.
RAY_JOB_FILES = ("tests/ray/test_example_everywhere.py", "tests/ray/test_ray_executor.py")


def _xdist(workers: int, dist: str) -> tuple[str, ...]:
    return ("-n", str(workers), "--dist", dist) if workers > 1 else ()


def lanes(fast_workers: int = 4, job_workers: int = 4) -> list[Lane]:
    """The lanes of a whole run.

    The job tests mostly wait (on step sleeps, grace periods, timeouts), so several run at once and
    take the whole run's time. The fast tests are CPU-bound: they share the two cores with the jobs,
    and only then do Ray and Spark start, one test at a time each: a local Ray cluster or Spark session
    is heavy, and slows down threefold when it competes with the fast lane. Ray's and Spark's lanes run
    side by side: one after the other, they were the run's last four minutes with a core mostly idle, and
    Ray alone, in one lane, was then the last 3.5 minutes, so its two longest files have a lane of their own.
    """
    # The files with the longest serial runs first (terraform's CLI tests and checkov: minutes in a few files, each
    # on one worker under loadfile), so that they overlap the many short unit files instead of ending the lane.
    fast = ("tests/terraform", "tests/contract", "tests/unit", "tests/emulator", "tests/kubernetes",
            *(f"--ignore={f}" for f in JOB_FILES))
    jobs = ("tests/integration", "tests/chaos", "tests/ssh")
    # worksteal: a job test goes to whichever worker is free, so the run does not end on one worker still
    # going through a long module. loadfile: a fast module stays on one worker, its fixtures set up once.
    # tests/lane_order.py: each job worker starts with its share of the longest tests (worksteal only).
    order = ("-p", "tests.lane_order") if job_workers > 1 else ()
    fast_order = ("-p", "tests.lane_order") if fast_workers > 1 else ()  # the longest files first
    return [Lane("jobs", jobs, (*_xdist(job_workers, "worksteal"), *order)),
            Lane("fast", fast, (*_xdist(fast_workers, "loadfile"), *fast_order)),
            Lane("ray", ("tests/ray", *(f"--ignore={f}" for f in RAY_JOB_FILES)), after="fast"),
            Lane("ray-jobs", RAY_JOB_FILES, after="fast"),
            Lane("spark", ("tests/spark",), after="fast"),
            Lane("cloud-jobs", JOB_FILES, (*_xdist(min(2, job_workers), "worksteal"), *order), after="fast")]


def picks_tests(args: list[str]) -> bool:
    """Whether ``args`` name test paths or node ids (anything pytest would collect from)."""
    previous = ""
    for arg in args:
        if not arg.startswith("-") and previous not in _TAKES_VALUE:
            if (REPO / arg.split("::", 1)[0]).exists() or Path(arg.split("::", 1)[0]).exists():
                return True
        previous = arg if "=" not in arg else ""
    return False


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)\b")


def summary_line(lines: list[str]) -> str | None:
    """pytest's closing line (``=== 3 failed, 10 passed in 5.0s ===`` or its ``-q`` form)."""
    for line in reversed(lines):
        if " in " in line and _COUNT.search(line):
            return line.strip("= ").strip()
        if "no tests ran" in line:
            return line.strip("= ").strip()
    return None


def counts(line: str | None) -> dict[str, int]:
    found: dict[str, int] = {}
    for number, word in _COUNT.findall(line or ""):
        word = {"error": "errors", "warning": "warnings"}.get(word, word)
        found[word] = found.get(word, 0) + int(number)
    return found


def failures(lines: list[str]) -> list[str]:
    """The FAILED and ERROR lines of pytest's short summary (``-ra``), repeated at the end of the run: a
    CI log is often shown by its tail, and a lane's failures otherwise scroll away under the other lanes."""
    return [line.strip() for line in lines if line.startswith(("FAILED ", "ERROR "))]


def _pump(lane: Lane, width: int) -> None:
    assert lane.proc is not None and lane.proc.stdout is not None
    prefix = f"[{lane.name}]".ljust(width)
    for raw in iter(lane.proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        lane.lines.append(line)
        sys.stdout.write(f"{prefix} {line}\n")
        sys.stdout.flush()


def run_lanes(chosen: list[Lane], user_args: list[str]) -> int:
    width = max(len(lane.name) for lane in chosen) + 2
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    pumps: dict[str, threading.Thread] = {}
    by_name = {lane.name: lane for lane in chosen}

    def start(lane: Lane) -> None:
        print(f"[{lane.name}] {' '.join(lane.command(user_args)[1:])}", flush=True)
        lane.started = time.monotonic()
        lane.proc = subprocess.Popen(lane.command(user_args), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        pumps[lane.name] = threading.Thread(target=_pump, args=(lane, width), daemon=True)
        pumps[lane.name].start()

    def forward(signum, _frame) -> None:  # SIGTERM to the runner ends the lanes too
        for lane in chosen:
            if lane.proc is not None and lane.proc.poll() is None:
                lane.proc.send_signal(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, forward)
    interrupted = False
    while any(not lane.ended for lane in chosen):
        for lane in chosen:
            if lane.proc is None and not lane.ended:
                before = by_name.get(lane.after) if lane.after else None
                if interrupted:
                    lane.ended = time.monotonic()  # never started: no summary line, so the lane fails
                elif before is None or before.ended:
                    start(lane)
            elif lane.proc is not None and not lane.ended and lane.proc.poll() is not None:
                pumps[lane.name].join(30)
                lane.ended = time.monotonic()
        try:
            time.sleep(0.2)
        except KeyboardInterrupt:  # Ctrl-C reached the lanes as well: let them write their reports
            interrupted = True
    return report(chosen)


def report(chosen: list[Lane]) -> int:
    total: dict[str, int] = {}
    failed_lanes = []
    ran_any = False
    print()
    for lane in chosen:
        rc = lane.proc.returncode if lane.proc is not None else None
        line = summary_line(lane.lines)
        found = counts(line)
        for key, value in found.items():
            total[key] = total.get(key, 0) + value
        ran = sum(found.get(k, 0) for k in ("passed", "failed", "errors", "xfailed", "xpassed", "skipped"))
        ran_any = ran_any or ran > 0
        # pytest's 5 is "no tests collected": a lane whose tests were all deselected by -k/-m did nothing wrong.
        if rc not in (0, 5) or line is None:
            failed_lanes.append(lane.name)
        print(f"lane {lane.name}: exit {rc} after {lane.ended - lane.started:.0f}s: {line or 'no pytest summary line'}")
        for failure in failures(lane.lines):
            print(f"  {lane.name}: {failure}")
    if not ran_any:
        failed_lanes.append("(no test ran)")
    failed = total.get("failed", 0) + total.get("errors", 0)
    detail = ", ".join(f"{total[k]} {k}" for k in ("errors", "xfailed", "xpassed", "deselected") if total.get(k))
    if failed_lanes:
        print(f"failed lanes: {', '.join(failed_lanes)}")
    if detail:
        print(f"also: {detail}")
    print(f"total: {total.get('passed', 0)} passed, {failed} failed, {total.get('skipped', 0)} skipped")
    return 1 if failed_lanes or failed else 0


#: The lanes' directories, in the two halves :func:`prepare` collects side by side.
PREPARED = (("tests/terraform", "tests/contract", "tests/unit", "tests/emulator", "tests/kubernetes"),
            ("tests/integration", "tests/chaos", "tests/ssh", "tests/ray", "tests/spark"))
#: Below this many stale test modules the lanes rewrite them themselves: a collection would import every lane's
#: dependencies (torch, Ray, PySpark, the cloud SDKs) for a few files an edit or a pull changed.
PREPARE_AT_LEAST = 50
#: How long the two collections of :func:`prepare` may take together.
PREPARE_TIMEOUT_S = 300.0


def stale_rewrites() -> list[Path]:
    """The lanes' test modules (and conftests) without pytest's rewritten bytecode cached for this pytest, or with
    one older than their source."""
    import pytest  # the cache's name carries pytest's version: another pytest's rewrites are not used

    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}"
    stale = []
    for path in (p for directory in (*PREPARED[0], *PREPARED[1]) for p in (REPO / directory).rglob("*.py")):
        if not path.name.startswith("test_") and path.name != "conftest.py":
            continue
        cached = path.parent / "__pycache__" / f"{path.stem}.{tag}.pyc"
        if not cached.exists() or cached.stat().st_mtime < path.stat().st_mtime:
            stale.append(path)
    return stale


def plain_pytest(argv: list[str]) -> bool:
    """Whether the arguments mean plain pytest rather than the lanes (tests named, or the serial setting)."""
    return picks_tests(argv) or os.environ.get("CLOUD_ELASTIC_TEST_LANES") == "serial"


def prepare(argv: list[str]) -> int:
    """``--prepare`` (what ``./dev test`` runs first, while the test tools still install): when a whole run is to
    come and at least :data:`PREPARE_AT_LEAST` test modules have no rewritten bytecode cached (a fresh clone),
    collect every lane's tests once, so that the lanes find them cached.

    pytest rewrites the asserts of each test module the first time a process imports it and caches the result in
    ``__pycache__``. In a fresh clone the lanes' dozen xdist workers start at once and each rewrote every module of
    its lane: a worker of the fast lane collected in 14.6 CPU-seconds instead of 5.5 (the two collections here take
    about 23). Nothing is collected for a few stale modules, or when the arguments pick tests. A failure here is left
    for the run itself to show.
    """
    if plain_pytest(argv) or len(stale_rewrites()) < PREPARE_AT_LEAST:
        return 0
    procs = [subprocess.Popen([sys.executable, *BASE, "--collect-only", "-q", *paths], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
             for paths in PREPARED]
    deadline = time.monotonic() + PREPARE_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0


def main(argv: list[str]) -> int:
    os.chdir(REPO)
    # One intra-op thread per test process, as the driver gives the jobs' workers, unless the caller set it: the test
    # processes that compute with torch in-process (and Ray's and Spark's workers) share two cores with a dozen others,
    # and OpenMP's second thread only spun there (8 % of tests/unit's CPU at -n 2 on an otherwise idle machine; a whole
    # clean-clone run: 1,742 CPU-seconds before, 1,418 after, with the collection of --prepare and two small cuts).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if argv[:1] == ["--prepare"]:
        return prepare(argv[1:])
    if plain_pytest(argv):
        os.execv(sys.executable, [sys.executable, *BASE, *argv])
    # Four fast workers, not three: the fast lane is CPU-bound and the jobs lane mostly waits, but on two cores the
    # kernel shares the CPU by runnable process, and the job tests' drivers and workers took most of it: the fast lane
    # then set the run's longest path (fast + the lanes after it: 592 + 221 s of 860 on 2026-12-01, jobs 663 s).
    fast = int(os.environ.get("CLOUD_ELASTIC_TEST_WORKERS", "4"))
    jobs = int(os.environ.get("CLOUD_ELASTIC_TEST_JOB_WORKERS", "4"))
    return run_lanes(lanes(fast, jobs), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
