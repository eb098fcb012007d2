"""torch DCP storage for sharded checkpoints that loads without unpickling what storage holds.

torch's own DCP reader unpickles ``.metadata`` with a full unpickler, and its default load
planner reads every non-tensor item (an optimizer's ``param_groups``) with
``torch.load(weights_only=False)``: whoever can write the checkpoint storage could run code
in every worker that resumes. Here:

* **Writing** (:func:`digesting_writer`): DCP's files are written as usual (``.metadata``
  too, so plain ``torch.distributed.checkpoint.load`` still reads them), while each
  worker hashes every file as it streams out (and counts its bytes in the store's
  ``bytes_written`` as they reach the storage). The digests travel to the coordinator
  with DCP's own write results; the coordinator also writes :data:`METADATA_JSON`, DCP's
  metadata as JSON, and keeps every file's size and SHA-256 in ``files`` for the
  manifest (``CheckpointStore.publish_sharded``).
* **Reading** (:func:`verifying_reader`): the metadata comes from :data:`METADATA_JSON`,
  parsed strictly (dtypes from an allowlist, plain file names, integers), its claims checked against
  the shard files before a load allocates a tensor at a size it gives (:mod:`~cloud_elastic.checkpoint.dcp_layout`);
  ``.metadata`` is never opened. Every file is checked against the size and SHA-256 its
  manifest lists before DCP reads a byte of it; a file the manifest does not list is
  refused. Tensors are read by DCP with ``torch.load(weights_only=True)``, and the planner of
  :func:`safe_load_planner` reads the non-tensor items with ``weights_only=True`` too; each
  item's archive passes :func:`~cloud_elastic.checkpoint.safety.check_archive` first (no
  compressed record that would inflate in memory).
  A mismatch raises :class:`ShardCorrupt`, which the loader answers by falling back to
  the previous checkpoint.

A file replaced between its check and its reading (someone writing the storage during the
load) is not detected; it still cannot run code. See docs/checkpoints.md, "Trust".
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch

from cloud_elastic.checkpoint.api import CheckpointError, CheckpointMismatch
from cloud_elastic.checkpoint.dcp_layout import Region, Tensor, check_layout, check_name
from cloud_elastic.checkpoint.safety import Unusable as _Unusable
from cloud_elastic.checkpoint.safety import _refusal, causes, check_archive, one_line, safe_load

__all__ = ["METADATA_JSON", "ShardCorrupt", "dcp_reason", "digesting_writer", "load_target", "optimizer_target",
           "safe_load_planner", "saved_groups", "unexpected_items", "verifying_reader"]

#: DCP's metadata as JSON, beside DCP's own pickled ``.metadata`` (which only plain DCP reads).
METADATA_JSON = "metadata.json"
_FORMAT = "cloud-elastic-dcp-metadata"
_CHUNK = 1 << 20
#: The largest metadata.json read or written (its digest is checked first, but the manifest may be an attacker's
#: too). Parsing it takes about 9 times its size in memory, on each worker of the host that loads. Measured on
#: FSDP2 checkpoints written by this module, it holds about 210 bytes a tensor plus 180-200 a chunk (a sharded
#: tensor has one chunk per worker of the host; hosts are replicas and add none): Llama-3-70B's 723 parameters
#: with AdamW over 8 workers, 2,892 tensors in 18,075 chunks, take 3.9 MB. This bound admits ~35,000 tensors
#: sharded over 8 workers, and costs ~600 MiB and ~10 s of CPU to parse when a forged file reaches it.
_MAX_METADATA_BYTES = 64 << 20
_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                   "preserve_format": torch.preserve_format}
_DTYPES = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}


class ShardCorrupt(_Unusable):
    """A shard file differs from its manifest (digest, size, missing, unlisted) or holds what a checkpoint may
    not: this checkpoint is unusable, and an older one may be fine."""


# -- writing ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _FileDigests:
    """One worker's files and their ``(size, sha256)``, appended to its DCP write results for the coordinator."""

    files: dict[str, tuple[int, str]]


