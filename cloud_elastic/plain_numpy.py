"""NumPy numbers and numeric arrays as plain data, and back, never through numpy's pickle reconstructors.

``torch.load(weights_only=True)`` refuses numpy's own pickling (its reconstructors are globals that could
be made to build anything), yet ``state.loss = np.mean(losses)`` is common in training scripts. :func:`pack`
rewrites each numpy number or numeric array into a tagged tuple of plain values, ``(TAG, "numpy", dtype,
shape, its bytes as a uint8 tensor)``, that the weights-only loader reads as it is; :func:`unpack` rebuilds
it with ``np.frombuffer`` for the numeric kinds only (bool, integers, floats, complex), from exactly as many
bytes as the dtype and shape take, so a forged tag builds nothing bigger than the bytes it carries. The same
type, dtype, shape and value come back.

A ``frozenset``, which the weights-only loader refuses unless allowed by name, is rewritten the same way, as
``(TAG, "frozenset", its items as a tuple)``.

Both the in-memory state sync (``worker.comm.statecodec``) and durable checkpoints (``checkpoint.payload``)
carry numpy values this way; this module imports neither, so storage never depends on the worker. What both
carry is defined here once (:data:`LEAVES`, :data:`DICTS`, :data:`SEQUENCES`, numeric numpy values), so that a
value a ``commit()`` accepts is one a checkpoint can hold.
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import torch

__all__ = ["TAG", "LEAVES", "DICTS", "SEQUENCES", "Malformed", "holds", "is_numeric", "pack", "unpack"]

#: The first item of a tuple that stands for a value :func:`pack` rewrote: ``(TAG, "numpy", dtype, shape, its
#: bytes as a uint8 tensor)`` for a numpy number (shape None) or array, ``(TAG, "frozenset", items)`` for a
#: frozenset, ``(TAG, "tuple", t)`` for a tuple of the
#: user's that starts with this very string. A tuple, so that a numpy number may stay a dict's key. The text is
#: part of the format of checkpoints already written: never change it.
TAG = "\x00cloud-elastic statecodec tag"
#: Bool, signed and unsigned integers, floats, complex: plain bytes, whatever their values.
_NUMERIC_KINDS = "biufc"
DICTS = (dict, collections.OrderedDict, collections.Counter)
SEQUENCES = (list, tuple, set, frozenset)
#: The values besides tensors and containers that the state sync and checkpoints carry as they are (exact
#: types): what ``torch.load(weights_only=True)`` builds without being allowed anything by name.
LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.layout,
          torch.Size)


class Malformed(ValueError):
    """A tagged value that :func:`pack` did not write (corrupt or forged); its text says what is wrong."""


def is_numeric(np: Any, obj: Any) -> bool:
    """A numpy number or plain numeric array (not an object array, a record, a subclass such as np.matrix)."""
    if not (type(obj) is np.ndarray or isinstance(obj, np.generic)):
        return False
    return obj.dtype.kind in _NUMERIC_KINDS and obj.dtype.fields is None and obj.dtype.subdtype is None


def _tagged(obj: Any) -> bool:
    return type(obj) is tuple and len(obj) > 0 and type(obj[0]) is str and obj[0] == TAG


def pack(obj: Any) -> Any:
    """``obj`` with each numpy number or numeric array replaced by its tagged form (containers rebuilt only
    where something inside changed: the rest is ``obj``'s own objects, a module's state dict keeps its
    ``_metadata``)."""
    return _pack(obj, {})


def unpack(obj: Any) -> Any:
    """:func:`pack` undone on a loaded value (rebuilt only where a tag was found: a value without tags, such
    as a checkpoint written before numpy values were kept, comes back as it is). Raises :class:`Malformed`
    for a tag :func:`pack` would not write, ImportError when a tag holds a numpy value and numpy is missing."""
    return _unpack(obj, {})


def holds(obj: Any, kind: str) -> bool:
    """Whether a :func:`pack` result holds a tagged value of ``kind`` (``"numpy"``, ``"frozenset"``): a checkpoint
    that holds a kind newer than its readers must say so in its format version (``checkpoint.api``)."""
    seen: set[int] = set()
    stack = [obj]
    while stack:
        o = stack.pop()
        if type(o) not in DICTS and type(o) not in SEQUENCES or id(o) in seen:
            continue
        seen.add(id(o))
        if _tagged(o) and len(o) > 1 and type(o[1]) is str:
            if o[1] == kind:
                return True
            if o[1] == "tuple" and len(o) == 3 and _tagged(o[2]):  # the user's own tuple, itself no tag
                stack.extend(o[2][1:])
                continue
        stack.extend((*o.keys(), *o.values()) if type(o) in DICTS else o)
    return False


def _pack(obj: Any, memo: dict[int, Any]) -> Any:
    np = sys.modules.get("numpy")  # a numpy value exists only once numpy was imported
    if np is not None and is_numeric(np, obj):
        dt = obj.dtype
        # The character code keeps aliases apart (np.longlong is not np.int64); a foreign byte order needs the string.
        code = dt.char if dt.isnative else dt.str
        shape = None if isinstance(obj, np.generic) else tuple(obj.shape)
        # The bytes as a tensor: stored as a record of their own, not as a pickled string (twice the size).
        raw = torch.from_numpy(np.ascontiguousarray(obj).reshape(-1).view(np.uint8).copy())
        return (TAG, "numpy", code, shape, raw)
    if type(obj) is frozenset:
        if id(obj) not in memo:
            memo[id(obj)] = (TAG, "frozenset", tuple(_pack(v, memo) for v in obj))
        return memo[id(obj)]
    return _rebuilt(obj, memo, _pack, lambda out: (TAG, "tuple", out) if _tagged(obj) else out)


def _unpack(obj: Any, memo: dict[int, Any]) -> Any:
    if not _tagged(obj):
        return _rebuilt(obj, memo, _unpack, lambda out: out)
    if id(obj) in memo:
        return memo[id(obj)]
    if len(obj) == 5 and type(obj[1]) is str and obj[1] == "numpy":
        out = _numpy_value(obj)
    elif len(obj) == 3 and type(obj[1]) is str and obj[1] == "tuple" and _tagged(obj[2]):
        memo[id(obj)] = obj
        out = tuple(_unpack(v, memo) for v in obj[2])
    elif len(obj) == 3 and type(obj[1]) is str and obj[1] == "frozenset" and type(obj[2]) is tuple:
        memo[id(obj)] = obj
        try:
            out = frozenset(_unpack(v, memo) for v in obj[2])
        except TypeError as exc:  # an unhashable item: no frozenset of ours
            raise Malformed(f"a malformed frozenset ({' '.join(str(exc).split())[:200]})") from None
    else:
        raise Malformed("a malformed tagged value")
    memo[id(obj)] = out
    return out


def _rebuilt(obj: Any, memo: dict[int, Any], each: Any, wrap: Any) -> Any:
    """``obj`` with ``each`` applied to every key and item of its containers, each container rebuilt only where
    something inside changed, then passed to ``wrap``; a container met again (shared, or inside itself) is
    given as it was rebuilt, or as itself."""
    kind = type(obj)
    if kind not in DICTS and kind not in SEQUENCES:
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    memo[id(obj)] = obj
    if kind in DICTS:
        items = [(each(k, memo), each(v, memo)) for k, v in obj.items()]
        changed = any(a is not k or b is not v for (a, b), (k, v) in zip(items, obj.items()))
    else:
        items = [each(v, memo) for v in obj]
        changed = any(a is not v for a, v in zip(items, obj))
    # Through a dict: Counter(pairs) would count the pairs.
    out = wrap((kind(dict(items)) if kind in DICTS else kind(items)) if changed else obj)
    memo[id(obj)] = out
    return out


def _numpy_value(tag: tuple[Any, ...]) -> Any:
    """The numpy number or array of a ``(TAG, "numpy", dtype, shape, bytes)`` tuple: numeric dtypes only, the
    bytes' length exactly what the dtype and shape take, checked before anything is built from them."""
    import numpy as np  # ImportError: the caller says whose values these are

    try:
        _, _, code, shape, raw = tag
        if (type(code) is not str or len(code) > 16 or type(raw) is not torch.Tensor or raw.dtype != torch.uint8
                or raw.dim() != 1 or raw.layout != torch.strided or not raw.is_contiguous()):
            raise TypeError("a dtype string and a contiguous tensor of bytes expected")
        if shape is not None and (type(shape) is not tuple or len(shape) > 64
                                  or not all(type(n) is int and n >= 0 for n in shape)):
            raise TypeError("a shape of non-negative integers expected")
        dt = np.dtype(code)  # a string: parsed, never imported from
        if dt.kind not in _NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
            raise TypeError(f"dtype {code!r} is not numeric")
        count = 1
        for n in shape or ():
            count *= n
        # Before any copy: a contiguous tensor's bytes are its stored ones, so nothing bigger than them is built.
        if count * dt.itemsize != raw.numel():
            raise ValueError(f"{raw.numel()} bytes for {count} element(s) of {dt.itemsize}")
        flat = np.frombuffer(raw.numpy().tobytes(), dtype=dt)
        return flat[0] if shape is None else flat.reshape(shape).copy()
    except (TypeError, ValueError, OverflowError, IndexError, RuntimeError) as exc:
        raise Malformed(f"a malformed numpy value ({' '.join(str(exc).split())[:200]})") from exc
