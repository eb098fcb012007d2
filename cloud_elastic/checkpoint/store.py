"""``CheckpointStore``: durable, atomic, verified checkpoints in a local directory or any fsspec URL.

Layout below the store's URL::

    job.json                                          the job record (write_job_record)
    driver-alive.json                                 the running driver's sign of life (checkpoint.alive)
    drivers/<generation>.json                         the newest drivers' claims (checkpoint.claims)
    succeeded.json                                    the job succeeded, at which step (driver.restart.finished)
    checkpointed.json                                 the newest checkpoint written: its job, step and folder
    ckpt-20261123T143012123456Z-step000000001200/
        state.pt                                      torch.save(payload), written first
        manifest.json                                 written last: step, digest, ...
    ckpt-...-step000000001300/                        a sharded checkpoint (hvd.shard, checkpoint.sharded):
        dcp/                                          torch DCP's files, by the workers of one host, first,
                                                      and metadata.json (checkpoint.dcp)
        state.pt                                      the state's other values
        manifest.json                                 last, listing dcp/'s files, sizes and SHA-256 digests

A checkpoint exists once its manifest does. The data object is written and
published first, the manifest after it, so a reader that finds a manifest
finds the whole data it describes; a writer that dies in between leaves a
folder without a manifest, which readers skip and a later save deletes once no writer can be at work in it.
Folder names sort in the order they were written (UTC time, kept increasing
past the newest existing name), which is the order ``latest()`` tries them.

The payload is ``torch.save`` output of tensors and plain data and is loaded
with ``torch.load(weights_only=True)``: nothing in a checkpoint can run code.
The store lists no symbolic link and no folder whose name holds an impossible
time: it never loads, follows or deletes what it did not write. A link named
like a checkpoint counts as an unreadable one (``unreadable()``), never as none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, TypeVar

from cloud_elastic.checkpoint.api import (FORMAT, FORMAT_VERSION, READ_VERSION, SHARDED_FORMAT_VERSION, Checkpoint,
                                          CheckpointError, CheckpointInfo, DurableJobRecord)
from cloud_elastic.checkpoint.backend import Backend, Digest, Oversize, backend_for
from cloud_elastic.checkpoint.manifest import DATA, SHARDS_DIR, checkpoint_info, new_manifest, record_body, split_meta
from cloud_elastic.checkpoint.safety import Unusable as _Unusable
from cloud_elastic.checkpoint.safety import one_line as _one_line
from cloud_elastic.checkpoint.safety import COPY_FACTOR, COPY_SLACK, check_loaded, safe_load, storage_reason
from cloud_elastic.errors import ConfigError

__all__ = ["CheckpointStore", "checked_step", "write_job_record", "read_job_record"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"
#: DCP's metadata as JSON (checkpoint.dcp): what this cloud-elastic reads instead of the pickled ``.metadata``.
DCP_METADATA_JSON = "metadata.json"  # the same as checkpoint.dcp.METADATA_JSON
JOB_RECORD = "job.json"
#: The newest checkpoint written, kept beside the folders: a start that finds no folder but this record knows the
#: job's state was there, and does not train it again from initial weights (``driver.restart.stored``).
CHECKPOINTED_RECORD = "checkpointed.json"
#: The most a manifest, the job record or the driver's alive record may hold: each is a few hundred bytes to a
#: few KiB (a manifest lists a sharded checkpoint's files), and storage is not trusted with the reader's memory.
MAX_RECORD_BYTES = 4 * 1024 * 1024
_NAME = re.compile(r"ckpt-(\d{8}T\d{12})Z-step(\d+)")
_TIME_FORMAT = "%Y%m%dT%H%M%S%f"
#: Folder times from this one on are impossible: no later name could follow them (datetime ends at 9999).
_END_OF_TIME = datetime(9000, 1, 1, tzinfo=timezone.utc)
#: Why a folder is no checkpoint (yet): an interrupted write, or one whose manifest is still to come.
_NO_MANIFEST = "no manifest"
#: A folder without a manifest and without a lock to tell is kept while its newest file is younger than this, or
#: than this many times the longest write this store timed: another host's writer may be at work in it.
_LIVE_MIN_S = 3600.0
_LIVE_WRITES = 4


class CheckpointStore:
    """Checkpoints under ``url`` (a local path or an fsspec URL), keeping the newest ``keep`` that verify.

    The constructor does no I/O; it fails at once, with the pip extra to
    install, when the URL's fsspec implementation is missing. Methods may be
    called from several threads (the background writer and a reader).
    """

    def __init__(self, url: str, keep: int = 2, storage_options: Mapping[str, Any] | None = None, *,
                 backend: Backend | None = None) -> None:
        if keep < 1:
            raise CheckpointError(f"a checkpoint store keeps at least 1 checkpoint, got keep={keep}")
        self.url = url
        self.keep = keep
        # ``backend`` replaces the one ``url`` would select (custom storage, tests of slow storage).
        self._make_backend = (lambda: backend) if backend is not None else backend_for(url, storage_options)
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        self._last_time = datetime.min.replace(tzinfo=timezone.utc)
        self._ignored: set[str] = set()  # names like a checkpoint's with impossible times, warned about once
        self._kept_unverified: set[str] = set()  # checkpoints pruning kept without counting, warned about once
        self._writing: set[str] = set()  # folders this store's saves are writing now (several threads may save)
        self._longest_write_s = 0.0
        #: The bytes its saves and shard writers have written: it grows while a write moves bytes, and only then.
        self.bytes_written = 0

    def _moved(self, count: int) -> None:
        self.bytes_written += count

    @property
    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._make_backend()
            return self._backend

    # -- writing -------------------------------------------------------------------

    def save(self, step: int, payload: Any, meta: Mapping[str, Any] | None = None) -> CheckpointInfo:
        """Write ``payload`` as the checkpoint of ``step``; data first, manifest last; then prune.

        ``meta`` may give ``epoch``, ``world_size`` and ``job_id`` (recorded in
        the manifest) and any other JSON values (kept under ``extra``).
        Raises CheckpointError when ``step`` is negative, the payload holds something but tensors and plain data
        or what every load refuses (``safety.check_loaded``: an expanded view, a storage referenced over and over,
        checked against the size written), or storage refuses the write: the previous checkpoints stay, its own
        folder goes. It first deletes
        interrupted writes (:meth:`_clear_interrupted`), which would fill the storage for good.
        """
        from cloud_elastic.checkpoint.payload import check_payload  # torch: see _publish

        step = checked_step(step)
        version = check_payload(payload)
        existing = self._clear_interrupted(self._names())
        return self._publish(self._new_name(step, existing), existing, step, payload, meta, version=version)

    # -- sharded checkpoints (hvd.shard) ----------------------------------------------

    def reserve(self, step: int) -> str:
        """The folder name of a new sharded checkpoint of ``step``; nothing is written.

        The workers that hold the shards write them into ``shard_storage(name)`` (torch DCP), then one
        of them calls :meth:`publish_sharded`: until then the folder has no manifest, so readers skip it.
        """
        return self._new_name(checked_step(step), self._names())  # CheckpointError when ``step`` is negative

    def shard_storage(self, name: str, writing: bool, info: CheckpointInfo | None = None) -> Any:
        """torch DCP's storage writer for the shards of the checkpoint folder ``name``, or the reader of those
        ``info`` (its manifest) lists, which reads only files matching their SHA-256 (checkpoint.dcp)."""
        expected = None
        if not writing:
            if info is None or info.shards is None or info.shard_digests is None:
                raise _Unusable("its manifest lists no SHA-256 digests of its shard files")
            expected = {f: (info.shards[f], info.shard_digests[f]) for f in info.shard_digests}
        return self.backend.dcp_storage(f"{name}/{SHARDS_DIR}", writing, expected, moved=self._moved)

    def publish_sharded(self, name: str, step: int, payload: Any, meta: Mapping[str, Any] | None,
                        shard_count: int, files: Mapping[str, tuple[int, str]] | None) -> CheckpointInfo:
        """Once every shard is in ``name`` (DCP's save returned): ``payload`` (the state's other values), then the
        manifest, which lists the shards' files with the size and SHA-256 each had as it was written (``files``,
        from the writer of :meth:`shard_storage`); then prune."""
        from cloud_elastic.checkpoint.payload import check_payload  # torch: see _publish

        version = max(check_payload(payload), SHARDED_FORMAT_VERSION)
        if not files or DCP_METADATA_JSON not in files:
            raise CheckpointError(f"the shards of {self.backend.url(name)} have no digests: the DCP save did not "
                                  "finish on this worker")
        try:
            found = self.backend.sizes(f"{name}/{SHARDS_DIR}")
        except Exception as exc:
            raise CheckpointError(f"could not list the shards of {self.backend.url(name)}: {_one_line(exc)}") from exc
        wrong = sorted(f for f, (size, _) in files.items() if found.get(f) != size)
        if wrong:
            raise CheckpointError(f"the shard files {', '.join(wrong[:3])} of {self.backend.url(name)} are missing or "
                                  "not the size they were written with")
        return self._publish(name, self._names(), step, payload, meta, shards=dict(files), shard_count=shard_count,
                             version=version)

    def _publish(self, name: str, existing: list[str], step: int, payload: Any, meta: Mapping[str, Any] | None,
                 shards: Mapping[str, tuple[int, str]] | None = None, shard_count: int | None = None, *,
                 version: int = FORMAT_VERSION) -> CheckpointInfo:
        # Imported by the writers and readers of a payload only: the driver opens the store (lists, records, claims)
        # and never a payload, and an import of torch was most of its CPU at start-up (about 1.2 CPU-seconds).
        import torch

        fields, extra = split_meta(meta)
        backend = self.backend
        digest = Digest(self._moved)
        began = time.monotonic()
        self._writing.add(name)
        try:
            backend.write(f"{name}/{DATA}", lambda f: torch.save(payload, digest.wrap(f)))
            # What every load would refuse is not published (an expanded view, a block shared past the copy bound).
            check_loaded(payload, DATA, COPY_FACTOR * digest.size + COPY_SLACK, refused=_unloadable)
            created = time.time()
            data = {"name": DATA, "size": digest.size, "sha256": digest.hexdigest()}
            manifest = new_manifest(step, version, created, fields, extra, data, torch.__version__, shards, shard_count)
            body = json.dumps(manifest, indent=1, sort_keys=True).encode()
            backend.write(f"{name}/{MANIFEST}", lambda f: f.write(body))
        except Exception as exc:
            self._remove(name, "of the save that failed")  # what it wrote would fill the storage for good
            raise CheckpointError(f"could not write checkpoint {backend.url(name)}: "
                                  f"{storage_reason(exc, digest.error)}") from exc
        finally:
            self._writing.discard(name)
        self._longest_write_s = max(self._longest_write_s, time.monotonic() - began)
        info = checkpoint_info(name, backend.url(name), manifest)
        log.info("checkpoint of step %d written to %s (%d bytes%s)", step, info.url, digest.size,
                 "" if shards is None else f", and {sum(size for size, _ in shards.values())} bytes of shards")
        self._record_newest(info)
        self._prune(name, existing)
        return info

    def _record_newest(self, info: CheckpointInfo) -> None:
        """Write ``checkpointed.json`` for ``info``: a warning when storage refuses it, never a failed checkpoint (the
        record only lets a start that finds every folder gone refuse to train over what they held)."""
        body = json.dumps({"format": FORMAT, "job_id": info.job_id, "step": info.step, "name": info.name},
                          sort_keys=True).encode()
        try:
            self.backend.write(CHECKPOINTED_RECORD, lambda f: f.write(body))
        except Exception as exc:  # noqa: BLE001 - the checkpoint itself is written
            log.warning("could not record the checkpoint of step %d in %s: %s", info.step,
                        self.backend.url(CHECKPOINTED_RECORD), _one_line(exc))

    def _new_name(self, step: int, existing: list[str]) -> str:
        """A name that sorts after every checkpoint already there, even if this host's clock is behind."""
        now = datetime.now(timezone.utc)
        floor = max([self._last_time] + [_time_of(n) or self._last_time for n in existing[-1:]])
        if now <= floor:
            now = floor + (datetime.resolution * 1)
        if now >= _END_OF_TIME:  # only after a folder named within a microsecond of it, or a clock that far
            after = self.backend.url(existing[-1]) if existing else f"this host's clock ({now.isoformat()})"
            raise CheckpointError(f"no checkpoint name can follow {after}: move that folder away or set the clock")
        self._last_time = now
        return f"ckpt-{now.strftime(_TIME_FORMAT)}Z-step{int(step):012d}"

    def _prune(self, newest: str, existing: list[str]) -> None:
        """Delete the checkpoints older than the ``keep`` newest that verify; keep everything newer.

        A checkpoint verifies when its manifest reads and its files have the sizes the manifest lists (no
        digest: that would re-read every payload at every save); one that does not is kept while newer than
        the ``keep``-th that does, and does not count, so a torn, tampered or newer-format checkpoint never
        pushes the last readable one out. Nothing is deleted unless ``newest`` (just written) verifies, nor
        past a checkpoint the storage would not let us check. Folders without a manifest older than
        ``newest`` go too once :meth:`_interrupted` (no writer at work in them). A failure to delete is logged and
        retried at the next save.
        """
        backend = self.backend
        verified = 0
        for name in [newest] + list(reversed([n for n in existing if n < newest])):
            try:
                if name in self._writing:
                    continue  # another thread's save, its manifest still to come
                why = None
                if verified < self.keep:
                    why = self._unverified(name)
                    if why is None:
                        verified += 1
                        continue
                    if name == newest:
                        log.warning("checkpoint %s does not verify just after it was written (%s): deleting no "
                                    "older checkpoint", backend.url(name), why)
                        return
                    if why != _NO_MANIFEST:
                        if name not in self._kept_unverified:
                            self._kept_unverified.add(name)
                            log.warning("checkpoint %s does not verify (%s): kept, and not counted among the %d "
                                        "kept", backend.url(name), why, self.keep)
                        continue
                elif MANIFEST not in backend.sizes(name):
                    why = _NO_MANIFEST
                if why == _NO_MANIFEST and not self._interrupted(name):
                    continue  # a writer may be at work in it
                # Manifest first: a reader never finds a manifest whose data is being deleted.
                backend.remove_tree(name, first=MANIFEST)
                log.debug("deleted old checkpoint %s", backend.url(name))
            except Exception as exc:  # storage trouble must not fail the save that succeeded
                log.warning("could not check or delete old checkpoint %s: %s; deleting no older one until the "
                            "next save", backend.url(name), _one_line(exc))
                return

    def _clear_interrupted(self, existing: list[str]) -> list[str]:
        """Delete the folders of interrupted writes (no manifest, and :meth:`_interrupted`: never one a live writer
        may be at); ``existing`` less them."""
        gone: set[str] = set()
        newest_good = False
        try:
            for name in reversed(existing):
                if name in self._writing:
                    continue
                if newest_good:
                    interrupted = MANIFEST not in self.backend.sizes(name)
                else:
                    why = self._unverified(name)
                    newest_good = why is None
                    interrupted = why == _NO_MANIFEST
                if interrupted and self._interrupted(name):
                    self._remove(name, "of an interrupted write")
                    gone.add(name)
        except Exception as exc:  # storage trouble here is the save's to report, if it fails too
            log.warning("could not check for interrupted writes in %s: %s", self.url, _one_line(exc))
        return [n for n in existing if n not in gone]

    def _interrupted(self, name: str) -> bool:
        """Whether no writer is at work in the folder ``name`` (one without a manifest, not this store's save): the
        backend knows it ``abandoned`` (a dead writer's unlocked temporary files; a live lock: never), or, where no
        lock tells, nothing in it changed for :data:`_LIVE_MIN_S` nor :data:`_LIVE_WRITES` times the longest write
        here, by the storage's own modification times (not the name's: the writer's clock)."""
        gone = self.backend.abandoned(name)
        if gone is not None:
            return gone
        changed = self.backend.changed(name)
        live_s = max(_LIVE_MIN_S, _LIVE_WRITES * self._longest_write_s)
        return changed is not None and time.time() - changed > live_s

    def _remove(self, name: str, what: str) -> None:
        """Delete the folder ``name``, manifest first; a refusal is logged (with ``what`` it is), not raised."""
        try:
            self.backend.remove_tree(name, first=MANIFEST)
            log.info("deleted the folder %s %s", self.backend.url(name), what)
        except Exception as exc:
            log.warning("could not delete the folder %s %s: %s", self.backend.url(name), what, _one_line(exc))

    def _unverified(self, name: str) -> str | None:
        """None when ``name`` verifies (its manifest reads, its data and shard files have the sizes it lists),
        else why not (:data:`_NO_MANIFEST` for an interrupted write). Raises CheckpointError when the storage
        cannot be read: that says nothing about the checkpoint."""
        try:
            info = self._manifest(name)
            if self.backend.sizes(name).get(info.data_name) != info.size:
                raise _Unusable(f"its data {info.data_name} is missing or not the size its manifest says")
            if info.shards is not None:
                self._check_shards(info)
        except FileNotFoundError:
            return _NO_MANIFEST
        except _Unusable as exc:
            return str(exc)
        return None

    # -- reading -------------------------------------------------------------------

    def list(self) -> list[CheckpointInfo]:
        """Manifests of the complete checkpoints, newest first (data not verified)."""
        out = []
        for name in reversed(self._names()):
            try:
                out.append(self._manifest(name))
            except (FileNotFoundError, _Unusable):
                continue
        return out

    def unreadable(self) -> list[tuple[str, str]]:
        """(folder, why) of each checkpoint whose manifest is there but cannot be read (torn, corrupt, or of a
        newer cloud-elastic), and of each :meth:`links`, newest first: complete to their writer, so a job must not
        take them for none."""
        out = self.links()
        for name in self._names():
            try:
                self._manifest(name)
            except FileNotFoundError:
                continue  # an interrupted write: no manifest
            except _Unusable as exc:
                out.append((name, str(exc)))
        return sorted(out, reverse=True)

    def links(self) -> list[tuple[str, str]]:
        """(name, why) of each symbolic link named like a checkpoint (a folder moved to another volume and linked
        back), newest first. The store never follows one (it may be another folder's, which pruning would delete),
        nor takes it for no checkpoint: a driver's start refuses it (``driver.restart.predecessor.resumes``)."""
        try:
            names = sorted((n for n in self.backend.links("") if _NAME.fullmatch(n)), reverse=True)
        except Exception as exc:
            raise CheckpointError(f"could not list checkpoints in {self.url}: {_one_line(exc)}") from exc
        return [(n, f"{self.backend.url(n)} is a symbolic link, never followed: move the folder back") for n in names]

    def latest(self, before: str | None = None) -> Checkpoint | None:
        """The newest checkpoint whose manifest parses and whose data matches its digest and loads (with
        ``before``: the newest older than the checkpoint of that name, one its caller found not to fit).

        A torn or corrupt newer checkpoint is skipped with a one-line WARNING
        and the previous one is tried. None when there is no usable
        checkpoint. Raises CheckpointError when the storage cannot be read
        (network, permissions): falling back over a readable-but-unreachable
        checkpoint would silently lose progress.
        """
        for name in reversed([n for n in self._names() if before is None or n < before]):
            try:
                return self.load(self._manifest(name))
            except FileNotFoundError:
                log.info("skipping %s: no manifest (a write in progress or interrupted)", self.backend.url(name))
            except _Unusable as exc:
                log.warning("checkpoint %s is unusable (%s); falling back to the previous one",
                            self.backend.url(name), exc)
        return None

    def load(self, info: CheckpointInfo) -> Checkpoint:
        """Read, verify and load the checkpoint ``info`` describes.

        Raises _Unusable (a CheckpointError) when the data is missing, differs
        from its digest or holds anything but tensors and plain data.
        """
        if info.shards is not None:
            self._check_shards(info)
        path = f"{info.name}/{info.data_name}"
        try:
            data = self._read(path, info.size)
        except FileNotFoundError:
            raise _Unusable(f"its data {info.data_name} is missing") from None
        except Oversize:
            raise _Unusable("its data does not match the manifest's size and SHA-256 digest") from None
        if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
            raise _Unusable("its data does not match the manifest's size and SHA-256 digest")
        return Checkpoint(info, safe_load(data, info.data_name))

    def _check_shards(self, info: CheckpointInfo) -> None:
        """_Unusable unless a sharded checkpoint's manifest lists its shards' digests and its shard files are
        there with the sizes it lists; CheckpointError when they cannot be listed."""
        if info.shard_digests is None:
            raise _Unusable(f"its manifest has no SHA-256 digests of its shard files (written by an older "
                            f"cloud-elastic): its shards load only by unpickling DCP's {DCP_METADATA}, which this "
                            "cloud-elastic never does")
        try:
            found = self.backend.sizes(f"{info.name}/{SHARDS_DIR}")
        except Exception as exc:
            raise CheckpointError(f"could not list {self.backend.url(info.name)}: {_one_line(exc)}") from exc
        wrong = sorted(f for f, size in (info.shards or {}).items() if found.get(f) != size)
        if wrong:
            raise _Unusable(f"its shard files {', '.join(wrong[:3])} are missing or not the size its manifest says")

    def _manifest(self, name: str) -> CheckpointInfo:
        try:
            raw = self._read(f"{name}/{MANIFEST}", MAX_RECORD_BYTES)
        except Oversize as exc:
            raise _Unusable(f"unreadable manifest: {exc}") from None
        try:
            return checkpoint_info(name, self.backend.url(name), record_body(raw, "checkpoint manifest", READ_VERSION))
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:  # Infinity, deep nesting
            raise _Unusable(f"unreadable manifest: {_one_line(exc, 160)}") from exc

    def _names(self) -> list[str]:
        """The checkpoint folders, oldest first: real folders (never symbolic links: the backend does not list
        them, :meth:`links` does) whose names hold a possible time. Others are left alone, with one WARNING each."""
        try:
            names = sorted(n for n in self.backend.children("") if _NAME.fullmatch(n))
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(f"could not list checkpoints in {self.url}: {_one_line(exc)}") from exc
        impossible = [n for n in names if _time_of(n) is None]
        for name in impossible:
            if name not in self._ignored:
                self._ignored.add(name)
                log.warning("ignoring %s: its name holds an impossible time (not a date, or past the year %d); "
                            "it is never loaded, followed or deleted", self.backend.url(name), _END_OF_TIME.year)
        return [n for n in names if n not in impossible] if impossible else names

    def _read(self, path: str, limit: int | None = None) -> bytes:
        """``path``'s bytes; :class:`~.backend.Oversize` past ``limit`` (records: :data:`MAX_RECORD_BYTES`)."""
        try:
            return self.backend.read(path, limit)
        except (FileNotFoundError, CheckpointError, Oversize):
            raise
        except Exception as exc:
            raise CheckpointError(f"could not read {self.backend.url(path)}: {_one_line(exc)}") from exc