class _HashingStream:
    """A write stream that hashes what passes through it (with a ``Digest`` of ``checkpoint.backend``, which also
    counts its bytes as they reach the storage); it refuses to seek, so the hash is of the file."""

    def __init__(self, raw: Any, digest: Any, errors: list[OSError]) -> None:
        self._raw, self._digest, self._errors = raw, digest, errors
        self._out = digest.wrap(raw)

    @property
    def size(self) -> int:
        return self._digest.size

    def write(self, data: Any) -> int:
        try:
            return self._out.write(data)
        except OSError as exc:  # torch rewords it ("unexpected pos ..."): keep it for the message
            self._errors.append(exc)
            raise

    def seekable(self) -> bool:
        return False

    def seek(self, *args: Any) -> int:
        raise io.UnsupportedOperation("a checkpoint file is hashed as it is written and cannot seek")

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno (fsync), close
        return getattr(self._raw, name)


class _HashingFS:
    """torch DCP's file system object, whose write streams hash what they write, by file name."""

    def __init__(self, inner: Any, digests: dict[str, tuple[int, str]], errors: list[OSError],
                 digest: Callable[[], Any]) -> None:
        self._inner, self._digests, self._errors, self._digest = inner, digests, errors, digest

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self._inner.create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = _HashingStream(stream, self._digest(), self._errors)
            yield hashing
        self._digests[os.path.basename(os.fspath(path))] = (hashing.size, hashing.hexdigest())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _DigestingWriter:
    """Mixed in before a torch DCP writer class (see the module docstring)."""

    def __init__(self, *args: Any, digest: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._digests: dict[str, tuple[int, str]] = {}
        #: OSErrors the write streams saw (a full disk), for a message torch's wording hides.
        self.io_errors: list[OSError] = []
        #: On the coordinator after a save: every file of the checkpoint and its ``(size, sha256)``.
        self.files: dict[str, tuple[int, str]] | None = None
        self.fs = _HashingFS(self.fs, self._digests, self.io_errors, digest)

    def write_data(self, plan: Any, planner: Any) -> Any:
        from torch.futures import Future

        results = list(super().write_data(plan, planner).wait())  # type: ignore[misc]
        mine = {r.storage_data.relative_path for r in results}
        done: Future = Future()
        done.set_result([*results, _FileDigests({name: self._digests[name] for name in mine})])
        return done

    def finish(self, metadata: Any, results: list[list[Any]]) -> None:
        digests: dict[str, tuple[int, str]] = {}
        plain = []
        for per_rank in results:
            plain.append([r for r in per_rank if not isinstance(r, _FileDigests)])
            for r in per_rank:
                if isinstance(r, _FileDigests):
                    digests.update(r.files)
        super().finish(metadata, plain)  # type: ignore[misc]  # DCP's .metadata, for plain DCP; fills storage_data
        temporary = [n for n in self._digests if n.startswith(".metadata") and n.endswith(".tmp")]
        if temporary:
            digests[".metadata"] = self._digests[temporary[0]]
        body = json.dumps(encode_metadata(metadata), sort_keys=True).encode()
        if len(body) > _MAX_METADATA_BYTES:  # no manifest then: a checkpoint no load would read is not published
            items, chunks = len(metadata.state_dict_metadata), len(metadata.storage_data)
            raise CheckpointError(f"cannot checkpoint this model: its DCP metadata ({items:,} items in {chunks:,} "
                                  f"chunks) is {len(body):,} bytes as JSON, over the {_MAX_METADATA_BYTES:,} "
                                  "a load reads")
        with self.fs.create_stream(self.fs.concat_path(self.path, METADATA_JSON), "wb") as f:
            f.write(body)
            with contextlib.suppress(AttributeError, io.UnsupportedOperation):
                os.fsync(f.fileno())
        digests[METADATA_JSON] = (len(body), hashlib.sha256(body).hexdigest())
        self.files = digests


def digesting_writer(path: str, fsspec_options: Mapping[str, Any] | None = None, *,
                     digest: Callable[[], Any]) -> Any:
    """A DCP storage writer for the folder ``path`` (a local path, or an fsspec URL with ``fsspec_options``).

    ``digest()`` gives what hashes each file as it streams out: the backend's ``Digest``, which tells the store's
    byte counter of the bytes as they reach the storage (a slow shard write that moves bytes is progress)."""
    if fsspec_options is None:
        return _mixed(_DigestingWriter, "FileSystemWriter")(path, digest=digest)
    return _mixed(_DigestingWriter, "FsspecWriter")(path, digest=digest, **fsspec_options)


# -- reading ---------------------------------------------------------------------------------------------------


class _VerifyingFS:
    """torch DCP's file system object, whose read streams open only files whose digest matches the manifest."""

    def __init__(self, inner: Any, expected: Mapping[str, tuple[int, str]], where: str) -> None:
        self._inner, self._expected, self._where = inner, expected, where
        self._verified: set[str] = set()

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if "w" not in mode and "a" not in mode and "+" not in mode:
            self._verify(path)
        with self._inner.create_stream(path, mode) as stream:
            yield stream

    def expected(self, name: str) -> tuple[int, str]:
        """The size and SHA-256 the manifest lists for ``name``; ShardCorrupt when it lists no such file."""
        if name not in self._expected:
            raise ShardCorrupt(f"its shard file {name!r} is not listed in its manifest")
        return self._expected[name]

    def holds(self, name: str, end: int) -> None:
        """ShardCorrupt unless the manifest lists the file ``name`` at ``end`` bytes or more (the end of the last
        item the metadata places in it). The listed sizes are the files' sizes on the storage: the store compared
        them before this reader was made (``CheckpointStore.load``)."""
        size, _ = self.expected(name)
        if end > size:
            raise ShardCorrupt(f"its {METADATA_JSON} places items up to byte {end:,} of {name}, which holds {size:,}")

    def _verify(self, path: Any) -> None:
        name = os.path.basename(os.fspath(path))
        if name in self._verified:
            return
        size, sha256 = self.expected(name)
        digest, read = hashlib.sha256(), 0
        try:
            with self._inner.create_stream(path, "rb") as stream:
                while chunk := stream.read(_CHUNK):
                    digest.update(chunk)
                    read += len(chunk)
        except FileNotFoundError:
            raise ShardCorrupt(f"its shard file {name} is missing") from None
        except OSError as exc:  # storage trouble, not a bad checkpoint: no fallback over it
            raise CheckpointError(f"could not read {self._where}/{name}: {' '.join(str(exc).split())}") from exc
        if read != size or digest.hexdigest() != sha256:
            raise ShardCorrupt(f"its shard file {name} does not match the size and SHA-256 digest in its manifest")
        self._verified.add(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _VerifyingReader:
    """Mixed in before a torch DCP reader class (see the module docstring)."""

    def __init__(self, path: str, expected: Mapping[str, tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)  # type: ignore[call-arg]
        self.fs = _VerifyingFS(self.fs, dict(expected), str(path))
        self._metadata: Any = None

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        """DCP's view of one item's ``torch.save`` archive, once :func:`check_archive` passed it."""
        try:
            check_archive(file, sinfo.offset, sinfo.length, f"item at {sinfo.offset:,} of {sinfo.relative_path}")
        except _Unusable as exc:
            raise ShardCorrupt(str(exc)) from None
        return super()._slice_file(file, sinfo)  # type: ignore[misc]

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """DCP's metadata from :data:`METADATA_JSON` (verified, parsed strictly; read once, then kept)."""
        if self._metadata is None:
            self._metadata = self._read_metadata()
        return self._metadata

    def _read_metadata(self) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        size, _ = self.fs.expected(METADATA_JSON)
        if size > _MAX_METADATA_BYTES:
            raise ShardCorrupt(f"its {METADATA_JSON} is {size:,} bytes, over the {_MAX_METADATA_BYTES:,} a load reads")
        with self.fs.create_stream(self.fs.concat_path(self.path, METADATA_JSON), "rb") as f:
            raw = f.read(_MAX_METADATA_BYTES + 1)
        try:
            metadata = decode_metadata(json.loads(raw))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise ShardCorrupt(f"its {METADATA_JSON} is not DCP metadata: {' '.join(str(exc).split())[:200]}") \
                from None
        ends: dict[str, int] = {}
        for info in metadata.storage_data.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
        for name, end in sorted(ends.items()):  # what decode_metadata let a tensor claim is what these files hold
            self.fs.holds(name, end)
        metadata.storage_meta = StorageMeta(load_id=self.load_id)  # type: ignore[attr-defined]
        return metadata


def verifying_reader(path: str, expected: Mapping[str, tuple[int, str]],
                     fsspec_options: Mapping[str, Any] | None = None) -> Any:
    """A DCP storage reader for the folder ``path`` that reads only files matching ``expected``
    (name -> ``(size, sha256)``, from the manifest)."""
    if fsspec_options is None:
        return _mixed(_VerifyingReader, "FileSystemReader")(path, expected)
    return _mixed(_VerifyingReader, "FsspecReader")(path, expected, **fsspec_options)


@functools.cache
def _mixed(mixin: type, base_name: str) -> type:
    """``mixin`` over torch DCP's class ``base_name`` (imported here: torch's DCP only when a checkpoint needs it)."""
    if base_name.startswith("Fsspec"):
        from torch.distributed.checkpoint import _fsspec_filesystem as module
    else:
        import torch.distributed.checkpoint as module
    base = getattr(module, base_name)
    prefix = mixin.__name__.lstrip("_").removesuffix("Writer").removesuffix("Reader")  # Digesting, Verifying
    return type(prefix + base_name, (mixin, base), {})


@functools.cache
def _safe_load_planner_class() -> type:
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class _SafeLoadPlanner(DefaultLoadPlanner):
        """DCP's default load planner, but non-tensor items are read with ``torch.load(weights_only=True)``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                obj = safe_load(value.getvalue(), f"shard item {fqn!r}")
            except _Unusable as exc:
                raise ShardCorrupt(str(exc)) from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return _SafeLoadPlanner


def safe_load_planner() -> Any:
    """A DCP load planner that never reads a non-tensor item with a full unpickler (torch imported lazily)."""
    return _safe_load_planner_class()()


# -- what a load reads -------------------------------------------------------------------------------------------


def load_target(tensors: Mapping[str, Any], optimizers: Mapping[str, str], metadata: Any) -> dict[str, Any]:
    """``tensors`` (a sharded state's model and optimizers, by attribute name, as torch's state dicts give them),
    each optimizer's part (``optimizers``: its name -> the name of its model in ``tensors``) reading only the state
    the checkpoint holds (:func:`optimizer_target`).

    CheckpointMismatch, before anything is read, when the checkpoint holds an item this state has no place for
    (:func:`unexpected_items`: a layer removed since): DCP reads only what its target names, so the load would
    pass for a resume of this model."""
    unexpected = unexpected_items(tensors, optimizers, metadata)
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise CheckpointMismatch(f"Unexpected key in checkpoint: {unexpected[0][:200]}{more}")
    return {name: optimizer_target(name, metadata, tensors.get(optimizers[name]) or {}, part)
            if name in optimizers else part for name, part in tensors.items()}


def unexpected_items(tensors: Mapping[str, Any], optimizers: Mapping[str, str], metadata: Any) -> list[str]:
    """The items of DCP's ``metadata`` (sorted) that the state ``tensors`` has no place for: a model's key the live
    model lacks, an attribute the state lacks, an optimizer's state for a parameter its model lacks. An optimizer's
    state may lack parameters of its model (no gradient yet), and its ``param_groups`` are the optimizer's own:
    neither is a mismatch here."""
    known = {name: set(part) if isinstance(part, Mapping) else set() for name, part in tensors.items()}
    held = {name: _Names(known.get(optimizers[name], set()) | set((tensors[name] or {}).get("state") or {}))
            if name in optimizers else _Names(known[name]) for name in tensors}
    found = []
    for key in metadata.state_dict_metadata:
        name, _, rest = key.partition(".")
        if name not in tensors:
            found.append(key)
        elif name in optimizers:
            kind, _, param = rest.partition(".")
            if (kind == "state" and held[name].above(param) is None) or kind not in ("state", "param_groups"):
                found.append(key)
        elif held[name].above(rest) is None:
            found.append(key)
    return sorted(found)


def saved_groups(name: str, metadata: Any) -> list[set[str]]:
    """The keys of each param group DCP's ``metadata`` lists for the optimizer ``name`` (``name.param_groups.0.lr``),
    by index, read from the metadata alone; [] when it lists none."""
    groups: list[set[str]] = []
    for key in metadata.state_dict_metadata:
        index, _, rest = key.removeprefix(f"{name}.param_groups.").partition(".")
        if key.startswith(f"{name}.param_groups.") and index.isdigit() and rest and int(index) <= 100_000:
            groups += [set() for _ in range(int(index) + 1 - len(groups))]
            groups[int(index)].add(rest.partition(".")[0])
    return groups


class _Names:
    """A live state's keys, in which a DCP item's flattened name (from storage: any length) is looked up in time
    that does not grow with it: only its prefixes up to the longest key's length and parts are tried."""

    def __init__(self, names: set[Any]) -> None:
        self._names = {n for n in names if isinstance(n, str)}
        self._parts = max((n.count(".") for n in self._names), default=0) + 1
        self._longest = max(map(len, self._names), default=0)

    def above(self, key: str, *, strictly: bool = False) -> str | None:
        """The longest of the names that ``key`` is (unless ``strictly``) or is an item below (a nested value)."""
        ends, at = [], -1
        while len(ends) < self._parts and (at := key.find(".", at + 1, self._longest + 1)) >= 0:
            ends.append(at)
        ends += [len(key)] if not strictly and len(key) <= self._longest else []
        return next((key[:end] for end in reversed(ends) if key[:end] in self._names), None)


def dcp_reason(exc: BaseException) -> str:
    """Why DCP could not load (the key missing from the checkpoint, the size that differs), not its traceback."""
    from torch.distributed.checkpoint.api import CheckpointException

    found = [c for c in causes(exc, None) if not isinstance(c, CheckpointException)]
    return one_line(found[0] if found else exc)


def refused_item(exc: BaseException) -> str | None:
    """Why torch's weights-only load refused a tensor item inside DCP's own read (a tampered item whose archive
    pickles other objects), in one line without torch's advice to load it with ``weights_only=False``; None when no
    such refusal is among ``exc``'s causes. Such a checkpoint is unusable as one whose other items hold such objects
    (:func:`~cloud_elastic.checkpoint.safety.safe_load`): an older one may still load (review h33)."""
    refused = next((c for c in causes(exc, None) if isinstance(c, pickle.UnpicklingError)), None)
    return None if refused is None else (f"a shard item holds something other than tensors and plain data "
                                         f"({_refusal(str(refused))}): torch.load(weights_only=True) refused it "
                                         "without running it")


def optimizer_target(name: str, metadata: Any, model: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The load target of the optimizer ``name`` (``get_optimizer_state_dict``'s form): the state the checkpoint
    holds, as DCP's ``metadata`` lists it, and nothing else.

    A parameter with no state in the checkpoint (one that had no gradient before it was written) gets none,
    so an optimizer's state need not cover its trainable parameters; nor does one whose state this optimizer
    lacks (its ``state`` was touched) miss what the checkpoint holds. Each tensor is read into ``current``'s
    (torch's own target) where it has the checkpoint's shape and dtype, else into one like the parameter of
    ``model`` (the model's state dict, by the same names) when it has that shape, sharded alike, else into a
    plain tensor. Without any ``param_groups`` for ``name`` in the checkpoint, ``current`` is the target: DCP
    then names what is missing.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    state: dict[str, Any] = {}
    groups: list[dict[str, Any]] = []
    owners = _Names(set(model) | set(current.get("state") or {}))
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith(f"{name}.state."):
            rest = key[len(name) + 7:]
            # A parameter this model no longer has: refused by load_target (unexpected_items) before this.
            fqn = owners.above(rest, strictly=True)
            if fqn is None:
                continue
            path, into = rest[len(fqn) + 1:].split("."), state.setdefault(fqn, {})
            mine, like = ((current.get("state") or {}).get(fqn) or {}), model.get(fqn)
        elif key.startswith(f"{name}.param_groups."):
            index, _, rest = key[len(name) + 14:].partition(".")
            if not index.isdigit() or not rest or int(index) > 100_000:
                continue
            groups += [{} for _ in range(int(index) + 1 - len(groups))]
            path, into, like = rest.split("."), groups[int(index)], None
            saved = current.get("param_groups") or []
            mine = saved[int(index)] if int(index) < len(saved) else {}
        else:
            continue
        for part in path[:-1]:
            into, mine = into.setdefault(part, {}), (mine.get(part) if isinstance(mine, Mapping) else None) or {}
        value = mine.get(path[-1]) if isinstance(mine, Mapping) else None
        into[path[-1]] = _tensor_like(md, value, like) if isinstance(md, TensorStorageMetadata) else value
    if not groups:
        return dict(current)
    return {"state": state, "param_groups": groups}


def _tensor_like(md: Any, value: Any, param: Any) -> torch.Tensor:
    """A tensor to read the item ``md`` into: ``value`` where it fits, else one like ``param``, else a plain one."""
    dtype, size = md.properties.dtype, md.size
    if isinstance(value, torch.Tensor) and value.shape == size and value.dtype == dtype:
        return value
    if isinstance(param, torch.Tensor) and param.shape == size:
        return torch.zeros_like(param, dtype=dtype)  # a DTensor stays one, sharded as the parameter
    return torch.zeros(size, dtype=dtype)


# -- DCP's metadata as JSON --------------------------------------------------------------------------------------


def encode_metadata(metadata: Any) -> dict[str, Any]:
    """DCP's ``Metadata`` as JSON values: what loading needs (items, chunks, where each is stored)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    formats = {v: k for k, v in _MEMORY_FORMATS.items()}
    items: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        try:
            check_name(fqn)  # a load would refuse it
        except ValueError as exc:
            raise CheckpointError(f"cannot checkpoint this state: {exc}") from None
        if isinstance(md, BytesStorageMetadata):
            items[fqn] = {"kind": "bytes"}
        elif isinstance(md, TensorStorageMetadata):
            props = md.properties
            if props.layout != torch.strided:
                raise CheckpointError(f"cannot checkpoint {fqn}: its layout {props.layout} is not strided")
            items[fqn] = {"kind": "tensor", "dtype": str(props.dtype).removeprefix("torch."), "size": list(md.size),
                          "requires_grad": bool(props.requires_grad), "pin_memory": bool(props.pin_memory),
                          "memory_format": formats[props.memory_format],
                          "chunks": [[list(c.offsets), list(c.sizes)] for c in md.chunks]}
        else:
            raise CheckpointError(f"cannot checkpoint {fqn}: DCP stores it as {type(md).__name__}")
    storage = [{"fqn": index.fqn, "offset": None if index.offset is None else list(index.offset),
                "index": index.index, "file": info.relative_path, "at": info.offset, "length": info.length,
                "transforms": list(getattr(info, "transform_descriptors", None) or [])}
               for index, info in metadata.storage_data.items()]
    return {"format": _FORMAT, "version": 1, "dcp_version": metadata.version, "items": items, "storage": storage}


def decode_metadata(body: Any) -> Any:
    """The ``Metadata`` :func:`encode_metadata` wrote; ValueError/TypeError/KeyError on anything else."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    if not isinstance(body, dict) or body.get("format") != _FORMAT or body.get("version") != 1:
        raise ValueError("not cloud-elastic's DCP metadata, version 1")
    items: dict[str, Any] = {}
    tensors: dict[str, Tensor] = {}
    for fqn, item in _dict(body["items"]).items():
        check_name(fqn)  # before the load looks it up in the live state's keys
        item = _dict(item)
        if item["kind"] == "bytes":
            items[fqn] = BytesStorageMetadata()
            continue
        if item["kind"] != "tensor" or item["dtype"] not in _DTYPES:
            raise ValueError(f"item {fqn[:80]!r}: not a tensor of a known dtype")
        props = TensorProperties(dtype=_DTYPES[item["dtype"]], layout=torch.strided,
                                 requires_grad=_bool(item["requires_grad"]), pin_memory=_bool(item["pin_memory"]),
                                 memory_format=_MEMORY_FORMATS[item["memory_format"]])
        claimed = [(tuple(_ints(o)), tuple(_ints(s))) for o, s in _list(item["chunks"])]
        size = tuple(_ints(item["size"]))
        tensors[fqn] = Tensor(props.dtype.itemsize, size, tuple(claimed))
        chunks = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in claimed]
        items[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(size), chunks=chunks)
    storage, regions = {}, []
    for entry in _list(body["storage"]):
        entry = _dict(entry)
        name = entry["file"]
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"{name!r} is not a plain file name")
        if _list(entry["transforms"]):
            raise ValueError("stream transforms are not read")
        index = entry["index"]
        offset = None if entry["offset"] is None else tuple(_ints(entry["offset"]))
        key = MetadataIndex(_str(entry["fqn"]), offset, None if index is None else _ints([index])[0])
        at, length = _ints([entry["at"], entry["length"]])
        storage[key] = _StorageInfo(name, at, length)
        regions.append(Region(key.fqn, offset, name, at, length))
    check_layout(tensors, regions, others=items.keys() - tensors.keys())  # before a load allocates by a claim here
    version = body.get("dcp_version")
    return Metadata(state_dict_metadata=items, storage_data=storage, version=None if version is None else str(version))


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TypeError("expected an object")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("expected a list")
    return value


def _ints(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise TypeError("expected a list of non-negative integers")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise TypeError("expected true or false")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value
