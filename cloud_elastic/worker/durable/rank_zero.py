"""Durable checkpoints inside a job: rank 0 writes them after commits, a ``from_checkpoint`` round loads one.

The driver passes ``--checkpoint-dir``, ``--checkpoint-interval`` and
``--checkpoint-keep`` to every worker as ``CLOUD_ELASTIC_CHECKPOINT_DIR``,
``CLOUD_ELASTIC_CHECKPOINT_INTERVAL_S`` and ``CLOUD_ELASTIC_CHECKPOINT_KEEP``
(:meth:`DurableSettings.from_settings`). The elastic loop builds one
:class:`RankZeroCheckpoints` per worker (a ``DurableSchedule``, see ``durable.api``)
and registers its :meth:`after_commit` as an after-commit hook of the ledger:

* on the worker that is rank 0 of the current round, each commit may submit
  the committed state to a background :class:`CheckpointWriter` (at the first
  commit, then every interval; the step never waits for the upload); the
  writer starts when the worker becomes rank 0 and stops when it stops being
  rank 0: a write in flight then finishes on the writer's own thread (the
  commit does not wait for it), and every later wait of this worker's
  (:meth:`stop_writing`, :meth:`finish`, :meth:`leaving`) waits for it too;
  back at rank 0 before it finished, the worker takes that writer back, which
  writes the next checkpoint once it is free: one write in flight per worker;
* while the driver is unreachable, rank 0 checkpoints at every commit the
  writer is free for, so that the workers' last steps before they stop
  (``--driver-grace``) are on storage for the driver that resumes the job;
* :meth:`load_latest` loads the newest usable checkpoint into the state
  before rank 0 broadcasts it in a round the driver formed ``from_checkpoint``;
  no checkpoint, or storage that cannot be read, raises CheckpointError and
  the worker exits rather than broadcast its initial weights;
* :meth:`finish` writes the final state when training completed, and waits for it as long as the storage takes
  (no time limit of its own: a finished job's last checkpoint is its result); while it waits, a write in
  flight that moves bytes counts as progress for the driver's ``--progress-timeout`` watch (``ctx.progress``),
  so storage that moves none for that long (a hung mount) ends the round as any stuck worker does;
* :meth:`leaving` (the worker is sent away) finishes the checkpoint in flight; rank 0 of the last
  holders of the state, sent away with no worker to take it (the driver's ``ExitOrder.checkpoint_s``:
  a notice for every host at once), first writes a checkpoint of the commit it leaves at, and waits
  for it up to the time the driver gave (its host's deadline less a margin): the next round resumes from it;
* before its first write or load, the worker checks that it sees the driver's job record in
  the store (``durable.failure``): a ``--checkpoint-dir`` that is no storage shared with the
  driver ends the job in one line, as does a state a checkpoint cannot hold; a record that cannot
  be read, or a write that fails, is reported as an attempt that failed (``not_written``) and tried
  again at the next checkpoint, one interval later. Before a write the record is read on the
  writer's thread, with the first checkpoint: the commit does not wait for it (a load does).

Each checkpoint written or loaded is reported to the driver (a signed
``checkpoint`` control message), which logs it and writes the
``checkpoint_saved`` / ``checkpoint_loaded`` events.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from cloud_elastic.checkpoint.api import CheckpointError, CheckpointInfo, CheckpointMismatch
from cloud_elastic.checkpoint.store import CheckpointStore, checked_step
from cloud_elastic.checkpoint.writer import CheckpointWriter, PeriodicCheckpointer
from cloud_elastic.worker.commit.fingerprint import fingerprint
from cloud_elastic.worker.durable.failure import (CheckedStore, CheckpointFailed, Misfits, SeesJob, report,
                                                  report_not_written)

__all__ = ["DurableSettings", "RankZeroCheckpoints", "log_leaving_write", "step_of", "wait_for_storage"]

log = logging.getLogger(__name__)

#: How long leaving rank 0 waits for the checkpoint being written (:meth:`RankZeroCheckpoints.finish` has no limit).
FLUSH_TIMEOUT_S = 120.0
#: While rank 0 waits for a write, how often it tells the driver's progress watch that the write moved bytes.
PROGRESS_EVERY_S = 1.0


@dataclass(frozen=True)
class DurableSettings:
    """The job's checkpoint settings as the driver passed them to the worker."""

    url: str
    interval_s: float = 300.0
    keep: int = 2
    #: ``hvd.shard``'s checkpoints written from a host copy while training goes on (else training waits).
    background: bool = True

    @classmethod
    def from_settings(cls, settings: Any) -> "DurableSettings | None":
        """From the worker's :class:`~cloud_elastic.worker.settings.WorkerSettings`; None without ``--checkpoint-dir``."""
        if not settings.checkpoint_dir:
            return None
        return cls(settings.checkpoint_dir, settings.checkpoint_interval_s, settings.checkpoint_keep,
                   settings.sharded_checkpoint_writes == "background")


