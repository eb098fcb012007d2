"""What storage hands back is checked before it is used, and what storage refuses is said in one line.

``Unusable`` is a checkpoint that is torn, corrupt or tampered with (an older one may be
fine); :func:`safe_load` reads ``torch.save`` bytes with the weights-only unpickler and
names what it refused without torch's advice to load it with ``weights_only=False``;
:func:`check_archive` refuses, unloaded, an archive that would take more memory than its own size (or a hash that
never ends: ``torch_archive``), and
:func:`check_loaded`, loaded, one whose copy would (a view repeating its storage's elements);
:func:`storage_reason` finds a full disk wherever torch's wording hides it.
"""

from __future__ import annotations

import errno
import functools
import io
import pickle
import re
from typing import IO, TYPE_CHECKING, Any, Callable

from cloud_elastic.checkpoint.api import CheckpointError
from cloud_elastic.torch_archive import COPY_FACTOR, COPY_SLACK, MAX_NESTING, stored_records

if TYPE_CHECKING:
    import torch

__all__ = ["COPY_FACTOR", "COPY_SLACK", "MAX_NESTING", "TENSOR_COST", "Unusable", "causes", "check_archive",
           "check_loaded", "key_text", "one_line", "safe_load", "storage_reason", "stored_records"]

#: What each reference to a tensor costs a copy besides its elements (a tensor object of its own: about 140 bytes
#: of Python object and its TensorImpl): an empty tensor referenced a million times (2 to 5 bytes of pickle each)
#: is a million tensors in the commit snapshot, not nothing.
TENSOR_COST = 256


@functools.cache
def _sparse_parts() -> dict[Any, tuple[str, ...]]:
    """The parts of a tensor of each sparse layout. torch is imported by the functions that read a payload: the
    driver imports this module (through the store) and never reads one."""
    import torch

    return {torch.sparse_coo: ("_indices", "_values"), torch.sparse_csr: ("crow_indices", "col_indices", "values"),
            torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
            torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
            torch.sparse_bsc: ("ccol_indices", "row_indices", "values")}


class Unusable(CheckpointError):
    """This checkpoint is torn, corrupt or tampered with; an older one may still be good."""


def safe_load(data: bytes, what: str) -> Any:
    """``torch.load(weights_only=True)`` of ``data``; Unusable, in one line that names what was refused (and
    never torch's advice to load it with ``weights_only=False``), when it holds anything else, or when
    :func:`check_archive` refuses it before the load or :func:`check_loaded` after it."""
    import torch

    check_archive(io.BytesIO(data), 0, len(data), what)
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise Unusable(f"its {what} holds something other than tensors and plain data ({_refusal(str(exc))}): "
                        "torch.load(weights_only=True) refused it without running it") from None
    except Exception as exc:  # RuntimeError for a bad archive; MemoryError, RecursionError for a forged pickle
        raise Unusable(f"its {what} is not a readable torch.save archive: {one_line(exc, 160)}") from None
    try:
        check_loaded(loaded, what, COPY_FACTOR * len(data) + COPY_SLACK)
    except (MemoryError, RecursionError) as exc:  # of the check itself: the value it walks is no checkpoint's
        loaded = None
        raise Unusable(f"its {what} could not be checked once loaded ({type(exc).__name__}): corrupt or forged") \
            from None
    return loaded


