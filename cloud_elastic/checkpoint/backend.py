"""Where checkpoint bytes go: a local directory, or any fsspec URL (``s3://``, ``gs://``, ``az://``...).

Both backends publish an object all at once: the local one writes a hidden
temporary file, fsyncs it and renames it into place; object stores make an
upload visible only when it completes, and a failed upload is discarded
(s3fs aborts the multipart upload) rather than committed. That is what makes
"data first, manifest last" atomic for readers.

:meth:`Backend.create` publishes an object only where none is (the job record, and a driver's claim of its
generation, :mod:`.claims`: of two drivers started at once, one wins). Locally that is a hard link of the
finished temporary file, which fails when the name exists (``O_CREAT|O_EXCL`` where the filesystem has no
hard links); on object stores it is fsspec's exclusive mode ``xb``, a conditional upload
(``If-None-Match: *``) that s3fs, gcsfs and adlfs send.
Other fsspec filesystems offer none: there it is a check, then a write, with one WARNING that two
drivers started at the same moment could both run.

fsspec and its cloud implementations are imported only when a URL needs
them; a missing one raises :class:`CheckpointBackendMissing` naming the pip
extra. Credentials come from each library's default chain; endpoint and
other options come from ``storage_options`` or fsspec's own configuration
(``FSSPEC_<PROTOCOL>_<OPTION>`` variables), and s3fs also honours
``AWS_ENDPOINT_URL`` through botocore.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import stat
import shutil
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, BinaryIO, Callable, Iterator, Mapping, Protocol

from cloud_elastic.checkpoint.api import CheckpointBackendMissing, CheckpointBackendTooOld, CheckpointError

__all__ = ["Backend", "Digest", "LocalBackend", "FsspecBackend", "Oversize", "backend_for", "split_url"]

log = logging.getLogger(__name__)

#: protocol -> (package that implements it, cloud-elastic extra that installs it)
_IMPLEMENTATIONS = {
    "s3": ("s3fs", "aws"),
    "s3a": ("s3fs", "aws"),
    "gs": ("gcsfs", "gcp"),
    "gcs": ("gcsfs", "gcp"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}
#: The protocols whose fsspec implementation makes ``open(path, "xb")`` a conditional upload the storage
#: refuses when the object exists (s3fs: ``If-None-Match: *``; gcsfs: ``ifGenerationMatch=0``; adlfs:
#: ``If-None-Match: *``). S3-compatible stores that ignore ``If-None-Match`` make it a plain write.
_EXCLUSIVE = frozenset(_IMPLEMENTATIONS)
#: The first release of each package with that mode (checked in their sources): before it, open(path, "xb")
#: raises NotImplementedError("File mode not supported"). adlfs's own files take "xb" while fsspec's
#: AbstractBufferedFile, which they build on, refuses to write them before fsspec 2024.12.0.
_EXCLUSIVE_SINCE = {"fsspec": "2024.12.0", "s3fs": "2024.12.0", "gcsfs": "2024.12.0", "adlfs": "2024.12.0"}


class Oversize(ValueError):
    """An object holds more bytes than its reader allows: storage is not trusted with the reader's memory."""


class NotAFile(Oversize):
    """An object that is no regular file (a FIFO, a device, a link): unusable, as an oversize one is."""


#: How the hidden temporary files of the local backend end.
_TMP = ".tmp"
#: The most bytes :class:`Digest` writes at once.
CHUNK = 8 * 1024 * 1024


def _within(data: bytes, limit: int | None, url: str) -> bytes:
    if limit is not None and len(data) > limit:
        raise Oversize(f"{url} holds more than {limit:,} bytes")
    return data


