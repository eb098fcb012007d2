"""Durable-checkpoint failures that end the job, and the check that a worker sees the driver's storage.

``--checkpoint-dir`` reaches every worker as it was typed. A plain path that is not a mount shared
by all hosts names a different disk on each: rank 0 would write checkpoints where the driver never
looks, and a restarted driver would find none and start the training over. The driver creates the
job's record (``job.json``) in the store before any worker starts, so :func:`check_sees_job` reads
it back, once per worker, before its first checkpoint write or load: one small read. Before a write it
is read on the writer's thread (:class:`CheckedStore`), so that storage that stalls delays the
checkpoint, never the training step (and with it every rank waiting in the next collective). Where
the training thread must wait for it (a load; a sharded write, which host 0's workers decide
together), :meth:`SeesJob.within` waits at most :data:`RECORD_WAIT_S`: s3fs's own timeouts and
retries (5 s to connect, 15 s a read, each call retried by botocore and by s3fs) let one read of an
endpoint that accepts connections and never answers last tens of minutes.

A :class:`CheckpointFailed` is reported to the driver (:func:`report`), which ends the job with
:meth:`~cloud_elastic.protocol_reports.CheckpointReport.ending`'s line and exit code 1: training
must neither go on without the checkpoints the user asked for, nor re-form and fail again forever.
An attempt that failed in a way a later one may mend (the record or a checkpoint that could not be
read or written: credentials, network, a throttle) is reported too (:func:`report_not_written`): the
driver says so at once, and ends the job when no checkpoint at all can be written
(:mod:`cloud_elastic.driver.job.checkpoint_watch`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from cloud_elastic.checkpoint.safety import causes
from cloud_elastic.errors import CheckpointError

__all__ = ["CheckedStore", "CheckpointFailed", "Misfits", "SeesJob", "check_sees_job", "mismatch", "reason_of",
           "report", "report_not_written"]

log = logging.getLogger(__name__)


#: The longest the training thread waits for the job record (a few hundred bytes): a load, a sharded write.
RECORD_WAIT_S = 120.0


class CheckpointFailed(CheckpointError):
    """A checkpoint failure no retry mends; ``failure`` is one of ``protocol_reports.CHECKPOINT_FAILURES``."""

    def __init__(self, failure: str, reason: str) -> None:
        super().__init__(reason)
        self.failure = failure


def mismatch(exc: Any, url: str, commit: int) -> CheckpointFailed:
    """The checkpoint of commit ``commit`` in ``url``, intact, does not fit this state (``exc``, a
    :class:`~cloud_elastic.checkpoint.api.CheckpointMismatch`: another model): the job ends in one line that says
    so, not as training state lost; the checkpoint stays as it is, to resume with the model it was written by (or
    the optimizer: an ``OptimizerMismatch``'s ``remedy``)."""
    remedy = getattr(exc, "remedy", "resume with the same model")
    if str(exc.first).startswith("attributes "):  # another state's names: a later hvd.elastic.run's (review h25)
        remedy += (" (a script running several hvd.elastic.run functions in turn resumes each from the newest "
                   "checkpoint, the later one's: write the phases as one function that branches on the state, "
                   "docs/porting.md)")
    return CheckpointFailed("mismatch", f"the checkpoint in {url} (commit #{commit}) does not fit this training "
                                        f"state ({exc.first}): {remedy}, or use a fresh --checkpoint-dir (training "
                                        "from the start)")


class Misfits:
    """The newest of the checkpoints in ``url`` that a load found not to fit the state (a CheckpointMismatch) while
    it tries the older ones. When every one is another model's, the model changed: :meth:`failure` ends the job as
    :func:`mismatch` says, nothing lost. When an older one fits, the newer was changed after it was written (a forged
    item with bytes of its own looks exactly like another model's), or written by another model: the older one is
    loaded with a warning (:meth:`passed_over`) rather than the job stopped with a remedy (a fresh
    --checkpoint-dir) that would start the training over."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.first: tuple[Any, int] | None = None  # (the CheckpointMismatch, its commit)

    def add(self, exc: Any, commit: int) -> None:
        self.first = self.first or (exc, commit)

    def passed_over(self, worker: str, step: int) -> None:
        """Log, if a newer checkpoint did not fit, that this worker loads the one of ``step`` instead."""
        if self.first is not None:
            log.warning("worker %s: the checkpoint in %s (commit #%d) does not fit this training state (%s), but the "
                        "one of step %d before it does: resuming from it (the newer one was changed after it was "
                        "written, or written by another model; newer checkpoints will replace it)", worker,
                        self.url, self.first[1], self.first[0].first, step)

    def failure(self) -> CheckpointFailed:
        assert self.first is not None
        return mismatch(self.first[0], self.url, self.first[1])


def reason_of(exc: BaseException, kind: type) -> str | None:
    """The message of the first ``kind`` among ``exc``, its causes and torch DCP's per-worker failures."""
    return next((str(c) for c in causes(exc, None) if isinstance(c, kind)), None)


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

    def within(self, timeout_s: float | None = None) -> None:
        """The check, waited for at most ``timeout_s`` (:data:`RECORD_WAIT_S`): CheckpointError (storage
        trouble) when it has not answered by then; the read goes on, on a thread of its own, unwaited for."""
        if self._seen:
            return
        timeout_s = RECORD_WAIT_S if timeout_s is None else timeout_s
        done, outcome = threading.Event(), []

        def run() -> None:
            try:
                self()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name="cloud-elastic-job-record", daemon=True).start()
        if not done.wait(timeout_s):
            raise CheckpointError(f"the job record in {self._url} did not come within {timeout_s:g}s: the storage "
                                  "does not answer")
        if outcome:
            raise outcome[0]


class CheckedStore:
    """``store`` for a :class:`~cloud_elastic.checkpoint.writer.CheckpointWriter`: each ``save`` first runs
    ``check`` (a :class:`SeesJob`, which reads once it succeeded), on the writer's thread.

    A definite answer (:class:`CheckpointFailed`: no record of this job) is reported to the driver at once,
    which ends the job with its line; it is kept in :attr:`failed` for the training thread to raise at its next
    commit, and this save and every later one write nothing and return None (the writer counts a failed write
    without logging the job's last line a second time). A read error fails this save only: the writer logs and
    counts it, rank 0 reports it as ``not_written``, and the next save reads again.
    """

    def __init__(self, store: Any, check: "SeesJob", ctx: Any) -> None:
        self._store, self._check, self._ctx = store, check, ctx
        #: The failure that ends the job, its text the job's last line, once a check found one.
        self.failed: CheckpointFailed | None = None

    def save(self, step: int, payload: Any, meta: Any = None) -> Any:
        if self.failed is None:
            try:
                self._check()
            except CheckpointFailed as exc:
                self.failed = CheckpointFailed(exc.failure, report(self._ctx, exc.failure, str(exc)))
        if self.failed is not None:
            return None
        return self._store.save(step, payload, meta)


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