def check_loaded(value: Any, what: str, budget: int, refused: Callable[[str], Exception] | None = None) -> None:
    """Unusable, in one line naming where (or ``refused(why)``: a state sync's error), if ``value`` (what
    ``torch.load(weights_only=True)`` built: tensors in dicts, lists, tuples and sets) holds a tensor with more
    elements than its storage holds (a view that repeats them: stride 0, as ``expand`` makes), containers nested
    more than :data:`MAX_NESTING` deep (a dict's keys counted as its values: the walks after a load recurse into
    both) or in a cycle, or would take more than ``budget`` bytes to copy as the commit snapshot does (each
    reference to a tensor, :data:`TENSOR_COST` besides its elements, or to a container on its own). Views that
    share a storage (tied weights, slices) pass. Time in proportion to the distinct objects, however often each is
    referenced; memory in proportion to them too, the refusal's path of keys included (each key cut to
    :func:`key_text`'s before it is named)."""
    import torch

    known: dict[int, int] = {}  # id of a container whose copy's cost is known -> that cost
    walking: set[int] = set()  # ids of the containers on ``stack``
    stack: list[list[Any]] = []  # [container, its (key, item) pairs left, cost so far, key in its parent]

    def refuse(why: str, key: Any) -> Exception:
        where = _where(stack, key)
        why = f"{why}{f' (at {where})' if where else ''}: corrupt or forged"
        return Unusable(f"its {what} {why}") if refused is None else refused(why)

    def visit(item: Any, key: Any) -> int | None:
        """The cost of copying ``item``; None when it is a container to walk (pushed on ``stack``)."""
        if isinstance(item, torch.Tensor):
            return _tensor_cost(item, lambda why: refuse(why, key))
        if not isinstance(item, (dict, list, tuple, set, frozenset)):
            return len(item) if isinstance(item, (str, bytes, bytearray)) else 32
        if id(item) in known:
            return known[id(item)]
        if id(item) in walking:
            raise refuse("holds a container inside itself", key)
        if len(stack) >= MAX_NESTING:
            raise refuse(f"nests containers more than {MAX_NESTING} deep", key)
        walking.add(id(item))
        stack.append([item, _pairs(item), 64 + 8 * len(item), key])
        return None

    too_big = f"would take more than {budget:,} bytes to copy, the same tensors or containers referenced over and over"
    total = visit(value, None)
    while stack:
        frame = stack[-1]
        for key, item in frame[1]:
            cost = visit(item, key)
            if cost is None:
                break
            frame[2] += cost
            if frame[2] > budget:
                raise refuse(too_big, key)
        else:
            stack.pop()
            walking.discard(id(frame[0]))
            known[id(frame[0])] = total = frame[2]
            if stack:
                stack[-1][2] += frame[2]
                if stack[-1][2] > budget:
                    raise refuse(too_big, frame[3])
    if total is not None and total > budget:
        raise refuse(too_big, None)


def _tensor_cost(tensor: torch.Tensor, refuse: Callable[[str], Exception]) -> int:
    """The bytes a copy of ``tensor`` takes; ``refuse(why)`` raised when it has more elements than its storage
    holds, or a layout no checkpoint holds."""
    import torch

    sparse = _sparse_parts()
    if tensor.layout in sparse:
        return sum(_tensor_cost(getattr(tensor, part)(), refuse) for part in sparse[tensor.layout])
    if tensor.layout != torch.strided:
        raise refuse(f"holds a tensor of layout {tensor.layout}, which no checkpoint holds")
    try:
        per_byte = _PER_BYTE.get(str(tensor.dtype), 1)  # quint4x2 keeps 2 elements a byte, and says 1 byte each
        size = -(-tensor.numel() * tensor.element_size() // per_byte)
        stored = tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError) as exc:  # a tensor without a storage of its own
        raise refuse(f"holds a tensor whose storage cannot be measured ({one_line(exc, 120)})") from None
    if size > stored:
        raise refuse(f"holds a tensor of shape {list(tensor.shape)[:8]} and strides {list(tensor.stride())[:8]}, "
                     f"{size:,} bytes of elements over {stored:,} bytes of storage (a view that repeats them)")
    return size + TENSOR_COST


#: The dtypes that keep more than one element in a byte, by name: how many.
_PER_BYTE = {"torch.quint4x2": 2, "torch.quint2x4": 4}


