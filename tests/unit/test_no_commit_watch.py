"""NoCommitWatch: an elastic job that trains without a commit is warned of once, after its limit; a job that
committed, a fixed-size script and a worker that has not stepped are not (review s63 rvU finding 2)."""

from __future__ import annotations

import logging

from cloud_elastic.driver.job.no_commit import NO_COMMIT_WARN_S, NoCommitWatch
from tests.unit.job_view import FakeJob, S


def _member(job: FakeJob, steps: int = 5):
    w = job.worker("a", 0, S.RUNNING, round_=1, rank=0)
    w.steps = steps
    return w


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "none has committed" in r.getMessage()]


def test_training_without_a_commit_is_warned_of_once_after_the_checkpoint_interval(caplog) -> None:
    job = FakeJob(2, checkpointing=True, checkpoint_interval_s=10.0)
    watch, w = NoCommitWatch(job, lambda: True, job.policy.checkpoint_interval_s), _member(job)
    with caplog.at_level(logging.WARNING):
        for now in (100.0, 105.0, 109.9):
            watch.heard(w, now)
        assert not _warnings(caplog)
        watch.heard(w, 110.0)
        watch.heard(w, 200.0)
    [line] = _warnings(caplog)
    assert "a checkpoint is due every 10s" in line and "does the training function call state.commit()?" in line
    assert "so nothing was checkpointed" in watch.stop_note()


def test_no_warning_once_committed_for_a_fixed_size_script_or_before_a_step(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        committed = FakeJob(2)
        watch, w = NoCommitWatch(committed, lambda: True), _member(committed)
        committed.state_committed = True
        fixed = FakeJob(2, checkpointing=True)
        fixed_watch, f = NoCommitWatch(fixed, lambda: False), _member(fixed)
        idle = FakeJob(2)
        idle_watch, i = NoCommitWatch(idle, lambda: True), _member(idle, steps=0)
        for now in (0.0, 2 * NO_COMMIT_WARN_S):
            watch.heard(w, now)
            fixed_watch.heard(f, now)
            idle_watch.heard(i, now)
    assert not _warnings(caplog)
    assert watch.stop_note() == fixed_watch.stop_note() == ""  # without --checkpoint-dir or elastic.run: nothing
