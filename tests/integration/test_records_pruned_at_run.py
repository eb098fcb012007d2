"""A driver record (the job's secret, its workers' kept output) of a driver gone a day past its grace is deleted when
the next job starts, not only when someone runs ``cloud-elastic status`` (review h13: a killed driver's stayed)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from cloud_elastic.control import new_secret
from cloud_elastic.records import write_driver_record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DEAD_PID = 2 ** 22 + 12345  # above any pid_max: no process


def test_run_deletes_the_records_of_drivers_gone_a_day_past_their_grace(jobs, tmp_path):
    root = tmp_path / "run" / "cloud-elastic"
    old = write_driver_record("pruned00", "127.0.0.1:1", new_secret(), pid=DEAD_PID, command=["python", "x.py"],
                              root=root)
    recent = write_driver_record("recent00", "127.0.0.1:1", new_secret(), pid=DEAD_PID, command=["python", "y.py"],
                                 root=root)
    seen = time.time() - 86400 - 61  # the default --driver-grace (60 s) and a day ago
    os.utime(old / "driver.json", (seen, seen))
    # With --checkpoint-dir too (the start that plans a resume, review h15): any run prunes.
    job = jobs(["run", "-np", "1", "-H", "127.0.0.1:1", "--checkpoint-dir", str(tmp_path / "ckpt"), sys.executable,
                "-c", "pass"], env={"XDG_RUNTIME_DIR": str(tmp_path / "run")})
    assert job.finish(50) == 1, job.output()  # a plain command with --checkpoint-dir is no success: beside the point
    assert not old.exists() and (recent / "secret").exists()
