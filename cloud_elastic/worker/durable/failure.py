"""Durable-checkpoint failures that end the job, and the check that a worker sees the driver's storage.

``--checkpoint-dir`` reaches every worker as it was typed. A plain path that is not a mount shared
by all hosts names a different disk on each: rank 0 would write checkpoints where the driver never
looks, and a restarted driver would find none and start the training over. The driver creates the
job's record (``job.json``) in the store before any worker starts, so :func:`check_sees_job` reads
it back, once per worker, before its first checkpoint write or load: one small read.

A :class:`CheckpointFailed` is reported to the driver (:func:`report`), which ends the job with
:meth:`~cloud_elastic.protocol_reports.CheckpointReport.ending`'s line and exit code 1: training
must neither go on without the checkpoints the user asked for, nor re-form and fail again forever.
An attempt that failed in a way a later one may mend (the record or a checkpoint that could not be
read or written: credentials, network, a throttle) is reported too (:func:`report_not_written`): the
driver says so at once, and ends the job when no checkpoint at all can be written
(:mod:`cloud_elastic.driver.job.checkpoint_watch`).
"""

from __future__ import annotations

from typing import Any

from cloud_elastic.errors import CheckpointError

__all__ = ["CheckpointFailed", "SeesJob", "check_sees_job", "report", "report_not_written"]


class CheckpointFailed(CheckpointError):
    """A checkpoint failure no retry mends; ``failure`` is one of ``protocol_reports.CHECKPOINT_FAILURES``."""

    def __init__(self, failure: str, reason: str) -> None:
        super().__init__(reason)
        self.failure = failure


def check_sees_job(store: Any, url: str, job_id: str, host: str) -> None:
    """CheckpointFailed (``storage``) unless ``store`` holds the record of job ``job_id``; CheckpointError when
    the record cannot be read (storage trouble, which may pass)."""
    from cloud_elastic.checkpoint.store import read_job_record

    record = read_job_record(store)
    if record is None or record.job_id != job_id:
        raise CheckpointFailed("storage", f"--checkpoint-dir {url} as this worker on {host} sees it holds no record "
                                          f"of job {job_id}: the driver and every worker must see the same storage "
                                          "(an fsspec URL such as s3://..., or a mount shared by all hosts)")


class SeesJob:
    """:func:`check_sees_job` for one schedule's store, read until it once succeeds (then never again)."""

    def __init__(self, store: Any, url: str, ctx: Any) -> None:
        self._store, self._url, self._ctx = store, url, ctx
        self._seen = False

    def __call__(self) -> None:
        if not self._seen:
            check_sees_job(self._store, self._url, self._ctx.job_id, self._ctx.hostname)
            self._seen = True


def report(ctx: Any, failure: str, reason: str) -> str:
    """Tell the driver that a checkpoint ``failure`` ends the job; the job's last line, as the driver says it."""
    from cloud_elastic.protocol_reports import CheckpointReport

    reason = " ".join(reason.split())[:600]
    ctx.report_checkpoint("failed", failure=failure, reason=reason)
    return CheckpointReport("failed", reason=reason, failure=failure).ending()


def report_not_written(ctx: Any, reason: str, step: int | None = None) -> None:
    """Tell the driver that one checkpoint attempt failed (it may pass: the next attempt comes at its time)."""
    ctx.report_checkpoint("not_written", reason=" ".join(reason.split())[:600],
                          **({} if step is None else {"step": step}))
