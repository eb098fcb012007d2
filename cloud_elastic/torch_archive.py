"""Whether bytes are a ``torch.save`` archive that ``torch.load`` reads within their own size and in bounded time.

``torch.load`` allocates each record's announced size and inflates a compressed record (1 MB into a
GiB), and hashes every dict key and set item it builds: a tuple nested a million deep overflows the
C stack (the process dies of SIGSEGV), and one that refers to its parts twice at each of 60 levels
(1.5 kB of pickle) takes 2**60 steps. A checkpoint read from storage (``checkpoint.safety``) and a
state received from a peer (``worker.comm.statecodec``) are both checked here, from the archive's
directory and its pickle's opcodes, before they are loaded; what the load builds is checked after it
(``safety.check_loaded``). Light on purpose (no torch): a worker imports it at start-up.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import pickletools
import zipfile
from typing import IO, Any, Callable

__all__ = ["MAX_NESTING", "stored_records"]

#: How deep containers may nest in a loaded value: torch.save itself fails near 500, and the walks after a load
#: (hashing a tuple, ``plain_numpy.unpack``, the commit snapshot's copy) recurse.
MAX_NESTING = 256
#: What a pickle's tuples may expand to, each reference to one counted on its own (what hashing one walks): this
#: many elements per byte of the pickle, plus :data:`_TUPLE_SLACK`. torch.save refers to a tuple again only where a
#: state shares it (the betas of every parameter group), a few elements per reference.
_TUPLE_FACTOR = 8
_TUPLE_SLACK = 1 << 20


def stored_records(file: IO[bytes], offset: int, length: int) -> list[zipfile.ZipInfo]:
    """The records of the zip archive in the ``length`` bytes of ``file`` from ``offset``; ValueError, saying why,
    unless it is one as ``torch.save`` writes (not the legacy format, whose header gives the sizes to allocate) of
    stored records whose sizes sum to at most ``length`` (``torch.load`` allocates each record's announced size and
    inflates a compressed one: 1 MB into a GiB), whose pickle builds tuples that :func:`_check_tuples` passes. An
    OSError of ``file`` is raised as it is: storage trouble, not a bad archive."""
    window = _Window(file, offset, length)
    archive = _unzipped(lambda: zipfile.ZipFile(window) if window.read(4) == b"PK\x03\x04" else None)
    if archive is None:
        raise ValueError("is not a zip archive (torch.save's format)")
    records = archive.infolist()
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED or record.compress_size != record.file_size:
            raise ValueError(f"holds a compressed record {record.filename!r} ({record.compress_size:,} bytes "
                             f"announcing {record.file_size:,}), which torch.save never writes")
    total = sum(record.file_size for record in records)
    if total > length:
        raise ValueError(f"holds records of {total:,} bytes in {length:,}")
    for record in records:  # each that torch.load could take for the pickle (it picks one by the archive's name)
        if record.filename.endswith("data.pkl"):
            _check_tuples(_unzipped(functools.partial(archive.read, record)))
    return records


def _unzipped(read: Callable[[], Any]) -> Any:
    """``read()``; a ValueError saying why when zipfile finds no archive there (a forged directory or record)."""
    try:
        return read()
    except Exception as exc:  # zipfile's BadZipFile, ValueError, EOFError, ... for a forged directory
        if isinstance(exc, OSError) and not isinstance(exc, _OutOfArchive):
            raise
        why = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise ValueError(f"is not a readable zip archive (torch.save's format): {why}") from None


def _check_tuples(pickle: bytes) -> None:
    """ValueError unless the tuples that ``pickle`` builds (what a load hashes as dict keys and set items, in C
    and recursively) nest at most :data:`MAX_NESTING` deep and expand, over all references to them, to at most
    :data:`_TUPLE_FACTOR` elements a byte. A dry run of the opcodes that torch's weights-only unpickler runs,
    keeping for each value on its stack only a tuple's (elements expanded, depth), else None; it stops at an
    opcode or a stack it does not know, which that unpickler refuses by itself."""
    budget = _TUPLE_FACTOR * len(pickle) + _TUPLE_SLACK
    stack: list[tuple[int, int] | None] = []
    marks: list[int] = []
    memo: dict[int, tuple[int, int] | None] = {}
    referenced = 0
    try:
        for op, arg, _ in pickletools.genops(pickle):
            name = op.name
            if name in _TUPLES:
                start = marks.pop() if name == "TUPLE" else len(stack) - _TUPLES[name]
                if start < 0:
                    return
                items, stack[start:] = stack[start:], []
                depth = 1 + max((item[1] for item in items if item), default=0)
                if depth > MAX_NESTING:
                    raise _Refused(f"nests tuples more than {MAX_NESTING} deep")
                stack.append((1 + sum(item[0] if item else 1 for item in items), depth))
            elif name in ("BINGET", "LONG_BINGET"):
                item = memo[arg]
                referenced += item[0] if item else 0
                if referenced > budget:
                    raise _Refused(f"refers to tuples that expand to more than {budget:,} elements, the same ones "
                                   "referenced over and over")
                stack.append(item)
            elif name in ("BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MARK":
                marks.append(len(stack))
            elif name in ("APPENDS", "SETITEMS"):
                del stack[marks.pop():]
            elif name in _OTHERS and _OTHERS[name][0] <= len(stack):
                pops, pushes = _OTHERS[name]
                del stack[len(stack) - pops:]
                stack.extend([None] * pushes)
            else:  # STOP, or what the weights-only unpickler refuses by itself
                return
    except _Refused:
        raise
    except (ValueError, IndexError, KeyError):  # not a pickle as torch.save writes one: the load refuses it
        return


class _Refused(ValueError):
    """A pickle whose tuples :func:`_check_tuples` refuses."""


#: The tuple opcodes of torch's weights-only unpickler: how many values each takes off the stack (TUPLE: to its mark).
_TUPLES = {"TUPLE": -1, "EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
#: Its other opcodes but those of the memo and marks: (values taken off the stack, values put on it).
_OTHERS = {"PROTO": (0, 0), "APPEND": (1, 0), "SETITEM": (2, 0), "REDUCE": (2, 1), "NEWOBJ": (2, 1), "BUILD": (1, 0),
           "BINPERSID": (1, 1), "GLOBAL": (0, 1), **dict.fromkeys(
               ("NONE", "NEWTRUE", "NEWFALSE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "BININT", "BININT1", "BININT2",
                "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "LONG1"), (0, 1))}


class _OutOfArchive(OSError):
    """A seek before the start of a :class:`_Window`, as a file refuses one (zipfile expects an OSError)."""


class _Window(io.RawIOBase):
    """``length`` bytes of ``file`` from ``offset``, as a file of their own: what zipfile reads an archive from."""

    def __init__(self, file: IO[bytes], offset: int, length: int) -> None:
        super().__init__()
        self._file, self._offset, self._length, self._at = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, at: int, whence: int = os.SEEK_SET) -> int:
        at += (0, self._at, self._length)[whence]
        if at < 0:
            raise _OutOfArchive(errno.EINVAL, "seek before the start of the archive")
        self._at = at
        return at

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._length - self._at)
        self._file.seek(self._offset + self._at)
        data = self._file.read(left if size is None or size < 0 else min(size, left))
        self._at += len(data)
        return data
