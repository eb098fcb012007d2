"""``cloud-elastic status`` and a dead driver's record whose pid the kernel has given to another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud_elastic.control import new_secret
from cloud_elastic.records import list_jobs, write_driver_record
from cloud_elastic.status import listed_jobs, render_job_list

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def newcomer():
    """A process started now: what a dead driver's pid names once the kernel reuses it."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc.pid
    proc.stdin.close()
    proc.wait(10)


def _record(root: Path, job: str, pid: int, *, started_ago: float, seen_ago: float) -> None:
    """A driver record written ``started_ago`` seconds ago by ``pid``, last refreshed ``seen_ago`` seconds ago."""
    directory = write_driver_record(job, "127.0.0.1:1", new_secret(), pid=pid, command=["python", "t.py"], root=root)
    record = json.loads((directory / "driver.json").read_text())
    (directory / "driver.json").write_text(json.dumps({**record, "started": time.time() - started_ago}))
    seen = time.time() - seen_ago
    os.utime(directory / "driver.json", (seen, seen))


def test_a_stale_record_whose_pid_is_now_another_process_is_a_gone_driver(tmp_path, newcomer) -> None:
    root = tmp_path / "cloud-elastic"
    _record(root, "63669d1e", newcomer, started_ago=20 * 3600, seen_ago=16 * 3600)
    [job] = list_jobs(root)
    assert not job.alive
    assert f"{newcomer} (gone, last seen 16h00m ago)" in render_job_list([job])
    assert listed_jobs(root=root) == ([], 1)  # past its grace: not listed as running


def test_a_stale_record_of_a_process_that_started_before_it_is_a_live_driver(tmp_path) -> None:
    root = tmp_path / "cloud-elastic"
    _record(root, "runs0000", os.getpid(), started_ago=0, seen_ago=3600)  # a driver whose loop is held up
    [job] = list_jobs(root)
    assert job.alive


def test_a_fresh_record_is_a_live_driver_whatever_the_clock_says_of_its_start(tmp_path, newcomer) -> None:
    root = tmp_path / "cloud-elastic"
    _record(root, "fresh000", newcomer, started_ago=3600, seen_ago=0)  # refreshed just now: it runs
    [job] = list_jobs(root)
    assert job.alive


def test_plain_status_lists_rather_than_asks_a_reused_pid(tmp_path, newcomer) -> None:
    _record(tmp_path / "cloud-elastic", "63669d1e", newcomer, started_ago=20 * 3600, seen_ago=16 * 3600)
    result = subprocess.run([sys.executable, "-m", "cloud_elastic.cli", "status"], capture_output=True, text=True,
                            timeout=20, cwd="/",
                            env={**os.environ, "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no cloud-elastic jobs running for this user on this machine\n(1 record(s)")