# -- the job record -------------------------------------------------------------------


def write_job_record(store: CheckpointStore, record: DurableJobRecord, *, only_if_absent: bool = False) -> bool:
    """Write ``record`` as ``job.json`` beside the checkpoints (atomically, replacing an older one); True.

    With ``only_if_absent`` it is written only where there is none, and False says another one was there
    (of two drivers started at once on a fresh store, one gets True): see :meth:`.backend.Backend.create`.
    The record is stored in clear; ``extra`` keys that mention a secret are
    refused so the job's HMAC secret cannot end up on shared storage.
    """
    leaks = [k for k in record.extra if "secret" in str(k).lower()]
    if leaks:
        raise CheckpointError(f"the job record is stored in clear; refusing the key(s) {', '.join(map(str, leaks))}")
    body = {"format": FORMAT, "format_version": record.format_version, "job_id": record.job_id,
            "command": list(record.command), "created": record.created, "extra": dict(record.extra)}
    try:
        data = json.dumps(body, indent=1, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"the job record holds a value JSON cannot store: {_one_line(exc)}") from exc
    try:
        if only_if_absent:
            return store.backend.create(JOB_RECORD, lambda f: f.write(data))
        store.backend.write(JOB_RECORD, lambda f: f.write(data))
    except ConfigError:  # says what to install; wrapped, it would read as storage trouble
        raise
    except Exception as exc:
        raise CheckpointError(f"could not write the job record to {store.url}: {_one_line(exc)}") from exc
    return True


