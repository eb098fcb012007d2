"""What storage hands back is checked before it is used, and what storage refuses is said in one line.

``Unusable`` is a checkpoint that is torn, corrupt or tampered with (an older one may be
fine); :func:`safe_load` reads ``torch.save`` bytes with the weights-only unpickler and
names what it refused without torch's advice to load it with ``weights_only=False``;
:func:`check_archive` refuses, unloaded, an archive that would take more memory than its own size;
:func:`storage_reason` finds a full disk wherever torch's wording hides it.
"""

from __future__ import annotations

import errno
import io
import pickle
import re
from typing import IO, Any

import torch

from cloud_elastic.checkpoint.api import CheckpointError
from cloud_elastic.torch_archive import stored_records

__all__ = ["Unusable", "causes", "check_archive", "one_line", "safe_load", "storage_reason", "stored_records"]


class Unusable(CheckpointError):
    """This checkpoint is torn, corrupt or tampered with; an older one may still be good."""


def safe_load(data: bytes, what: str) -> Any:
    """``torch.load(weights_only=True)`` of ``data``; Unusable, in one line that names what was refused (and
    never torch's advice to load it with ``weights_only=False``), when it holds anything else, or when
    :func:`check_archive` refuses it."""
    check_archive(io.BytesIO(data), 0, len(data), what)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise Unusable(f"its {what} holds something other than tensors and plain data ({_refusal(str(exc))}): "
                        "torch.load(weights_only=True) refused it without running it") from None
    except Exception as exc:  # RuntimeError for a bad archive
        raise Unusable(f"its {what} is not a readable torch.save archive: {one_line(exc, 160)}") from None


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
