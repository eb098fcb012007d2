"""A job's end removes the output its local workers kept while no driver read it, and says so.

A worker that outlived ``--driver-grace`` leaves its kept output (``.out-WORKER.log``, up to a few MiB on the
runtime tmpfs) and maybe a FIFO in the job's runtime directory; no driver relays it any more. The next driver of
the job, ending, removes them with its record, so the directory goes (docs/checkpoints.md: nothing left behind).
"""

from __future__ import annotations

import logging
import os

import pytest

from cloud_elastic.records import job_dir, remove_driver_record, write_driver_record

pytestmark = pytest.mark.timeout(10)


def test_the_driver_s_end_removes_kept_output_no_driver_adopted_and_names_it(tmp_path, caplog):
    directory = write_driver_record("j1", "127.0.0.1:1", "s", root=tmp_path)
    (directory / ".out-127.0.0.1[0]#1.log").write_bytes(b"x" * 1234)
    (directory / ".out-127.0.0.2[0]#2.log").write_bytes(b"")
    os.mkfifo(directory / ".out-127.0.0.1[0]#1.fifo", 0o600)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.records"):
        remove_driver_record("j1", root=tmp_path)
    assert not job_dir("j1", tmp_path).exists(), sorted(p.name for p in directory.iterdir())
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "127.0.0.1[0]#1 (1234 bytes)" in warned[0] and "127.0.0.2[0]#2" in warned[0], warned


def test_a_job_that_kept_no_output_ends_without_a_warning(tmp_path, caplog):
    write_driver_record("j2", "127.0.0.1:1", "s", root=tmp_path)
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.records"):
        remove_driver_record("j2", root=tmp_path)
    assert not job_dir("j2", tmp_path).exists()
    assert not caplog.records