def _where(stack: list[list[Any]], key: Any) -> str:
    """Where a walk of :func:`check_loaded` is, as a path of keys (``['optimizer']['param_groups'][0]``); "" at
    the top."""
    keys = [frame[3] for frame in stack[1:]] + ([key] if key is not None and stack else [])
    path = ""
    for k in keys:  # up to 256 keys, each of which may be the whole file: each bounded before it is added
        path += key_text(k)
        if len(path) > 160:
            break
    return one_line(path, 160) if path else ""


def key_text(key: Any, limit: int = 40) -> str:
    """``[key]`` as a path names a dict key or an index, in at most about ``limit`` characters whatever the key (a
    forged one may be a string of a million characters, an integer of a million digits, a tuple nested deep):
    ``[...]`` for a key that is neither a string nor a small integer."""
    if isinstance(key, str):
        text = repr(key[:limit])  # a character may take 10 in a repr ('\U0010ffff')
        return f"[{text if len(text) <= limit and len(key) <= limit else text[:limit] + '…'}]"
    if isinstance(key, int) and -10 ** limit < key < 10 ** limit:
        return f"[{key!r}]"
    return "[...]"


def _pairs(container: Any) -> Any:
    """The (key, item) pairs of ``container`` that :func:`check_loaded` walks: of a dict, each key (a tuple nested
    deep is as deep as a value: the walks after a load recurse into keys too) before its value."""
    if isinstance(container, dict):
        for k, v in container.items():
            yield k, k
            yield k, v
    else:
        yield from enumerate(container)


def check_archive(file: IO[bytes], offset: int, length: int, what: str) -> None:
    """Unusable, in one line, unless :func:`stored_records` finds the ``length`` bytes of ``file`` from ``offset``
    an archive that ``torch.load`` reads within their own size."""
    try:
        stored_records(file, offset, length)
    except ValueError as exc:
        raise Unusable(f"its {what} {exc}: not loaded") from None


def _refusal(text: str) -> str:
    """What torch's weights-only unpickler refused, without its advice (re-running with weights_only=False)."""
    found = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.\s|\.?$)", text, flags=re.M)
    if found:
        return one_line(found.group(1), 160)
    for part in re.split(r"\n\s*\n", text):
        part = " ".join(part.split()).removeprefix("WeightsUnpickler error: ")
        if part and not re.search(r"weights_only|Weights only load failed|Check the documentation", part):
            return one_line(re.split(r"(?<=\.) ", part)[0].rstrip("."), 160)
    return "refused by the weights-only unpickler"


def storage_reason(exc: BaseException, seen: BaseException | None = None) -> str:
    """Why storage refused a write, in one line: "no space left on device" for a full disk (ENOSPC, EDQUOT)
    wherever it hides (``seen``: an OSError our own stream caught before torch reworded it as
    ``unexpected pos ...``; the exception's causes; torch DCP's per-rank failures), else the error's text, or
    that of a CheckpointError of ours among them (torch DCP words a rank's failure as its traceback)."""
    found = causes(exc, seen)
    for candidate in found:
        if isinstance(candidate, OSError) and candidate.errno in (errno.ENOSPC, errno.EDQUOT):
            name = "ENOSPC" if candidate.errno == errno.ENOSPC else "EDQUOT"
            where = f" writing {candidate.filename}" if candidate.filename else ""
            return f"no space left on device ({name}{where})"
    if isinstance(seen, OSError):
        return one_line(seen)
    return one_line(next((c for c in found if isinstance(c, CheckpointError)), exc))


def causes(exc: BaseException, seen: BaseException | None) -> list[BaseException]:
    """``seen``, ``exc``, their causes and contexts, and torch DCP's per-rank failures: where a reason may hide."""
    out: list[BaseException] = [seen] if seen is not None else []
    todo: list[Any] = [exc]
    while todo and len(out) < 64:
        item = todo.pop()
        if not isinstance(item, BaseException) or item in out:
            continue
        out.append(item)
        todo += [item.__cause__, item.__context__]
        failures = getattr(item, "failures", None)  # torch DCP's CheckpointException: {rank: (exception, trace)}
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]
    return out


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(str(text).split()) or type(text).__name__
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
