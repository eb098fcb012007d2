"""Durable checkpoints of a sharded model (``hvd.shard``): torch DCP files written by the workers of one host.

A replica's checkpoint is written by rank 0 alone (:mod:`cloud_elastic.worker.durable.rank_zero`).
With ``hvd.shard`` no worker holds the whole model: each worker of a host holds 1/S of it,
and every host holds all of it. So the workers of the host of rank 0 (cross rank 0) write
the checkpoint together, each its own shards, with torch's distributed checkpoint (DCP)
over the host's own group, into the folder ``dcp/`` of a new checkpoint folder of the
job's :class:`~cloud_elastic.checkpoint.store.CheckpointStore`. Rank 0 (local rank 0 of that
host) then writes the state's other values (``state.pt``, as for a replica: the step,
the sampler, any plain value) and the manifest, which lists DCP's files with their sizes
and SHA-256 digests (computed as each worker wrote its files: :mod:`cloud_elastic.checkpoint.dcp`).
A reader that finds the manifest finds every shard.

* **When.** At the first commit of a host that becomes host 0, then every
  ``--checkpoint-interval``, and at every commit while the driver is unreachable, each
  time only if this worker's previous write has finished. The host's local rank 0
  decides and tells its host-mates (a one-element broadcast over the host's group at
  each commit of host 0), so the host's workers always write together.
* **In the background.** At the commit, each worker copies its shards to host memory
  (on a GPU with DCP's own staging, ``_create_cpu_state_dict`` and ``_copy_state_dict``,
  into pinned memory; on a CPU by a clone; later checkpoints refill that copy while no write
  reads it, so it stays in host memory while the host is host 0) and the state's other values
  (``stage_payload``); then a thread of its own
  writes that copy with ``dcp.save`` over a Gloo group of the host's workers made for
  it (formed at the first write, so DCP's collectives never meet the training's on the
  host's group), and rank 0 publishes it. Training goes on meanwhile. A host-mate whose
  previous write is still running queues this one: at most two copies a worker. A worker
  leaving (:meth:`stop_writing`) waits for the writes up to 120 s (host 0's, sent away as the
  last holders of the state, then write the commit they leave at together: :meth:`leaving`); the end of training
  (:meth:`finish`) waits for them, and for its final write, as long as the storage takes,
  counting as progress while they move bytes (``rank_zero.wait_for_storage``). The final write is skipped only
  when every worker of the host proves that the last checkpoint it wrote or loaded holds its final state bit for
  bit (``durable.stored``: a digest of each write's copy against one of the live state). The host's
  workers ask each other each second whether a write is left (``durable.writes.HostWrites``), so none
  waits for local rank 0's publish inside a collective that the collective timeout ends. With
  ``CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES=sync`` (host memory too small for the copy), or on
  a GPU a torch without those staging functions, the write is synchronous: host 0's workers
  stop for it, and the other hosts wait for them at the next gradient averaging. A failed
  write is logged as a WARNING and reported to the driver (local rank 0: ``not_written``),
  and training goes on, as for replicas.
* **Loading.** In a round the driver formed ``from_checkpoint``, the workers of host 0 load the newest usable
  checkpoint: local rank 0 picks it and tells the others, each loads its shards with DCP (which reshards; tested:
  written by 2 workers a host, loaded into 1 or 3, ``tests/integration/test_sharded_checkpoint.py`` and
  ``test_sharded_final_checkpoint.py``; a reviewer's manual runs also loaded 3 a host on 2 hosts), and the round's
  state sync gives them to the other hosts. A load counts as stored (``durable.stored``): a resume that trains
  nothing rewrites nothing at its end. A newer checkpoint whose manifest is unreadable is passed over with a
  WARNING. Each file is checked against its manifest's digest before a byte of it is read; a checkpoint with a bad
  file (any worker's) or a bad ``state.pt`` is skipped for the previous one by every worker of the host together,
  and so is one that does not fit while an older one does (``failure.Misfits``). No usable checkpoint is a
  :class:`CheckpointError`: the worker exits rather than train from initial weights, as it does when none fits
  (another model: a ``mismatch`` failure naming the item, as a replicated one's: an item the state has no place
  for, a layer removed, or an optimizer of another class, which the manifest names, found before DCP reads). An
  optimizer reads the state its checkpoint holds (``dcp.load_target``): a parameter without any there (no gradient
  yet) starts without. A host-mate lost during the load (the driver aborts the round) is a ``CollectiveError``: the host
  leaves, its state counted as holding no commit, and another host may load it.
* **Storage.** Before host 0 first writes or loads, local rank 0 reads the driver's job record in the
  store (``durable.failure``): storage this host sees apart from the driver's ends the job in one line.
* **What is in it.** The sharded models and their optimizers (those over DTensor
  parameters) under their attribute names, as ``get_model_state_dict`` and
  ``get_optimizer_state_dict`` give them, each optimizer with the model that holds its
  parameters (``durable.parts``; an optimizer over several models ends the job at the first
  write), keyed by parameter name, so the layout may change between writing and loading;
  everything else in ``state.pt``.

Loading unpickles nothing from storage: DCP's metadata comes from its JSON copy (DCP's own
``.metadata`` pickle is never opened) and every item, tensor or not, is read with
``torch.load(weights_only=True)`` (docs/checkpoints.md, "Trust").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from cloud_elastic.checkpoint.api import CheckpointError, CheckpointInfo, CheckpointMismatch
from cloud_elastic.checkpoint.payload import (check_payload, load_state_payload, mismatch_of, stage_payload,
                                              state_payload)
from cloud_elastic.checkpoint.dcp import ShardCorrupt, dcp_reason, load_target, refused_item, saved_groups
from cloud_elastic.checkpoint.optimizer_fit import OPTIMIZER_CLASSES, check_optimizers, optimizer_classes
from cloud_elastic.checkpoint.safety import Unusable as _Unusable
from cloud_elastic.checkpoint.safety import causes, one_line, storage_reason
from cloud_elastic.checkpoint.store import CheckpointStore
from cloud_elastic.worker.comm import statecodec
from cloud_elastic.worker.commit.fingerprint import fingerprint
from cloud_elastic.worker.durable.failure import (CheckpointFailed, Misfits, SeesJob, reason_of, report,
                                                  report_not_written)
from cloud_elastic.worker.durable.parts import model_of, set_parts, sharded_parts
from cloud_elastic.worker.durable.rank_zero import log_leaving_write, wait_for_storage
from cloud_elastic.worker.durable.staging import stage as _stage
from cloud_elastic.worker.durable.stored import Stored, digest
from cloud_elastic.worker.durable.writes import HostWrites as _HostWrites
from cloud_elastic.worker.durable.writes import Writes as _Writes
from cloud_elastic.worker.exceptions import CollectiveError

__all__ = ["ShardedCheckpoints", "sharded_parts"]

log = logging.getLogger(__name__)

#: How long a leaving worker waits for the writes in the background (the end of training has no limit).
FLUSH_TIMEOUT_S = 120.0


class ShardedCheckpoints:
    """Host 0's checkpoint schedule and the loading of a sharded checkpoint (see the module docstring).

    A ``DurableSchedule`` (``durable.api``), as :class:`~cloud_elastic.worker.durable.rank_zero.RankZeroCheckpoints`
    is; ``elastic.run`` uses it in that one's place once ``hvd.shard`` has formed the host's group.
    """

    def __init__(self, settings: Any, ctx: Any, *, clock: Callable[[], float] = time.monotonic,
                 store: CheckpointStore | None = None) -> None:
        self.settings = settings
        self._ctx = ctx
        self._clock = clock
        self.store = store if store is not None else CheckpointStore(settings.url, keep=settings.keep)
        self._last: float | None = None  # when this host last wrote one while it was host 0
        self._stored: Stored | None = None  # what this worker's last write (or load) holds, once it is stored
        self._writes = _Writes()
        self._group: Any = None  # the Gloo group of the host's workers that background writes use
        self._staged: Any = None  # the host copy of the last background write, refilled by the next
        self._sees_job = SeesJob(self.store, settings.url, ctx)  # local rank 0 reads the job record (durable.failure)

    def loads_here(self, info: Any) -> bool:
        """Whether this worker loads the checkpoint in a ``from_checkpoint`` round: every worker of host 0."""
        return info.cross_rank == 0

    # ------------------------------------------------------------- writing
    def after_commit(self, state: Any) -> None:
        """The ledger's after-commit hook: host 0's workers write a checkpoint together when one is due."""
        info = getattr(self._ctx, "info", None)
        if info is None or info.cross_rank != 0:
            self._last = None  # if this host becomes host 0, it writes at its first commit there
            self._staged = None
            return
        driver_lost = bool(getattr(self._ctx, "driver_lost", False))
        due = driver_lost or self._last is None or self._clock() - self._last >= self.settings.interval_s
        if self._agree(due and self._writes.idle):
            why = self._write(state, background=True)
            if why is not None and info.local_rank == 0:  # one report for the host
                report_not_written(self._ctx, why, self._step(state))

    def stop_writing(self, timeout: float | None = FLUSH_TIMEOUT_S) -> bool:
        """Wait (up to ``timeout``; None: as long as they take) for this worker's writes in the background, counting
        as progress while they move bytes; True when none is left."""
        return wait_for_storage(self._writes.wait, self.store, self._ctx, timeout)

    def leaving(self, state: Any) -> None:
        """This worker was sent away: wait for its writes in the background. The workers of the one host the driver
        picked among the last holders of the state sent away with no successor (``ctx.checkpoint_before_leaving``,
        given to that host's alone: a stop, or every host draining; by the order they left in, not by their last
        round, whose host 0 may be gone) first write a checkpoint of the commit they leave at together, on the
        training thread over the host's group (they leave at the same commit, and their group is still up), unless
        that commit is stored already or a write in flight is not done within the time the driver gave. Never
        raises: the worker is on its way out."""
        budget = getattr(self._ctx, "checkpoint_before_leaving", None)
        info = getattr(self._ctx, "info", None)
        if budget is None or info is None:
            self.stop_writing()
            return
        step = self._ctx.ledger.commit_seq
        try:
            step = self._step(state)
            why = self._write_leaving(state, budget)
        except Exception as exc:  # noqa: BLE001 - on its way out: a failure must not turn a clean exit into a crash
            why = one_line(exc)
        log_leaving_write(self._ctx, step, why)

    def _write_leaving(self, state: Any, budget: float) -> str | None:
        """:meth:`leaving`'s write, on every worker of host 0 alike (the same collectives whatever each one saw)."""
        ctx = self._ctx
        done = budget > 0 and self.stop_writing(min(FLUSH_TIMEOUT_S, budget))
        seq = ctx.ledger.commit_seq
        # Whether every worker of the host is done writing and holds one same commit exactly.
        mine = [int(not done), int(not ctx.ledger.holds_commit), seq, -seq]
        flags = torch.tensor(mine, dtype=torch.int64, device=ctx.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        not_done, not_held, newest, oldest = (int(v) for v in flags.tolist())
        if not_done:
            return f"a write in flight was not done within the {max(0.0, budget):g}s the driver gave"
        if not_held or newest != -oldest:
            return "the host's workers do not hold one same commit"
        stored = self._stored
        if not self._agree(stored is None or stored.seq != seq):  # local rank 0's word: it published that write
            return None  # that commit's checkpoint is stored already
        return self._write_watched(state)

    def finish(self, state: Any) -> str | None:
        """Training completed: host 0's workers write the final state; None when stored (or not host 0), else why not.

        The writes in the background, then the final one, are waited for as long as the storage takes (no time limit
        of our own: a finished job's last checkpoint is its result); each second in which they moved bytes counts
        as this worker's progress, so storage that moves none for ``--progress-timeout`` ends the round."""
        info = getattr(self._ctx, "info", None)
        if info is None or info.cross_rank != 0:
            return None
        log.info("worker %s: training completed; waiting for the final checkpoint as long as the storage takes",
                 self._ctx.worker_id)
        host = _HostWrites(self._writes, self.store, self._ctx.device)  # local rank 0 publishes after the others
        wait_for_storage(host.wait, host, self._ctx, None)
        # The final write is skipped only when every worker of the host proves that the last checkpoint holds its
        # final state bit for bit (``durable.stored``): the same commit, no step since (a loop that commits every few
        # steps), and its digest of the live shards, buffers and optimizer state equal to the write's (parameters
        # rewritten after the last commit: an EMA swap, the best weights loaded back; a BatchNorm forward; an lr set
        # by hand); local rank 0 also compares the other values (a script's `state.epoch += 1`). Each worker holds
        # its own shards, so each votes: any difference writes. A job's end rewriting an unchanged checkpoint would
        # cost a write and, with --checkpoint-keep, an older checkpoint; the proof costs one pass over the state.
        ledger = self._ctx.ledger
        held = self._stored is not None and not getattr(ledger, "steps_since_commit", 0) and \
            self._stored.holds(state, ledger.commit_seq, info.local_rank == 0, self._mark)
        if not self._anyone(not held):
            return None  # the last checkpoint, written (or loaded) by these very workers, holds the final state
        why = self._write_watched(state)
        if why is None:
            return None
        return f"the final checkpoint (step {self._step(state)}) was not written: {why}"

    def _write_watched(self, state: Any) -> str | None:
        """Write ``state`` on this thread (over the host's group), its bytes counted as progress meanwhile."""
        done = threading.Event()  # the write runs on this thread (the host's group): another one watches its bytes
        watch = threading.Thread(target=wait_for_storage, args=(done.wait, self.store, self._ctx, None), daemon=True,
                                 name="cloud-elastic-final-checkpoint-progress")
        watch.start()
        try:
            return self._write(state, background=False)
        finally:
            done.set()
            watch.join()

    def _agree(self, mine: bool) -> bool:
        """Local rank 0's answer, on every worker of the host (the host's own group is torch's default group)."""
        flag = torch.tensor([int(mine)], dtype=torch.int64, device=self._ctx.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _anyone(self, mine: bool) -> bool:
        """Whether any worker of the host answers True (a vote over the host's group)."""
        return self._worst(int(mine)) > 0

    def _mark(self) -> None:
        """A digest pass moved on (``durable.stored``): tens of GB take tens of seconds, not a stall to the driver's
        ``--progress-timeout`` watch."""
        progress = getattr(self._ctx, "progress", None)
        if progress is not None:
            progress.mark()

    def _step(self, state: Any) -> int:
        from cloud_elastic.worker.durable.rank_zero import step_of

        return step_of(state, self._ctx.ledger.commit_seq)

    def _write(self, state: Any, background: bool) -> str | None:
        """Write the committed state (with ``background``, a copy of it, on this worker's writer thread); None when
        stored or handed to the thread, else why not (logged; the previous checkpoints stay)."""
        ctx, info = self._ctx, self._ctx.info
        began = time.perf_counter()
        try:
            step, seq = self._step(state), ctx.ledger.commit_seq
        except CheckpointError as exc:  # a negative step, the same on every worker of the host: end the job
            raise CheckpointFailed("write", report(ctx, "write", str(exc))) from None
        self._last = self._clock()
        try:
            tensors, skip = sharded_parts(state)
            rest = state_payload(state, skip) if info.local_rank == 0 else None
            # Decided for the host before anyone queues a write: a host-mate whose DCP save waited for a local
            # rank 0 that refused the payload would wait out the group's timeout, and queue again each interval.
            name = _decided_by_local_rank_0(info, lambda: (_holdable(rest), self._sees_job.within(),
                                                           self.store.reserve(step))[2], ctx.device)
            rest = stage_payload(rest) if rest is not None else None  # training changes them
            meta = {"world_size": info.size, "job_id": ctx.job_id, "commit_seq": seq, "hosts": info.cross_size,
                    OPTIMIZER_CLASSES: optimizer_classes(state, skip)}
            epoch = getattr(state, "epoch", None)
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                meta["epoch"] = epoch
            job = (name, step, seq, meta, info.local_rank, info.local_size, began)
            staged = None
            if background and self.settings.background:
                # The last copy is refilled unless a write of this worker still reads it.
                staged = self._staged = _stage(tensors, self._staged if self._writes.idle else None)
            if staged is not None:
                if self._group is None:  # every worker of the host is here: a collective of the host's group
                    from cloud_elastic.worker.sharded import loopback_gloo

                    try:
                        with loopback_gloo("gloo"):
                            self._group = dist.new_group(backend="gloo")
                    except RuntimeError as exc:  # its store is the driver's: unreachable while the driver is away
                        raise CheckpointError(f"could not form the host's group for checkpoints: "
                                              f"{' '.join(str(exc).split())[:200]}") from exc
                self._writes.put(lambda: self._store(staged, rest, *job, group=self._group, report=True))
                return None
            self._store(tensors, rest, *job, group=None)
        except CheckpointFailed as exc:  # every worker of the host tells the driver before it exits
            raise CheckpointFailed(exc.failure, report(ctx, exc.failure, str(exc))) from None
        except CheckpointError as exc:
            log.warning("worker %s: the sharded checkpoint of step %d was not written: %s", ctx.worker_id, step, exc)
            return str(exc)
        return None

    def _store(self, tensors: dict[str, Any], rest: Any, name: str, step: int, seq: int, meta: dict[str, Any],
               local_rank: int, local_size: int, began: float, *, group: Any, report: bool = False) -> None:
        """Save the shards with DCP, then (local rank 0) publish them with the other values; CheckpointError if not
        (with ``report``, a write in the background, local rank 0 first tells the driver)."""
        try:
            self._store_now(tensors, rest, name, step, seq, meta, local_rank, local_size, began, group=group)
        except CheckpointError as exc:
            if report and local_rank == 0:
                report_not_written(self._ctx, str(exc), step)
            raise

    def _store_now(self, tensors: dict[str, Any], rest: Any, name: str, step: int, seq: int, meta: dict[str, Any],
                   local_rank: int, local_size: int, began: float, *, group: Any) -> None:
        self._stored = None
        storage = self.store.shard_storage(name, writing=True)
        _save(tensors, storage, group)
        if local_rank == 0:  # DCP's coordinator: it holds every file's digest
            self._ctx.report_checkpoint("writing", step=step, commit_seq=seq)  # heard of before it can exist
            saved = self.store.publish_sharded(name, step, rest, meta, local_size, getattr(storage, "files", None))
            self._ctx.report_checkpoint("saved", step=saved.step, path=saved.url, commit_seq=seq,
                                        duration_s=round(time.perf_counter() - began, 3),
                                        bytes=saved.size + sum((saved.shards or {}).values()))
        # What it wrote, for the end of training (``durable.stored``): digested from the write's copy on the writer's
        # thread, after the publish (a synchronous write digests the live state it just wrote, on the training one).
        self._stored = Stored(seq, digest(tensors, self._mark), rest)

    # -------------------------------------------------------------- loading
    def _sharded_candidates(self) -> list[CheckpointInfo]:
        """Local rank 0: the manifests of the sharded checkpoints to try, newest first (their data not verified
        yet). CheckpointError when there is none, or when the newest is a replica's."""
        self._sees_job.within()
        candidates: list[CheckpointInfo] = []
        for listed in self.store.list():
            if listed.shards is None:
                self._warn_unreadable(newer_than=listed.name)
                if not candidates:
                    raise CheckpointError(f"the newest checkpoint in {self.settings.url} (step {listed.step}) holds a "
                                          "whole model, not shards: a job with hvd.shard loads only checkpoints "
                                          "written with hvd.shard")
                break
            candidates.append(listed)
        else:
            self._warn_unreadable(newer_than=None)
        if not candidates:
            raise CheckpointError(f"no usable checkpoint in {self.settings.url}")
        return candidates

    def _warn_unreadable(self, newer_than: str | None) -> None:
        """One WARNING for each checkpoint (newer than the folder ``newer_than``) whose manifest is there but cannot
        be read, a torn or corrupt one: ``store.list`` passes it over without a word, where ``store.latest`` (a
        replica's load) says so."""
        try:
            unreadable = self.store.unreadable()
        except CheckpointError as exc:
            log.warning("worker %s: could not look for unreadable checkpoints: %s", self._ctx.worker_id, exc)
            return
        for name, why in unreadable:
            if newer_than is None or name > newer_than:
                log.warning("checkpoint %s is unusable (%s); falling back to the previous one",
                            self.store.backend.url(name), why)

    def load_latest(self, state: Any) -> CheckpointInfo:
        """Load the newest usable sharded checkpoint into ``state`` on every worker of this host (a collective over
        the host's group); make it the state's last commit.

        A checkpoint whose ``state.pt`` or any shard file differs from its manifest, or that does not fit this
        state while an older one does, is skipped for the previous one, on every worker of the host alike.
        CheckpointError when none is usable or the storage cannot be read; CheckpointFailed (``mismatch``) when none
        fits; CollectiveError when a worker of this host was lost meanwhile (the driver aborted the round): this
        host leaves, and another may load it."""
        try:
            return self._load_latest(state)
        except (RuntimeError, _DCP_ERROR) as exc:  # one of the host's collectives around DCP's load
            if not self._peer_lost(exc):
                raise
            raise self._cut_short(exc) from exc

    def _load_latest(self, state: Any) -> CheckpointInfo:
        ctx, info = self._ctx, self._ctx.info
        began = time.perf_counter()
        candidates = _decided_by_local_rank_0(info, self._sharded_candidates, ctx.device)
        misfits = Misfits(self.settings.url)
        for chosen in candidates:
            seq = chosen.extra.get("commit_seq", chosen.step)
            seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else chosen.step
            try:
                checkpoint, skip = self._load_one(state, chosen)
                load_state_payload(state, checkpoint.payload, skip)
            except _Fallback as exc:
                log.warning("worker %s: checkpoint %s is unusable (%s); falling back to the previous one",
                            ctx.worker_id, chosen.url, exc)
                continue
            except CheckpointMismatch as exc:  # another model's (all of them then), or one altered since written
                state.restore()  # its shards may be loaded already
                misfits.add(exc, seq)
                continue
            misfits.passed_over(ctx.worker_id, chosen.step)
            ctx.ledger.hold_commit(seq)
            # What it holds: a resume that trains nothing writes nothing at its end.
            self._stored = Stored.loaded(state, seq, info.local_rank == 0, self._mark)
            ctx.loaded_commit = seq  # held by a load, which fits any FSDP-unit layout: no say in the job's layout
            log.info("worker %s: loaded its shards of the checkpoint of step %d (written by %s workers a host) from "
                     "%s in %.2fs", ctx.worker_id, chosen.step, chosen.shard_count, chosen.url,
                     time.perf_counter() - began)
            if info.rank == 0:
                ctx.report_checkpoint("loaded", step=chosen.step, path=chosen.url, commit_seq=seq,
                                      trained=fingerprint(state))  # the driver's repeat guards measure it
            return chosen
        if misfits.first is not None:  # another model's, every one: nothing is lost, and the job says so
            raise misfits.failure() from misfits.first[0]
        raise CheckpointError(f"no usable checkpoint in {self.settings.url}: its {len(candidates)} sharded "
                              "checkpoint(s) are unusable")

    def _load_one(self, state: Any, chosen: CheckpointInfo) -> tuple[Any, frozenset[str]]:
        """``chosen``'s other values (verified) and its shards, loaded into ``state``, with the names of the sharded
        attributes; _Fallback (on every worker of the host) when it is unusable, the state left at its last commit."""
        storage = None
        try:
            checkpoint, trouble, why = self.store.load(chosen), _OK, ""
            storage = self.store.shard_storage(chosen.name, writing=False, info=chosen)
            storage.read_metadata()  # verified and parsed here, where a failure is ours to report (DCP would retry it)
        except _Unusable as exc:
            checkpoint, trouble, why = None, _UNUSABLE, str(exc)
        except CheckpointError as exc:
            checkpoint, trouble, why = None, _UNREADABLE, str(exc)
        except Exception as exc:  # noqa: BLE001 - raised here alone, it would leave the host-mates in the all-reduce
            checkpoint, trouble, why = None, _UNREADABLE, f"could not read {chosen.url}: {one_line(exc)}"
        worst = self._worst(trouble)  # every worker of the host goes the same way
        if worst == _UNREADABLE:
            raise CheckpointError(why or f"a worker of this host could not read {chosen.url}")
        if worst == _UNUSABLE:
            raise _Fallback(why or "a worker of this host found it unusable")
        tensors, skip = sharded_parts(state)
        try:
            # Decided alike on every worker of the host (one manifest, one metadata, one model): no collective.
            metadata = storage.read_metadata()
            tensors = load_target(tensors, _optimizers(state, tensors, chosen, metadata), metadata)
            _load(tensors, storage)
            set_parts(state, tensors)
        except CheckpointMismatch:  # another model, or an optimizer's groups lacking keys, found before any read
            raise
        except (Exception, _DCP_ERROR) as exc:
            state.restore()
            corrupt, unreadable = reason_of(exc, ShardCorrupt) or refused_item(exc), reason_of(exc, CheckpointError)
            if corrupt is not None:  # DCP hands every worker every worker's failure: all of them fall back
                raise _Fallback(corrupt) from exc
            if unreadable is not None:
                raise CheckpointError(unreadable) from exc
            if self._peer_lost(exc):  # a host-mate died in DCP's collectives: not the checkpoint's fault
                raise self._cut_short(exc) from exc
            first = next(filter(None, map(mismatch_of, causes(exc, None))), None)
            if first is not None:  # DCP's planner names the item that another model lacks or shapes otherwise
                raise CheckpointMismatch(first) from exc
            raise CheckpointError(f"could not load the shards of {chosen.url}: {dcp_reason(exc)}") from exc
        return checkpoint, skip

    def _peer_lost(self, exc: BaseException) -> bool:
        """Whether ``exc``, a cause of it or a worker's failure DCP hands on is a lost peer's (``sharded.peer_lost``)."""
        from cloud_elastic.worker.sharded import peer_lost

        return any(peer_lost(self._ctx, c) for c in causes(exc, None) if isinstance(c, RuntimeError))

    def _cut_short(self, exc: BaseException) -> CollectiveError:
        """The load was cut short: the state, back at this process's own last commit (a fresh one's initial weights;
        DCP's failures are restored in :meth:`_load_one`, the collectives around it change nothing), must not pass
        for the job's: it counts as not held until a sync or a load gives it one."""
        self._ctx.ledger.lost_commit("a checkpoint load was cut short: its state is not the job's")
        return CollectiveError(f"loading the checkpoint failed: a worker of this host was lost "
                               f"({one_line(exc, 200)})")

    def _worst(self, trouble: int) -> int:
        flag = torch.tensor([trouble], dtype=torch.int64, device=self._ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


_OK, _UNUSABLE, _UNREADABLE = 0, 1, 2


def _optimizers(state: Any, tensors: dict[str, Any], chosen: CheckpointInfo, metadata: Any) -> dict[str, str]:
    """The sharded optimizers among ``tensors``, each by the name of the model that holds its parameters;
    OptimizerMismatch when one's param groups in DCP's ``metadata`` lack what its step reads (``optimizer_fit``)."""
    parts = {n: getattr(state, n) for n in tensors}
    optimizers = {n: v for n, v in parts.items() if isinstance(v, torch.optim.Optimizer)}
    check_optimizers(optimizers, {n: saved_groups(n, metadata) for n in optimizers},
                     chosen.extra.get(OPTIMIZER_CLASSES))
    models = {n: v for n, v in parts.items() if n not in optimizers}
    return {n: model_of(n, v, models) for n, v in optimizers.items()}


class _Fallback(Exception):
    """This checkpoint is unusable on every worker of the host: try the previous one."""


def _holdable(payload: Any) -> None:
    """A write CheckpointFailed if a checkpoint cannot hold ``payload`` (a state's other values): every commit
    would be refused alike, so the job ends rather than train on without checkpoints."""
    try:
        check_payload(payload)
    except CheckpointError as exc:
        raise CheckpointFailed("write", str(exc)) from None


def _decided_by_local_rank_0(info: Any, decide: Callable[[], Any], device: Any) -> Any:
    """``decide()`` on local rank 0 (a checkpoint's name, or a list of :class:`CheckpointInfo`), its value (or its
    CheckpointError, raised: a CheckpointFailed as one) on every worker of the host."""
    answer: list[Any] = [None, None, None]
    if info.local_rank == 0:
        try:
            value = decide()
            answer[0] = [{f.name: getattr(c, f.name) for f in dataclasses.fields(c)} for c in value] \
                if isinstance(value, list) else value
        except CheckpointError as exc:
            answer[1:] = [str(exc), exc.failure if isinstance(exc, CheckpointFailed) else None]
    answer = _from_local_rank_0(answer, info.local_rank == 0, device)
    if answer[1]:
        raise CheckpointFailed(answer[2], answer[1]) if answer[2] else CheckpointError(answer[1])
    return [CheckpointInfo(**c) for c in answer[0]] if isinstance(answer[0], list) else answer[0]


#: The most bytes local rank 0's decision may announce (a list of manifests: kilobytes).
_MAX_DECISION_BYTES = 16 << 20


def _from_local_rank_0(obj: Any, root: bool, device: Any) -> Any:
    """Local rank 0's ``obj`` (plain data) on every worker of the host's group. Nothing authenticates
    torch.distributed traffic, so what crosses it travels in the state sync's safe form (``statecodec``: loaded
    with ``weights_only``), never as a pickle (docs/security.md); a forged or oversized one is a CheckpointError."""
    data = statecodec.encode(obj, "the host's checkpoint decision") if root else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    n = int(size.item())
    if not 0 < n <= _MAX_DECISION_BYTES:
        raise CheckpointError(f"local rank 0's checkpoint decision announces {n} bytes: corrupt or forged")
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if root else torch.empty(n, dtype=torch.uint8)
    buf = buf.to(device)
    dist.broadcast(buf, src=0)
    if root:
        return obj
    try:
        return statecodec.decode(buf.cpu().numpy().tobytes(), "the host's checkpoint decision")
    except statecodec.StateSyncError as exc:
        raise CheckpointError(str(exc)) from None


#: What DCP raises when a rank failed (a BaseException in torch): a load that failed on any worker.
try:
    from torch.distributed.checkpoint.api import CheckpointException as _DCP_ERROR
except ImportError:  # pragma: no cover - a build without DCP cannot shard either
    _DCP_ERROR = RuntimeError


def _save(tensors: dict[str, Any], storage: Any, group: Any = None) -> None:
    import torch.distributed.checkpoint as dcp

    try:
        dcp.save(tensors, storage_writer=storage, process_group=group)
    except (_DCP_ERROR, RuntimeError, OSError) as exc:  # a worker's write failed (every worker gets it), or a
        # host-mate died; a full disk is said so, not as torch's "unexpected pos ..."
        seen = (getattr(storage, "io_errors", None) or [None])[0]
        raise CheckpointError(f"torch DCP could not write the shards: {storage_reason(exc, seen)[:300]}") from exc


def _load(tensors: dict[str, Any], storage: Any) -> None:
    import torch.distributed.checkpoint as dcp

    from cloud_elastic.checkpoint.dcp import safe_load_planner

    dcp.load(tensors, storage_reader=storage, planner=safe_load_planner())