def step_of(state: Any, fallback: int) -> int:
    """The step a checkpoint of ``state`` is labelled with: its integer ``step`` attribute, else ``fallback``.

    CheckpointError (one line) when that is negative: no checkpoint can be named for it.
    """
    step = getattr(state, "step", None)
    return checked_step(step if isinstance(step, int) and not isinstance(step, bool) else fallback)


class RankZeroCheckpoints:
    """Rank 0's checkpoint schedule and the loading of a checkpoint (see module docstring): a ``DurableSchedule``.

    ``ctx`` is the worker's context (its ``info.rank``, ``ledger``,
    ``driver_lost``, ``job_id``, ``hostname`` and ``report_checkpoint`` are used); ``clock`` is
    injectable for tests. The constructor does no I/O.
    """

    def __init__(self, settings: DurableSettings, ctx: Any, *, clock: Callable[[], float] = time.monotonic,
                 store: CheckpointStore | None = None) -> None:
        self.settings = settings
        self._ctx = ctx
        self._clock = clock
        self.store = store if store is not None else CheckpointStore(settings.url, keep=settings.keep)
        self._writer: CheckpointWriter | None = None
        self._retired: CheckpointWriter | None = None  # the writer of an earlier turn as rank 0, at its last write
        self._periodic: PeriodicCheckpointer | None = None
        self._check_store = SeesJob(self.store, settings.url, ctx)  # CheckpointFailed when it is not the driver's
        # What the writer saves to: the job record is read on its thread, before the first checkpoint.
        self._checked = CheckedStore(self.store, self._check_store, ctx)
        self._failed_seen = 0  # the writer's failed writes already reported to the driver

    @property
    def writing(self) -> bool:
        """True while this worker runs the writer (it is rank 0)."""
        return self._writer is not None

    def loads_here(self, info: Any) -> bool:
        """Whether this worker loads the checkpoint in a ``from_checkpoint`` round: rank 0 (which broadcasts it)."""
        return info.rank == 0

    # ------------------------------------------------------------- the hook
    def after_commit(self, state: Any) -> None:
        """The ledger's after-commit hook: checkpoint if this worker is rank 0 and one is due."""
        info = getattr(self._ctx, "info", None)
        if info is None or info.rank != 0:
            self._retire(self._writer)  # a write in flight finishes on its own thread: this commit does not wait
            return
        self._raise_if_failed()
        driver_lost = getattr(self._ctx, "driver_lost", False)
        if self._periodic is None:
            self._start_writing()
        assert self._periodic is not None
        # Failed saves, a job record that could not be read among them, each one interval apart.
        self._report_write_failures()
        meta = self._meta(state, info)
        try:
            step = step_of(state, self._ctx.ledger.commit_seq)
            if driver_lost and not self._periodic.writer.busy:
                # The driver is away: keep storage as close as possible to the last commit.
                self._periodic.writer.submit(step, _payload(state), meta)
                return
            self._periodic.after_commit(state, step, meta)
        except CheckpointError as exc:
            # A state the checkpoint cannot hold is refused at every commit alike: end the job, do not re-form it.
            raise self._failed("write", str(exc)) from exc

    def _meta(self, state: Any, info: Any) -> dict[str, Any]:
        meta = {"world_size": info.size, "job_id": self._ctx.job_id, "commit_seq": self._ctx.ledger.commit_seq}
        epoch = getattr(state, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            meta["epoch"] = epoch
        return meta

    def _failed(self, failure: str, reason: str) -> CheckpointFailed:
        """Tell the driver (which ends the job); the CheckpointFailed to raise, its text the job's last line."""
        return CheckpointFailed(failure, report(self._ctx, failure, reason))

    def _raise_if_failed(self) -> None:
        """The failure the writer's job check found (already reported: the driver is ending the job)."""
        failed = self._checked.failed
        if failed is not None:
            raise CheckpointFailed(failed.failure, str(failed))

    def _start_writing(self) -> None:
        # The writer of an earlier turn, if it is still there, writes this turn's checkpoints once it is free.
        self._writer, self._retired = self._retired, None
        if self._writer is None:
            self._writer = CheckpointWriter(self._checked, on_written=self._written, before_write=self._writing).start()
            self._failed_seen = 0
        self._periodic = PeriodicCheckpointer(self._writer, self.settings.interval_s, clock=self._clock)
        log.info("worker %s: rank 0 writes checkpoints to %s every %gs", self._ctx.worker_id, self.settings.url,
                 self.settings.interval_s)

    def stop_writing(self, timeout: float | None = FLUSH_TIMEOUT_S) -> bool:
        """Stop the writer and wait (up to ``timeout``; None: as long as it takes) for its write in flight, or for
        that of this worker's earlier turn as rank 0; True when none is left. A write still running goes on."""
        self._retire(self._writer)
        if self._retired is not None:
            self._wait(self._retired, timeout)
            self._retire(self._retired)
        return self._retired is None

    def _retire(self, writer: CheckpointWriter | None) -> None:
        """This worker stops writing with ``writer`` (None: it is not writing) or its earlier turn's: a write in
        flight goes on, and its writer is kept for the next turn as rank 0 (:meth:`_start_writing`) and for the
        waits of :meth:`stop_writing`; an idle writer is stopped."""
        self._writer, self._periodic = None, None
        writer = writer or self._retired
        self._retired = writer if writer is not None and writer.busy else None
        if writer is not None and self._retired is None:
            writer.close(0.0)

    def _wait(self, writer: CheckpointWriter, timeout: float | None) -> bool:
        """Wait for ``writer``'s write in flight (up to ``timeout``; None: no limit); True when none is left,
        counting as progress while it moves bytes (:func:`wait_for_storage`)."""
        return wait_for_storage(writer.wait, self.store, self._ctx, timeout)

    def _report_write_failures(self) -> None:
        """Tell the driver of the writes that failed in the background since the last commit (each is logged)."""
        assert self._writer is not None
        stats = self._writer.stats()
        if stats.failed > self._failed_seen:
            self._failed_seen = stats.failed
            report_not_written(self._ctx, stats.last_error or "the checkpoint write failed")

    def _writing(self, step: int, meta: Any) -> None:
        # The driver hears of the commit before any checkpoint of it can exist (see control_plane's "writing").
        seq = meta.get("commit_seq") if meta else None
        if isinstance(seq, int) and not isinstance(seq, bool):
            self._ctx.report_checkpoint("writing", step=step, commit_seq=seq)

    def _written(self, info: CheckpointInfo, duration_s: float) -> None:
        # With its commit, the driver counts the steps a drain without a successor loses (driver.job.leaving).
        seq = info.extra.get("commit_seq")
        self._ctx.report_checkpoint("saved", step=info.step, path=info.url, duration_s=round(duration_s, 3),
                                    bytes=info.size, **({"commit_seq": seq} if isinstance(seq, int) else {}))

    # -------------------------------------------------------------- loading
    def load_latest(self, state: Any) -> CheckpointInfo:
        """Load the newest usable checkpoint into ``state`` (and make it the state's last commit).

        Raises CheckpointError when there is none, the storage cannot be read,
        or no checkpoint fits the state (one that does not fit while an older one
        does is passed over with a warning: ``failure.Misfits``); ``state`` then
        holds its last commit, never a half-loaded mix.
        """
        from cloud_elastic.checkpoint.payload import load_state_payload

        began = time.perf_counter()
        self._check_store.within()  # bounded: the other ranks wait for this load in the round's broadcast
        misfits, latest = Misfits(self.settings.url), self.store.latest()
        while True:
            if latest is None or misfits.first is not None and latest.info.shards is not None:
                if misfits.first is not None:  # another model's, every one: nothing is lost, and the job says so
                    raise misfits.failure() from misfits.first[0]
                raise CheckpointError(f"no usable checkpoint in {self.settings.url}")
            if latest.info.shards is not None:
                raise CheckpointError(f"the newest checkpoint in {self.settings.url} (step {latest.info.step}) holds "
                                      "the shards of a model trained with hvd.shard: load it with the same hvd.shard "
                                      "call")
            # The job's history of commits goes on from the checkpoint's (older checkpoints: from its step).
            seq = latest.info.extra.get("commit_seq", latest.info.step)
            seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else latest.info.step
            try:
                load_state_payload(state, latest.payload)
                break
            except CheckpointMismatch as exc:  # nothing loaded; an older checkpoint may fit (``Misfits``)
                misfits.add(exc, seq)
                latest = self.store.latest(before=latest.info.name)
        misfits.passed_over(self._ctx.worker_id, latest.info.step)
        self._ctx.ledger.hold_commit(seq)
        log.info("worker %s: loaded checkpoint of step %d from %s in %.2fs", self._ctx.worker_id, latest.info.step,
                 latest.info.url, time.perf_counter() - began)
        # With the checkpoint's commit the driver counts the steps lost since it (commits it heard of past it).
        self._ctx.report_checkpoint("loaded", step=latest.info.step, path=latest.info.url, commit_seq=seq,
                                    trained=fingerprint(state))  # the driver's repeat guards measure it
        return latest.info

    # ------------------------------------------------------------ finishing
    def finish(self, state: Any) -> str | None:
        """Training completed: rank 0 writes the final state and waits for it to be stored, as long as the
        storage takes (a write that moves bytes counts as progress for the driver's watch meanwhile).

        Returns None when it was stored (or this is not rank 0), else why not:
        the job must not report success without the final checkpoint it promised.
        """
        info = getattr(self._ctx, "info", None)
        if info is None or info.rank != 0:
            self.stop_writing()
            return None
        self._raise_if_failed()
        step = step_of(state, self._ctx.ledger.commit_seq)
        log.info("worker %s: writing the final checkpoint (step %d); waiting for it as long as the storage takes",
                 self._ctx.worker_id, step)
        why = self._write_now(state, info, None, leaving=False)
        self._raise_if_failed()
        if why is None:
            return None
        log.warning("worker %s: the final checkpoint was not written: %s", self._ctx.worker_id, why)
        return f"the final checkpoint (step {step}) was not written: {why}"

    def leaving(self, state: Any) -> None:
        """This worker was sent away: finish the checkpoint in flight; as the one writer the driver picked among the
        last holders of the state sent away with no successor (``ctx.checkpoint_writer``, by the order they left in,
        not by its last round's rank 0, which may be gone; ``ctx.checkpoint_before_leaving``, the seconds the driver
        gave), first write a checkpoint of the commit it leaves at (``state`` is that commit: it left its round at a
        commit, or rolled back to one), waiting for it no longer than that. Never raises: it is on its way out."""
        budget = getattr(self._ctx, "checkpoint_before_leaving", None)
        info = getattr(self._ctx, "info", None)
        if budget is None or info is None or not getattr(self._ctx, "checkpoint_writer", False) \
                or not self._ctx.ledger.holds_commit:
            self.stop_writing()
            return
        step = step_of(state, self._ctx.ledger.commit_seq)
        if budget <= 0:
            why = "no time was left before its host's deadline"
            self.stop_writing(0.0)
        else:
            try:
                why = self._write_now(state, info, min(FLUSH_TIMEOUT_S, budget), leaving=True)
            except Exception as exc:  # on its way out: a failure here must not turn a clean exit into a crash
                why = f"{type(exc).__name__}: {exc}"
        log_leaving_write(self._ctx, step, why)

    def _write_now(self, state: Any, info: Any, timeout: float | None, *, leaving: bool) -> str | None:
        """Write ``state`` after the checkpoint in flight and stop the writer; None once it is stored, else why
        not. Both waits together take up to ``timeout`` (None: as long as the storage takes); ``leaving``: a
        commit stored already (the checkpoint in flight was of it) is not written again."""
        ends = None if timeout is None else time.monotonic() + timeout
        if self._writer is None:
            self._start_writing()
        writer = self._writer
        assert writer is not None
        self._wait(writer, timeout)
        last, seq = writer.stats().last_written, self._ctx.ledger.commit_seq
        if leaving and last is not None and last.extra.get("commit_seq") == seq and not writer.busy:
            self.stop_writing()
            return None
        written = writer.stats().written
        waited = f"{timeout or 0.0:g}s"  # reached only with a timeout: without one, both waits end with the write
        try:
            submitted = writer.submit(step_of(state, seq), _payload(state), self._meta(state, info))
        except CheckpointError as exc:
            submitted, why = False, str(exc)
        else:
            why = f"the previous checkpoint was still being written after {waited}"
        stored = self.stop_writing(None if ends is None else max(0.0, ends - time.monotonic()))
        if submitted and stored and writer.stats().written > written:
            return None
        if submitted:
            why = writer.stats().last_error or f"it was not stored within {waited}"
        return why


def log_leaving_write(ctx: Any, step: int, why: str | None) -> None:
    """Log what became of the checkpoint a last holder of the state wrote on its way out (``why``: None if stored)."""
    if why is None:
        log.info("worker %s: wrote the checkpoint of step %d, the last copy of the training state, before leaving",
                 ctx.worker_id, step)
    else:
        log.warning("worker %s: leaving with the last copy of the training state; its checkpoint (step %d) was not "
                    "written: %s", ctx.worker_id, step, why)


def wait_for_storage(wait: Callable[[float], bool], store: CheckpointStore, ctx: Any, timeout: float | None) -> bool:
    """Wait for writes to ``store`` with ``wait(seconds)`` (True once they are done) up to ``timeout`` (None: no
    limit); True when they are done. Meanwhile each :data:`PROGRESS_EVERY_S` in which the store's byte counter grew
    counts as the worker's progress (``ctx.progress``): the driver's ``--progress-timeout`` watch sees a worker
    that waits for storage that writes, and gives up on storage that moves no byte for that long, as on a stuck
    worker. Rank 0's writer and host 0's sharded writes (``durable.sharded``) are waited for alike."""
    ends = None if timeout is None else time.monotonic() + timeout
    progress = getattr(ctx, "progress", None)
    moved = store.bytes_written
    while True:
        left = PROGRESS_EVERY_S if ends is None else min(PROGRESS_EVERY_S, max(0.0, ends - time.monotonic()))
        if wait(left):
            return True
        if ends is not None and time.monotonic() >= ends:
            return False
        if progress is not None and store.bytes_written != moved:
            moved = store.bytes_written
            progress.mark()


def _payload(state: Any) -> Any:
    from cloud_elastic.checkpoint.payload import state_payload

    return state_payload(state)
