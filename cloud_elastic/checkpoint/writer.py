"""``CheckpointWriter``: writes checkpoints from one background thread so training does not wait.

``submit()`` copies the payload's tensors into buffers the writer owns
(reused from one checkpoint to the next, so after the first one the copy runs
at memory speed into memory already touched) and returns; the thread then
serialises and uploads that copy while training goes on and changes the
originals. At most one checkpoint is in flight and none is queued: a submit
while a write is still running returns False and copies nothing, and the
caller simply submits again at its next commit. Memory stays bounded at one
copy of the state, and the checkpoint that does get written is always the
newest commit available when the previous write finished.

A failed write is logged as a WARNING and counted; the writer keeps going
and the previous checkpoints stay as they were.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cloud_elastic.checkpoint.api import CheckpointError, CheckpointInfo
from cloud_elastic.checkpoint.payload import stage_payload, state_payload
from cloud_elastic.checkpoint.store import CheckpointStore

__all__ = ["CheckpointWriter", "PeriodicCheckpointer", "WriterStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterStats:
    """Counters of a writer; durations in seconds of the most recent checkpoint."""

    submitted: int
    skipped: int
    written: int
    failed: int
    last_copy_s: float
    last_write_s: float
    last_written: CheckpointInfo | None
    last_error: str | None


@dataclass
class _Job:
    step: int
    payload: Any
    meta: Mapping[str, Any] | None


class CheckpointWriter:
    """One daemon thread that writes submitted checkpoints to ``store``.

    Use as a context manager, or ``start()`` then ``close()``. ``submit`` is
    meant to be called from one training thread. ``on_written(info, seconds)``,
    if given, is called on the writer's thread after each checkpoint is stored
    (an exception it raises is logged, never fatal).
    """

    def __init__(self, store: CheckpointStore, *, thread_name: str = "cloud-elastic-checkpoint",
                 on_written: Callable[[CheckpointInfo, float], None] | None = None,
                 before_write: Callable[[int, Mapping[str, Any] | None], None] | None = None) -> None:
        self.store = store
        self._on_written = on_written
        self._before_write = before_write
        self._thread_name = thread_name
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._job: _Job | None = None  # submitted, not yet finished
        self._closing = False
        self._staged: Any = None  # the buffers of the last copy, reused by the next
        self._submitted = self._skipped = self._written = self._failed = 0
        self._last_copy_s = self._last_write_s = 0.0
        self._last_written: CheckpointInfo | None = None
        self._last_error: str | None = None

    def start(self) -> "CheckpointWriter":
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._thread_name, daemon=True)
                self._thread.start()
        return self

    def __enter__(self) -> "CheckpointWriter":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def busy(self) -> bool:
        """True while a checkpoint is being written."""
        with self._cond:
            return self._job is not None

    def submit(self, step: int, payload: Any, meta: Mapping[str, Any] | None = None) -> bool:
        """Copy ``payload`` and write it in the background as the checkpoint of ``step``.

        Returns True once the copy is taken (the caller may change the
        originals at once), False without copying anything when the previous
        checkpoint is still being written. Raises CheckpointError when the
        payload holds something a checkpoint cannot keep, or after close().
        """
        with self._cond:
            if self._thread is None or self._closing:
                raise CheckpointError("the checkpoint writer is not running (call start(), and not after close())")
            self._submitted += 1
            if self._job is not None:
                self._skipped += 1
                log.debug("checkpoint of step %d skipped: the previous one is still being written", step)
                return False
        # Only this thread touches the staged buffers while no job is in flight.
        began = time.perf_counter()
        staged = stage_payload(payload, self._staged)
        copy_s = time.perf_counter() - began
        with self._cond:
            self._staged = staged
            self._last_copy_s = copy_s
            self._job = _Job(int(step), staged, dict(meta) if meta else None)
            self._cond.notify_all()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no checkpoint is being written; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._job is None, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Finish the checkpoint in flight (up to ``timeout`` seconds) and stop the thread.

        Returns False if the write was still running at the timeout: the
        daemon thread finishes it on its own and stops (``busy`` says when;
        ``close`` again waits for it); a write the process exits before it
        finishes leaves no manifest, so readers keep using the previous checkpoint.
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            done = self._cond.wait_for(lambda: self._job is None, timeout)
            thread = self._thread
        if done and thread is not None:
            thread.join(timeout)
        if done:
            self._staged = None
        return done

    def stats(self) -> WriterStats:
        """A snapshot of the counters."""
        with self._cond:
            return WriterStats(self._submitted, self._skipped, self._written, self._failed, self._last_copy_s,
                               self._last_write_s, self._last_written, self._last_error)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._closing)
                job = self._job
                if job is None:
                    return
            began = time.perf_counter()
            info, error = None, None
            if self._before_write is not None:
                try:
                    self._before_write(job.step, job.meta)
                except Exception:  # a report that fails must not stop the write
                    log.warning("reporting the checkpoint of step %d before its write failed", job.step, exc_info=True)
            try:
                info = self.store.save(job.step, job.payload, job.meta)
            except Exception as exc:  # a failed upload must not stop training or the next checkpoint
                error = str(exc)
                log.warning("checkpoint of step %d was not written: %s", job.step, error)
            with self._cond:
                self._last_write_s = time.perf_counter() - began
                if info is not None:
                    self._written += 1
                    self._last_written = info
                else:
                    self._failed += 1
                    self._last_error = error
            if info is not None and self._on_written is not None:
                try:
                    self._on_written(info, self._last_write_s)
                except Exception:  # a report that fails must not stop the writer
                    log.warning("reporting checkpoint %s failed", info.url, exc_info=True)
            with self._cond:
                self._job = None
                self._cond.notify_all()


class PeriodicCheckpointer:
    """Decides at each commit whether to checkpoint: at the first commit, then every ``interval_s``.

    Call :meth:`after_commit` right after ``state.commit()`` saved the state
    (on the one worker that writes, rank 0). A commit that falls while the
    previous checkpoint is still being written is passed over without
    building a payload, and the next commit tries again, so a checkpoint is
    written as soon as both the interval has passed and the writer is free.
    ``clock`` is injectable for tests.
    """

    def __init__(self, writer: CheckpointWriter, interval_s: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 payload: Callable[[Any], Any] = state_payload) -> None:
        if interval_s <= 0:
            raise CheckpointError(f"the checkpoint interval must be > 0 seconds, got {interval_s:g}")
        self.writer = writer
        self.interval_s = interval_s
        self._clock = clock
        self._payload = payload
        self._last: float | None = None

    def due(self) -> bool:
        """Whether the next commit would be checkpointed (interval passed, writer free)."""
        if self._last is not None and self._clock() - self._last < self.interval_s:
            return False
        return not self.writer.busy

    def after_commit(self, state: Any, step: int, meta: Mapping[str, Any] | None = None) -> bool:
        """Submit the committed ``state`` as checkpoint ``step`` if one is due; True if it was."""
        if not self.due():
            return False
        now = self._clock()
        if self.writer.submit(step, self._payload(state), meta):
            self._last = now
            return True
        return False
