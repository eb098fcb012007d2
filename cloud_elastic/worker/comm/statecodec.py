"""How ``sync()`` carries state between workers: ``torch.save`` out, ``torch.load(weights_only=True)`` in.

Process-group traffic is not authenticated (as in all of torch.distributed),
so what a worker receives in a state sync must not be able to run code when
decoded. ``weights_only`` loading builds only tensors, numbers, strings,
bytes, ``None``, dicts, lists, tuples, ``OrderedDict``, torch dtypes and
sizes, plus ``set`` and ``frozenset`` (allowed here: building them runs no
user code), and whatever the user allowlisted with
``torch.serialization.add_safe_globals`` in the script (on every worker).
Anything else in an ``ObjectState`` attribute is refused before it is sent,
on every worker at once, with :class:`StateSyncError` naming the type.

Explicit ``hvd.broadcast_object`` calls keep Horovod's behaviour (pickle):
they carry what the user chose to send between the job's members.
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from typing import Any

import torch

from cloud_elastic.errors import CloudElasticError

__all__ = ["MIN_TORCH", "MAX_BYTES", "StateSyncError", "Parts", "check_torch_version", "encode", "decode"]

#: The most bytes one encoded state may take (a sync's small parts: attributes, samplers' positions,
#: skeletons). Fixed rather than derived from the receiver's own state, which a newcomer may not have
#: yet: a state's tensors travel as tensors (models, optimizers), not here. A receiver refuses a bigger
#: length before it allocates anything (``collectives.broadcast_state``), and :func:`decode` refuses a
#: message that would unpack into more (a compressed record) or describes a bigger tensor.
MAX_BYTES = 1 << 30

_SAFE_BUILTINS = [set, frozenset]

#: The oldest torch whose ``weights_only`` loading has no known bypass: before 2.6 it could be made to
#: run code (CVE-2025-32434), and before 2.10 its unpickler had a reported memory corruption. Every
#: claim here that received state and checkpoints "cannot run code" rests on it, so an older torch is
#: refused when a worker imports ``cloud_elastic.torch`` (pyproject.toml states the same floor, but
#: ``pip install --no-deps`` or a preinstalled torch can bypass it).
MIN_TORCH = (2, 10)


class StateSyncError(CloudElasticError):
    """Elastic state holds an object that ``sync()`` cannot carry without pickle."""


def check_torch_version(version: str) -> None:
    """ImportError, in one line, if ``version`` is older than :data:`MIN_TORCH`."""
    release = re.match(r"(\d+)\.(\d+)", version)
    if release is None or (int(release.group(1)), int(release.group(2))) < MIN_TORCH:
        floor = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"cloud-elastic needs torch >= {floor}, whose weights_only loading has no known bypass; "
            f"this is torch {version}: upgrade torch (pip install 'torch>={floor}')"
        )


check_torch_version(torch.__version__)


class Parts(dict):
    """Several states sent as one, each under its name (``{"sampler state": ..., ...}``): what cannot be
    synced is named by its part, as it would be sent alone."""


def encode(obj: Any, what: str) -> bytes:
    """``obj`` as bytes that :func:`decode` accepts; StateSyncError if it could not load them."""
    if isinstance(obj, Parts):
        try:
            return encode(dict(obj), what)
        except StateSyncError:
            for name, part in obj.items():  # the part to blame, in its own words
                encode(part, name)
            raise
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise StateSyncError(f"{what} cannot be synced: {exc}") from exc
    data = buf.getvalue()
    if len(data) > MAX_BYTES:
        raise StateSyncError(f"{what} cannot be synced: {len(data)} bytes encoded, more than the {MAX_BYTES} a sync "
                             "carries; keep big tensors in the model or optimizer, whose tensors travel as tensors")
    decode(data, what)  # refuse here what every receiver would refuse, before anything is sent
    return data


def decode(data: bytes, what: str) -> Any:
    """Load bytes made by :func:`encode`, building no object outside the safe set, and nothing bigger than
    ``data`` allows (:func:`_check_container` before, :func:`_check_tensors` after)."""
    stored = _check_container(data, what)
    try:
        with torch.serialization.safe_globals(_SAFE_BUILTINS):
            obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        detail = str(exc).split("WeightsUnpickler error: ")[-1].strip().splitlines()[0]
        raise StateSyncError(
            f"{what} cannot be synced safely ({detail}); keep plain values in elastic state, or allow "
            "the class with torch.serialization.add_safe_globals([...]) in the script"
        ) from exc
    except (RuntimeError, EOFError, ValueError) as exc:
        raise StateSyncError(f"{what}: received state is corrupt ({exc})") from exc
    if stored:  # a tensor needs a stored record: without one there is nothing to walk for
        _check_tensors(obj, what)
    return obj


def _check_container(data: bytes, what: str) -> bool:
    """StateSyncError unless ``data`` is a zip archive (as ``torch.save`` writes, and as ``torch.load`` reads it,
    not the legacy format whose header gives the storages' sizes) of stored records whose sizes sum to at most
    its own: torch's reader allocates each record's announced size, and inflates a compressed one. Whether it
    holds a tensor's storage (a record under ``data/``)."""
    total = 0
    try:
        records = zipfile.ZipFile(io.BytesIO(data)).infolist() if data[:4] == b"PK\x03\x04" else None
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as exc:
        raise StateSyncError(f"{what}: received state is corrupt ({exc})") from exc
    for record in records or ():
        if record.compress_type != zipfile.ZIP_STORED or record.compress_size != record.file_size:
            raise StateSyncError(f"{what}: received state has a compressed record {record.filename!r} "
                                 f"({record.compress_size} bytes announcing {record.file_size}): corrupt or forged")
        total += record.file_size
    if records is None or total > len(data):
        raise StateSyncError(f"{what}: received state is corrupt (not a torch.save archive, or records of {total} "
                             f"bytes in a message of {len(data)})")
    return any("/data/" in record.filename for record in records)


def _check_tensors(obj: Any, what: str) -> None:
    """StateSyncError if a dense tensor in ``obj`` stands for more than :data:`MAX_BYTES` (a view that repeats a
    few stored elements, stride 0, looks small on the wire and becomes huge once copied)."""
    seen: set[int] = set()
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            nbytes = o.numel() * o.element_size()
            if o.layout == torch.strided and nbytes > MAX_BYTES:
                raise StateSyncError(f"{what}: received state has a tensor of shape {list(o.shape)} ({nbytes} bytes), "
                                     f"more than the {MAX_BYTES} a sync carries: corrupt or forged")
        elif isinstance(o, (dict, list, tuple, set, frozenset)) and id(o) not in seen:
            seen.add(id(o))
            stack.extend(o.values() if isinstance(o, dict) else o)
