"""``cloud-elastic status JOB`` just after the job ended says how it ended, not "no job JOB on this machine"
(review s63 rvU finding 8: read as "it never existed", exit 2)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cloud_elastic.errors import ConfigError
from cloud_elastic.records import (MAX_ENDED, PRUNE_AFTER_S, job_dir, list_jobs, note_ended, read_record,
                                   remove_driver_record, write_driver_record)

pytestmark = pytest.mark.timeout(30)


def test_a_job_that_ended_is_said_to_have_ended_and_how(tmp_path: Path) -> None:
    write_driver_record("cea7a4b1", "127.0.0.1:1", "s", root=tmp_path)
    remove_driver_record("cea7a4b1", root=tmp_path, ended="succeeded: training completed on 2 worker(s)")
    assert list_jobs(tmp_path) == []  # not a running job, nor a listed one
    with pytest.raises(ConfigError) as info:
        read_record(job_dir("cea7a4b1", tmp_path))
    assert str(info.value) == ("job cea7a4b1 is not running: it ended 0s ago (succeeded: training completed on 2 "
                               "worker(s))")
    with pytest.raises(ConfigError, match=r"^no job 0123abcd on this machine \(see 'cloud-elastic status'\)$"):
        read_record(job_dir("0123abcd", tmp_path))


def test_at_most_the_newest_ended_jobs_are_kept_and_none_past_a_day(tmp_path: Path) -> None:
    for n in range(MAX_ENDED + 3):
        note_ended(f"job{n:04d}", "failed: x", tmp_path)
        os.utime(tmp_path / ".ended" / f"job{n:04d}", (time.time() - 1000 + n,) * 2)
    note_ended("last", "failed: y", tmp_path)
    kept = sorted(p.name for p in (tmp_path / ".ended").iterdir())
    assert len(kept) == MAX_ENDED and "last" in kept and "job0000" not in kept
    os.utime(tmp_path / ".ended" / "last", (time.time() - PRUNE_AFTER_S - 1,) * 2)
    note_ended("newer", "failed: z", tmp_path)
    assert not (tmp_path / ".ended" / "last").exists()
