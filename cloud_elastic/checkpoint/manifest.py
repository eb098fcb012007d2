"""A checkpoint's manifest and the store's other JSON records, as they are written and read back.

:func:`new_manifest` is the manifest a save writes last (step, digest, the caller's metadata, a sharded
checkpoint's files); :func:`checkpoint_info` reads one back into a
:class:`~cloud_elastic.checkpoint.api.CheckpointInfo`, trusting nothing in it (storage is not trusted: sizes,
digests and file names are checked); :func:`record_body` checks that a record is cloud-elastic's and not newer
than this one reads. Pure: no I/O, the store (:mod:`cloud_elastic.checkpoint.store`) reads and writes them.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any, Mapping

from cloud_elastic.checkpoint.api import FORMAT, CheckpointError, CheckpointInfo
from cloud_elastic.checkpoint.safety import one_line as _one_line

__all__ = ["DATA", "SHARDS_DIR", "new_manifest", "split_meta", "checkpoint_info", "record_body"]

DATA = "state.pt"
#: A sharded checkpoint's folder for torch DCP's files (one or more per worker, and DCP's own metadata).
SHARDS_DIR = "dcp"
_META_KEYS = ("epoch", "world_size", "job_id")


def new_manifest(step: int, version: int, created: float, fields: Mapping[str, Any], extra: Mapping[str, Any],
                 data: Mapping[str, Any], torch_version: str, shards: Mapping[str, tuple[int, str]] | None = None,
                 shard_count: int | None = None) -> dict[str, Any]:
    """The manifest of a checkpoint of ``step``: ``data`` is its data object's name, size and SHA-256; ``fields``
    and ``extra`` are :func:`split_meta`'s; ``shards`` the size and SHA-256 of each of its DCP files."""
    manifest = {
        "format": FORMAT, "format_version": version,
        "step": int(step), "created": created,
        "created_utc": datetime.fromtimestamp(created, timezone.utc).isoformat().replace("+00:00", "Z"),
        **fields, "torch_version": torch_version,
        "data": dict(data), "extra": extra,
    }
    if shards is not None:
        manifest["shards"] = {"dir": SHARDS_DIR, "files": {f: size for f, (size, _) in shards.items()},
                              "sha256": {f: sha for f, (_, sha) in shards.items()}, "count": shard_count}
    return manifest


def split_meta(meta: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's own fields (``epoch``, ``world_size``, ``job_id``) and the rest (``extra``) of a save's ``meta``;
    CheckpointError when the rest is not JSON values."""
    meta = dict(meta or {})
    fields = {k: meta.pop(k) for k in _META_KEYS if meta.get(k) is not None}
    for key in ("epoch", "world_size"):
        if key in fields:
            fields[key] = int(fields[key])
    if "job_id" in fields:
        fields["job_id"] = str(fields["job_id"])
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint metadata must be JSON values: {_one_line(exc)}") from exc
    return fields, meta


def _size(value: Any) -> int:
    """A byte count from a manifest: an integer in [0, 2**62] (ValueError otherwise; storage is not trusted)."""
    size = int(value)
    if not 0 <= size <= 2**62:
        raise ValueError(f"a file size of {value!r} bytes")
    return size


def checkpoint_info(name: str, url: str, manifest: Mapping[str, Any]) -> CheckpointInfo:
    """The checkpoint folder ``name`` (at ``url``) as ``manifest`` describes it; ValueError, KeyError or TypeError
    when the manifest is not one this cloud-elastic wrote (a digest, a size or a file name it could not have)."""
    data = manifest["data"]
    sha = str(data["sha256"])
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError("the data digest is not a SHA-256 hex digest")
    data_name = str(data.get("name", DATA))
    if "/" in data_name or data_name.startswith("."):
        raise ValueError(f"the data name {data_name!r} is not a plain file name")
    optional = {k: manifest.get(k) for k in _META_KEYS}
    shards = manifest.get("shards")
    if shards is not None:
        files = {str(f): _size(size) for f, size in dict(shards["files"]).items()}
        if shards.get("dir") != SHARDS_DIR or any("/" in f or f in ("", "..") for f in files):
            raise ValueError("the shards are not listed as plain file names of the dcp folder")
        digests = None
        if shards.get("sha256") is not None:
            digests = {str(f): str(h) for f, h in dict(shards["sha256"]).items()}
            if set(digests) != set(files) or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in digests.values()):
                raise ValueError("the shard digests are not a SHA-256 hex digest for each listed file")
        shards = {"files": files, "count": int(shards["count"]), "sha256": digests}
    return CheckpointInfo(
        name=name, url=url, step=int(manifest["step"]), created=float(manifest["created"]), size=_size(data["size"]),
        sha256=sha, data_name=data_name,
        epoch=None if optional["epoch"] is None else int(optional["epoch"]),
        world_size=None if optional["world_size"] is None else int(optional["world_size"]),
        job_id=None if optional["job_id"] is None else str(optional["job_id"]),
        format_version=int(manifest["format_version"]), torch_version=manifest.get("torch_version"),
        extra=dict(manifest.get("extra") or {}),
        shards=None if shards is None else shards["files"], shard_count=None if shards is None else shards["count"],
        shard_digests=None if shards is None else shards["sha256"],
    )


def record_body(raw: bytes, kind: str, read_version: int | None = None) -> dict[str, Any]:
    """``raw`` as a JSON object of cloud-elastic's ``FORMAT``: ValueError when it is not one (``not a cloud-elastic
    KIND``), or when ``read_version`` is given and its ``format_version`` is newer (KeyError when it has none)."""
    body = json.loads(raw)
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"not a cloud-elastic {kind}")
    if read_version is not None and int(body["format_version"]) > read_version:
        raise ValueError(f"format version {body['format_version']} is newer than this cloud-elastic reads "
                         f"({read_version})")
    return body