class Backend(Protocol):
    """The few storage operations a checkpoint store needs. Paths are ``/``-joined below ``root``."""

    root: str

    def url(self, path: str) -> str:
        """The address of ``path`` as a user would type it (for messages)."""

    def write(self, path: str, produce: Callable[[BinaryIO], None]) -> None:
        """Publish ``path`` with what ``produce`` writes; readers see all of it or nothing."""

    def create(self, path: str, produce: Callable[[BinaryIO], None]) -> bool:
        """Publish ``path`` as :meth:`write` does, only if nothing is there: False (nothing written) when
        something is. Atomic where the storage offers a conditional create (see the module docstring)."""

    def read(self, path: str, limit: int | None = None) -> bytes:
        """The whole object; FileNotFoundError when absent; :class:`Oversize` when it holds more than ``limit``
        bytes (nothing past ``limit + 1`` bytes is read)."""

    def children(self, path: str) -> list[str]:
        """Names directly below ``path``, symbolic links left out (a store never makes one, and following one
        would read or delete what another folder owns); empty when it does not exist."""

    def links(self, path: str) -> list[str]:
        """Names of the symbolic links directly below ``path`` (never followed); empty when it does not exist."""

    def remove_tree(self, path: str, first: str | None = None) -> None:
        """Delete ``path`` and everything below it, ``path/first`` before the rest; never through a symbolic link."""

    def remove(self, path: str) -> None:
        """Delete the object ``path`` (a symbolic link itself, never its target); nothing when it is absent."""

    def sizes(self, path: str) -> dict[str, int]:
        """The files directly below ``path`` (not symbolic links) and their sizes in bytes; empty when it does
        not exist."""

    def abandoned(self, path: str) -> bool | None:
        """Whether the folder ``path`` holds only what writes whose writers are gone left (a process killed in
        the middle of one): True when locks show it; False when a live writer holds its lock in it (never to be
        deleted); None when it cannot be told (no lock there, or the storage has none: judge by :meth:`changed`)."""

    def changed(self, path: str) -> float | None:
        """When (POSIX seconds, by the storage's own clock) the newest file anywhere below the folder ``path`` (its
        shards too) was last modified (locally, its folders too); None when the storage tells no time or it is empty
        or gone."""

    def dcp_storage(self, path: str, writing: bool, expected: Mapping[str, tuple[int, str]] | None = None,
                    moved: Callable[[int], None] | None = None) -> Any:
        """A torch DCP storage writer, or a reader of the files ``expected`` lists (name -> size and SHA-256), for
        the folder ``path`` (sharded checkpoints; :mod:`cloud_elastic.checkpoint.dcp`). The writer tells ``moved``
        of its bytes as they reach the storage, as :class:`Digest` does."""


def split_url(url: str) -> tuple[str, str]:
    """``(protocol, rest)``; a plain path or ``file://`` URL has protocol ``"file"``."""
    if "://" not in url:
        return "file", url
    protocol, rest = url.split("://", 1)
    return protocol.lower(), rest


def backend_for(url: str, storage_options: Mapping[str, Any] | None = None) -> Callable[[], Backend]:
    """Check that ``url`` can be served here and return a factory for its backend.

    Raises CheckpointBackendMissing at once (no import, no I/O) when the
    package for the URL's protocol is not installed; the factory imports it.
    """
    protocol, rest = split_url(url)
    if protocol == "file":
        if storage_options:
            raise CheckpointError(f"storage options apply only to fsspec URLs, not to the local path {url!r}")
        return lambda: LocalBackend(os.path.abspath(os.path.expanduser(rest)))
    package, extra = _IMPLEMENTATIONS.get(protocol, ("fsspec", None))
    for name in ("fsspec", package):
        if importlib.util.find_spec(name) is None:
            raise CheckpointBackendMissing(url, package if name == "fsspec" and extra else name, extra)
    options = dict(storage_options or {})
    return lambda: FsspecBackend(url, options)


