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
from typing import Any

import torch

from cloud_elastic.errors import CloudElasticError

__all__ = ["StateSyncError", "encode", "decode"]

_SAFE_BUILTINS = [set, frozenset]


class StateSyncError(CloudElasticError):
    """Elastic state holds an object that ``sync()`` cannot carry without pickle."""


def encode(obj: Any, what: str) -> bytes:
    """``obj`` as bytes that :func:`decode` accepts; StateSyncError if it could not load them."""
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise StateSyncError(f"{what} cannot be synced: {exc}") from exc
    data = buf.getvalue()
    decode(data, what)  # refuse here what every receiver would refuse, before anything is sent
    return data


def decode(data: bytes, what: str) -> Any:
    """Load bytes made by :func:`encode`, building no object outside the safe set."""
    try:
        with torch.serialization.safe_globals(_SAFE_BUILTINS):
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        detail = str(exc).split("WeightsUnpickler error: ")[-1].strip().splitlines()[0]
        raise StateSyncError(
            f"{what} cannot be synced safely ({detail}); keep plain values in elastic state, or allow "
            "the class with torch.serialization.add_safe_globals([...]) in the script"
        ) from exc
    except (RuntimeError, EOFError, ValueError) as exc:
        raise StateSyncError(f"{what}: received state is corrupt ({exc})") from exc