def read_job_record(store: CheckpointStore) -> DurableJobRecord | None:
    """The job record beside the checkpoints; None when there is none.

    Raises CheckpointError when it exists but cannot be read or parsed.
    """

    def parse(body: dict[str, Any]) -> DurableJobRecord:
        command = body["command"]
        if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
            raise ValueError("command is not a list of strings")
        return DurableJobRecord(job_id=str(body["job_id"]), command=tuple(command), created=float(body["created"]),
                                format_version=int(body["format_version"]), extra=dict(body.get("extra") or {}))

    return read_record(store, JOB_RECORD, f"the job record in {store.url}", "job record", parse,
                       read_version=FORMAT_VERSION)


def read_record(store: CheckpointStore, path: str, what: str, kind: str, parse: Callable[[dict[str, Any]], _T], *,
                read_version: int | None = None) -> _T | None:
    """The small JSON record at ``path`` beside the checkpoints, as ``parse`` makes it; None when there is none.

    CheckpointError "``what`` is unreadable: ..." (one line) when it is over :data:`MAX_RECORD_BYTES`, is not
    cloud-elastic's record of ``kind`` or is newer than ``read_version`` (:func:`record_body`), or reading it
    raises ValueError, KeyError, TypeError, OverflowError or RecursionError (JSON nested beyond Python's limit).
    """
    try:
        raw = store._read(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except Oversize as exc:
        raise CheckpointError(f"{what} is unreadable: {exc}") from None
    try:
        return parse(record_body(raw, kind, read_version))
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise CheckpointError(f"{what} is unreadable: {_one_line(exc)}") from exc


# -- helpers ---------------------------------------------------------------------------


def _unloadable(why: str) -> CheckpointError:
    """Why a payload is not checkpointed: every load would refuse what it wrote (``safety.check_loaded``'s ``why``)."""
    return CheckpointError(f"every load would refuse it: its {DATA} {why.removesuffix(': corrupt or forged')}")


def checked_step(step: int) -> int:
    """``step`` as an int when a checkpoint can be named for it; CheckpointError (one line) when it is negative."""
    if int(step) < 0:
        raise CheckpointError(f"cannot checkpoint step {int(step)}: a checkpoint's step must be 0 or more (the "
                              "state's integer step attribute, else its number of commits)")
    return int(step)


def _time_of(name: str) -> datetime | None:
    """The UTC time in a checkpoint folder's name; None when it is not a date or lies past ``_END_OF_TIME``."""
    match = _NAME.fullmatch(name)
    try:
        when = datetime.strptime(match.group(1), _TIME_FORMAT).replace(tzinfo=timezone.utc) if match else None
    except ValueError:
        return None
    return when if when is not None and when < _END_OF_TIME else None