class LocalBackend:
    """A directory on this machine (or a shared mount); atomic by rename, durable by fsync."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") or "/"

    def _path(self, path: str) -> str:
        return os.path.join(self.root, *path.split("/")) if path else self.root

    def url(self, path: str) -> str:
        return self._path(path)

    def write(self, path: str, produce: Callable[[BinaryIO], None]) -> None:
        with self._written(path, produce) as (final, tmp):
            os.replace(tmp, final)
        # The rename itself must survive a reboot before the next object (the manifest) points at it.
        _fsync_dir(os.path.dirname(final))

    def create(self, path: str, produce: Callable[[BinaryIO], None]) -> bool:
        with self._written(path, produce) as (final, tmp):
            try:
                # A hard link fails when the name exists, and shows the whole file or nothing (a reader never
                # finds it half written); O_EXCL only where the filesystem has no hard links.
                os.link(tmp, final)
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
                    raise
                try:
                    f = open(final, "xb")  # O_CREAT|O_EXCL
                except FileExistsError:
                    return False
                try:
                    with f:
                        produce(f)
                        f.flush()
                        os.fsync(f.fileno())
                except BaseException:
                    _unlink_quietly(final)  # ours, half written: the next start must not find it
                    raise
        _fsync_dir(os.path.dirname(final))
        return True

    @contextmanager
    def _written(self, path: str, produce: Callable[[BinaryIO], None]) -> Iterator[tuple[str, str]]:
        """(final path, a hidden temporary file beside it holding what ``produce`` wrote, fsynced), deleted on the
        way out. The writer holds a lock on it until then, publishing included: :meth:`abandoned` tells a live
        writer's file from one a killed writer left by that lock, which the kernel drops with its process."""
        final = self._path(path)
        directory = os.path.dirname(final)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}{_TMP}")
        try:
            with open(tmp, "wb") as f:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    pass  # a filesystem without locks: abandoned() cannot take the lock either, and keeps the folder
                produce(f)
                f.flush()
                os.fsync(f.fileno())
                yield final, tmp
        finally:
            _unlink_quietly(tmp)

    def abandoned(self, path: str) -> bool | None:
        # Only hidden temporary files, each unlocked: their writers are dead. A held lock: a live writer. An empty
        # folder may be a writer's between creating it and its file; a published file, one's between its data and
        # its manifest; a filesystem without locks shows nothing: their age tells (changed()).
        try:
            with os.scandir(self._path(path)) as entries:
                found = [(e.name, e.is_file(follow_symlinks=False), e.path) for e in entries]
        except (FileNotFoundError, NotADirectoryError):
            return None
        held = [_locked(full) if is_file and name.startswith(".") and name.endswith(_TMP) else None
                for name, is_file, full in found]
        if True in held:
            return False
        return True if held and all(h is False for h in held) else None

    def changed(self, path: str) -> float | None:
        times = []
        for folder, _, files in os.walk(self._path(path)):  # links are not followed
            for name in [""] + files:
                try:
                    times.append(os.lstat(os.path.join(folder, name)).st_mtime)
                except FileNotFoundError:
                    pass  # published or deleted meanwhile
        return max(times, default=None)

    def read(self, path: str, limit: int | None = None) -> bytes:
        # A regular file only, never through a link (this store writes neither): a FIFO would block the reader
        # for good, and a link to /dev/zero hand it bytes without end.
        try:
            fd = os.open(self._path(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotAFile(f"{self.url(path)} is a symbolic link, not a file this store wrote") from None
            raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise NotAFile(f"{self.url(path)} is not a regular file")
            if limit is not None and st.st_size > limit:
                raise Oversize(f"{self.url(path)} holds more than {limit:,} bytes ({st.st_size:,})")
            return _within(f.read() if limit is None else f.read(limit + 1), limit, self.url(path))

    def children(self, path: str) -> list[str]:
        return self._listed(path, links=False)

    def links(self, path: str) -> list[str]:
        return self._listed(path, links=True)

    def _listed(self, path: str, links: bool) -> list[str]:
        try:
            with os.scandir(self._path(path)) as entries:
                return sorted(e.name for e in entries if e.is_symlink() == links)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove_tree(self, path: str, first: str | None = None) -> None:
        target = self._path(path)
        if os.path.islink(target):
            raise CheckpointError(f"not deleting {target}: it is a symbolic link, not a folder this store wrote")
        if first:
            _unlink_quietly(os.path.join(target, first))  # a link named so is unlinked itself, not its target
        shutil.rmtree(target, ignore_errors=True)

    def remove(self, path: str) -> None:
        _unlink_quietly(self._path(path))

    def sizes(self, path: str) -> dict[str, int]:
        try:
            with os.scandir(self._path(path)) as entries:
                return {e.name: e.stat(follow_symlinks=False).st_size for e in entries
                        if e.is_file(follow_symlinks=False)}
        except (FileNotFoundError, NotADirectoryError):
            return {}

    def dcp_storage(self, path: str, writing: bool, expected: Mapping[str, tuple[int, str]] | None = None,
                    moved: Callable[[int], None] | None = None) -> Any:
        from cloud_elastic.checkpoint.dcp import digesting_writer, verifying_reader

        if writing:
            return digesting_writer(self._path(path), digest=lambda: Digest(moved))
        return verifying_reader(self._path(path), expected or {})


class FsspecBackend:
    """Any fsspec filesystem; objects are published when their upload completes."""

    def __init__(self, url: str, storage_options: Mapping[str, Any]) -> None:
        import fsspec

        protocol, _ = split_url(url)
        try:
            # A fresh filesystem object: fsspec caches instances by their arguments, and an endpoint or
            # credentials taken from the environment (AWS_ENDPOINT_URL...) are not among them, so a cached
            # one could keep talking to an endpoint that is no longer the one configured.
            self._fs, root = fsspec.core.url_to_fs(url, **{"skip_instance_cache": True, **storage_options})
        except ImportError as exc:  # found by find_spec but broken (e.g. a dependency of it missing)
            package, extra = _IMPLEMENTATIONS.get(protocol, ("fsspec", None))
            raise CheckpointBackendMissing(url, package, extra) from exc
        self._protocol = protocol
        self._options = dict(storage_options)
        self.root = root.rstrip("/")

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def url(self, path: str) -> str:
        return f"{self._protocol}://{self._path(path)}"

    def write(self, path: str, produce: Callable[[BinaryIO], None]) -> None:
        _publish(self._fs.open(self._path(path), "wb"), produce)

    def create(self, path: str, produce: Callable[[BinaryIO], None]) -> bool:
        if self._protocol not in _EXCLUSIVE:
            log.warning("%s offers no create-if-absent to cloud-elastic: two drivers started at the same moment "
                        "on it could both run the job", self.url(""))
            self._fs.invalidate_cache(self._path(path).rsplit("/", 1)[0])
            if self._fs.exists(self._path(path)):
                return False
            self.write(path, produce)
            return True
        try:
            f = self._fs.open(self._path(path), "xb")
        except FileExistsError:
            return False
        except (NotImplementedError, ValueError) as exc:
            if isinstance(exc, ValueError) and "mode" not in str(exc):
                raise
            raise self._without_exclusive_mode(exc) from exc
        try:
            _publish(f, produce)
        except FileExistsError:
            return False
        return True

    def _without_exclusive_mode(self, exc: Exception) -> CheckpointBackendTooOld:
        """The one-line refusal of an fsspec implementation from before mode ``xb``: it names what to upgrade,
        where a plain storage error would send the user after the storage's permissions."""
        packages = dict.fromkeys((_IMPLEMENTATIONS.get(self._protocol, ("fsspec", None))[0], "fsspec"))
        have = " with ".join(f"{name} {_installed(name)}" for name in packages)
        needs = " ".join(f"'{name}>={_EXCLUSIVE_SINCE[name]}'" for name in packages)
        return CheckpointBackendTooOld(
            f"{self.url('')}: {have} cannot create an object only where none is (open mode 'xb': "
            f"{' '.join(str(exc).split())[:200]}), which cloud-elastic needs to start a job on it; upgrade: "
            f"pip install {needs}")

    def read(self, path: str, limit: int | None = None) -> bytes:
        if limit is None:
            return self._fs.cat_file(self._path(path))
        return _within(self._fs.cat_file(self._path(path), start=0, end=limit + 1), limit, self.url(path))

    def children(self, path: str) -> list[str]:
        return self._listed(path, links=False)

    def links(self, path: str) -> list[str]:
        return self._listed(path, links=True)

    def _listed(self, path: str, links: bool) -> list[str]:
        full = self._path(path)
        # Listing caches (s3fs's dircache) would hide what another process wrote.
        self._fs.invalidate_cache(full)
        try:
            entries = self._fs.ls(full, detail=True)
        except FileNotFoundError:
            return []
        # Object stores have no links; fsspec's local filesystem says ``islink``, SFTP's the type "link".
        return sorted({str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries
                       if bool(e.get("islink") or e.get("type") == "link") == links} - {""})

    def remove_tree(self, path: str, first: str | None = None) -> None:
        full = self._path(path)
        if first:
            try:
                self._fs.rm_file(f"{full}/{first}")
            except FileNotFoundError:
                pass
        try:
            self._fs.rm(full, recursive=True)
        except FileNotFoundError:
            pass
        self._fs.invalidate_cache(full)

    def abandoned(self, path: str) -> bool | None:
        return None  # an upload is invisible until complete: nothing tells a live writer's folder from a dead one's

    def changed(self, path: str) -> float | None:
        full = self._path(path)
        self._fs.invalidate_cache(full)
        try:
            times = [_modified(e) for e in self._fs.find(full, detail=True).values() if e.get("type") == "file"]
        except FileNotFoundError:
            return None
        return None if None in times else max(times, default=None)  # type: ignore[type-var]

    def remove(self, path: str) -> None:
        try:
            self._fs.rm_file(self._path(path))
        except FileNotFoundError:
            pass
        self._fs.invalidate_cache(self._path(path).rsplit("/", 1)[0])

    def sizes(self, path: str) -> dict[str, int]:
        full = self._path(path)
        self._fs.invalidate_cache(full)
        try:
            entries = self._fs.ls(full, detail=True)
        except FileNotFoundError:
            return {}
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
                for e in entries if e.get("type") == "file"}

    def dcp_storage(self, path: str, writing: bool, expected: Mapping[str, tuple[int, str]] | None = None,
                    moved: Callable[[int], None] | None = None) -> Any:
        from cloud_elastic.checkpoint.dcp import digesting_writer, verifying_reader

        # A fresh filesystem object, as above.
        url, options = self.url(path), {"skip_instance_cache": True, **self._options}
        if writing:
            return digesting_writer(url, options, digest=lambda: Digest(moved))
        return verifying_reader(url, expected or {}, options)


class Digest:
    """SHA-256 and size of everything written through :meth:`wrap`; ``moved(n)``, if given, is told of the bytes
    as they reach the storage (the store's byte counter: whether a slow write still moves bytes): a local file's
    at each :data:`CHUNK` or less written; a buffered fsspec file's (s3fs holds up to its block size, 50 MiB,
    and uploads the rest in ``close()``) as each of its uploads completes, never while they only sit in its buffer."""

    def __init__(self, moved: Callable[[int], None] | None = None) -> None:
        self._sha = hashlib.sha256()
        self._moved = moved
        self.size = 0
        #: The first OSError a write raised: torch.save rewords a failed write as "unexpected pos N vs M".
        self.error: OSError | None = None

    def wrap(self, f: BinaryIO) -> "Digest._Writer":
        return Digest._Writer(self, f)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()

    class _Writer:
        def __init__(self, digest: "Digest", f: BinaryIO) -> None:
            self._digest, self._f = digest, f
            self._buffered = digest._moved is not None and callable(getattr(f, "_upload_chunk", None))
            if self._buffered:
                f._upload_chunk = self._counted(f._upload_chunk)  # type: ignore[attr-defined]

        def _counted(self, upload: Callable[..., Any]) -> Callable[..., Any]:
            """fsspec's ``AbstractBufferedFile._upload_chunk``, telling ``moved`` of the bytes it sent: the buffer
            it was given, less what it left there (s3fs keeps a part's remainder and returns False)."""
            f, moved = self._f, self._digest._moved

            def counted(final: bool = False) -> Any:
                with f.buffer.getbuffer() as view:  # type: ignore[attr-defined]
                    before = view.nbytes
                done = upload(final=final)
                if done is False and not final:
                    with f.buffer.getbuffer() as view:  # type: ignore[attr-defined]
                        before -= view.nbytes
                if before > 0 and moved is not None:
                    moved(before)
                return done

            return counted

        def write(self, data: Any) -> int:
            view = memoryview(data).cast("B")
            # In chunks: one tensor's storage is one write, and the counter must grow while a big one uploads.
            for start in range(0, len(view), CHUNK):
                self._chunk(view[start:start + CHUNK])
            return len(view)

        def _chunk(self, view: memoryview) -> None:
            digest = self._digest
            while view:
                try:
                    written = self._f.write(view)
                except OSError as exc:
                    digest.error = digest.error or exc
                    raise
                # A raw stream may take part of it (None: a buffered one took all): only that is in the file.
                taken = len(view) if written is None else written
                if taken <= 0:
                    raise OSError(errno.EIO, "the storage took none of the bytes written to it")
                digest._sha.update(view[:taken])
                digest.size += taken
                if digest._moved is not None and not self._buffered:
                    digest._moved(taken)
                view = view[taken:]

        def flush(self) -> None:
            self._f.flush()


def _publish(f: Any, produce: Callable[[BinaryIO], None]) -> None:
    """Write ``produce``'s bytes to the fsspec file ``f`` opened for writing, and commit them by closing it. When
    either fails the upload is thrown away: s3fs aborts its multipart upload, whose parts would stay billed."""
    try:
        produce(f)
        f.close()  # uploads the last part and completes the upload: both may fail
    except BaseException:
        # Closing would commit what was written so far; throw the upload away instead.
        try:
            f.discard()
        except Exception as exc:  # the write's error is the one to raise
            log.warning("could not discard the unfinished upload %s: %s", getattr(f, "path", f), exc)
        finally:
            try:
                f.closed = True
            except AttributeError:
                pass
        raise


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def _locked(path: str) -> bool | None:
    """Whether a live writer holds ``path``'s lock; None when no lock can be tried (a filesystem without them)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return True  # gone (published a moment ago) or unreadable: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return True if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
    finally:
        os.close(fd)
    return False


#: Where fsspec implementations put an object's modification time: local and gcsfs ``mtime``, s3fs
#: ``LastModified``, adlfs ``last_modified``, gcsfs ``updated``, the memory filesystem ``created``.
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "created")


def _modified(entry: Mapping[str, Any]) -> float | None:
    """The POSIX time an fsspec listing ``entry`` says its object was last modified, or None."""
    value = next((entry[k] for k in _MTIME_KEYS if entry.get(k) is not None), None)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return float(value) if isinstance(value, (int, float)) else None


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
