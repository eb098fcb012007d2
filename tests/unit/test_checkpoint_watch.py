"""Durable checkpoints that keep failing (cloud_elastic.driver.job.checkpoint_watch): said at the first failure,
the job ended when none can be written at all, a throttle that passes forgiven."""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.checkpoint_watch import CheckpointWatch

pytestmark = pytest.mark.timeout(10)

WHY = "could not read s3://b/x/job.json: Unable to locate credentials"


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_first_failure_is_one_warning_and_the_job_ends_when_none_is_written_in_the_window(caplog) -> None:
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.job.checkpoint_watch")
    watch = CheckpointWatch("j", interval_s=0.5)  # the window: 60 s, the floor
    ended = [watch.not_written(WHY, t / 2) for t in range(120)]  # an attempt every 0.5 s for 59.5 s
    assert ended == [None] * 120
    assert warnings(caplog)[0] == f"job j: no checkpoint written: {WHY} (the job ends unless one is written within 60s)"
    assert len(warnings(caplog)) == 7  # then at the 2nd, 4th, ... 64th attempt, not at every one
    assert watch.not_written(WHY, 60.0) == f"{WHY} (no checkpoint written in 60s: 121 attempts failed)"


def test_with_a_long_interval_the_window_is_three_intervals() -> None:
    watch = CheckpointWatch("j", interval_s=300.0)
    assert [watch.not_written(WHY, t) for t in (0.0, 300.0, 600.0, 899.0)] == [None] * 4
    assert watch.not_written(WHY, 900.0) is not None


def test_two_failures_past_the_window_are_not_enough() -> None:
    watch = CheckpointWatch("j", interval_s=10.0)
    assert watch.not_written(WHY, 0.0) is None and watch.not_written(WHY, 500.0) is None
    assert watch.not_written(WHY, 510.0) is not None


def test_a_throttle_that_passes_ends_nothing_and_after_one_checkpoint_failures_only_warn(caplog) -> None:
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.job.checkpoint_watch")
    watch = CheckpointWatch("j", interval_s=10.0)
    assert [watch.not_written("SlowDown", t) for t in (0.0, 20.0, 40.0)] == [None] * 3
    watch.saved(50.0)
    assert "job j: checkpoint written again after 3 failed attempt(s) over 50s" in caplog.text
    assert all(watch.not_written(WHY, 100.0 + t) is None for t in range(0, 3000, 10))
    assert warnings(caplog)[2] == f"job j: no checkpoint written: {WHY} (training goes on; the latest checkpoint " \
                                  "written stays the one to resume from)"


def test_a_checkpoint_this_driver_did_not_see_written_keeps_failures_to_warnings(caplog) -> None:
    watch = CheckpointWatch("j", interval_s=10.0)  # a restarted driver: it saw no checkpoint written
    watch.one_exists()  # the job resumed from one
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.driver.job.checkpoint_watch"):
        assert all(watch.not_written(WHY, float(t)) is None for t in range(0, 3000, 10))
    assert warnings(caplog)[0].endswith("(training goes on; the latest checkpoint written stays the one to resume from)")


def test_reasons_that_differ_only_in_the_checkpoint_path_are_throttled_but_a_new_cause_is_said(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_elastic.driver.job.checkpoint_watch")
    watch = CheckpointWatch("j", interval_s=2.0)
    watch.one_exists()

    def why(i: int, cause: str = "[Errno 20] Not a directory") -> str:
        path = f"/ck/ckpt-2026112{i}T1150Z-step{i:012d}"
        return f"could not write checkpoint {path}: {cause}: '{path}'"

    for i in range(1, 10):
        watch.not_written(why(i), float(i))
    assert [w.split(": ")[1] for w in warnings(caplog)] == ["no checkpoint written", *["still no checkpoint written"] * 3]
    assert ["9 attempt(s)" in w for w in warnings(caplog)] == [False] * 4  # said at the 1st, 2nd, 4th and 8th only
    watch.not_written(why(10, "[Errno 13] Permission denied"), 10.0)
    assert "Permission denied" in warnings(caplog)[-1] and len(warnings(caplog)) == 5
    assert watch.failing_for(11.0) == 10.0
