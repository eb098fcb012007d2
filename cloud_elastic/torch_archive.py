"""Whether bytes are a ``torch.save`` archive that ``torch.load`` reads within their own size and in bounded time.

``torch.load`` allocates each record's announced size and inflates a compressed record (1 MB into a
GiB), and hashes every dict key and set item it builds: a tuple nested a million deep overflows the
C stack (the process dies of SIGSEGV), and one that refers to its parts twice at each of 60 levels
(1.5 kB of pickle) takes 2**60 steps; ``set(L)`` over a list of a thousand tuples, called again and again, takes
time that grows with the square of the pickle, and a million one-byte empty sets build 216 MB. A checkpoint read from storage (``checkpoint.safety``) and a
state received from a peer (``worker.comm.statecodec``) are both checked here, from the archive's
directory and its pickle's opcodes, before they are loaded; what the load builds is checked after it
(``safety.check_loaded``). Light on purpose (no torch): a worker imports it at start-up.
"""

from __future__ import annotations

import errno
import functools
import io
import os
import re
import struct
import zipfile
from itertools import repeat
from typing import IO, Any, Callable

__all__ = ["BUILD_FACTOR", "COPY_FACTOR", "COPY_SLACK", "MAX_NESTING", "stored_records"]

#: How deep containers may nest in a loaded value: torch.save itself fails near 500, and the walks after a load
#: (hashing a tuple, ``plain_numpy.unpack``, the commit snapshot's copy) recurse.
MAX_NESTING = 256
#: What a pickle's tuples may expand to, each reference to one counted on its own (what hashing one walks): this
#: many elements per byte of the pickle, plus :data:`_TUPLE_SLACK`. torch.save refers to a tuple again only where a
#: state shares it (the betas of every parameter group), a few elements per reference.
_TUPLE_FACTOR = 8
_TUPLE_SLACK = 1 << 20
#: What a copy of a loaded value may cost: this many times the bytes it was loaded from, plus :data:`COPY_SLACK`.
#: The commit snapshot after a load copies every reference to a tensor or a container on its own, so a value the
#: project wrote costs about its own size (tied weights: a few times the shared tensor), and a forged one (a view
#: that repeats one stored element 2**40 times, one tensor or list referenced a million times) is refused. What the
#: load builds is held to it before the load too (:func:`_check_pickle`).
COPY_FACTOR = 8
COPY_SLACK = 64 << 20
#: What the load may build, by :func:`_check_pickle`'s estimate (the load's own objects: its memo, the tuples of
#: each tensor's rebuild, not only what the value keeps): this many times the archive's size, plus
#: :data:`COPY_SLACK`. Looser than :data:`COPY_FACTOR`: a list of 100,000 small tensors, views of one storage,
#: estimates at about 18 times its archive; a forged pickle of empty sets at 224 times, of copies without end.
BUILD_FACTOR = 32


def stored_records(file: IO[bytes], offset: int, length: int) -> list[zipfile.ZipInfo]:
    """The records of the zip archive in the ``length`` bytes of ``file`` from ``offset``; ValueError, saying why,
    unless it is one as ``torch.save`` writes (not the legacy format, whose header gives the sizes to allocate) of
    stored records whose sizes sum to at most ``length`` (``torch.load`` allocates each record's announced size and
    inflates a compressed one: 1 MB into a GiB), whose pickle :func:`_check_pickle` passes (a
    MemoryError of that check is a ValueError too: the load, which builds more, would fail the same way). An
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
            pickle = _unzipped(functools.partial(archive.read, record))
            try:
                _check_pickle(pickle, length)
            except MemoryError:  # its stack: 8 bytes a value, a fraction of what the load would build
                raise ValueError("could not be checked before its load (MemoryError)") from None
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


def _check_pickle(pickle: bytes, size: int) -> None:
    """ValueError unless ``pickle`` (of an archive of ``size`` bytes) loads within bounded time and memory: the
    tuples it builds (what a load hashes as dict keys and set items, in C and recursively) nest at most
    :data:`MAX_NESTING` deep, and those tuples, over all references to them, and the containers and long strings
    that its calls walk (``set(L)``, ``Counter(L)``, ``OrderedDict(D)``, ``_codecs.encode(s)``, a ``BUILD``'s
    state), over every call, come to at most :data:`_TUPLE_FACTOR` elements a byte; and what the load builds
    (each empty set 216 bytes of Python object, from one byte of pickle) stays within :data:`BUILD_FACTOR` times
    the archive's size plus :data:`COPY_SLACK` (the value loaded is held to :data:`COPY_FACTOR` after the load).

    A dry run of the opcodes that torch's weights-only unpickler runs, keeping for each value on its stack only
    what it costs: None for a number or a short string (or a call's result that walked nothing), ``(elements
    expanded, depth, strings and containers held)`` for a tuple, ``[elements]`` for a list, dict or set (shared
    with the memo, so a container filled after it was memoized is walked at its size), and its length for a
    string longer than :data:`_LONG_STRING`. It stops at an opcode or a stack it does not know, which that
    unpickler refuses by itself. It runs on every checkpoint load and state sync, so it is one pass over the
    bytes, not a decoder of every argument (``pickletools.genops`` took 0.6 s for a list of a million numbers):
    a run of one opcode that puts a number (or None, a bool) on the stack is skipped in one regex match, and a
    string's bytes by its length."""
    budget = _TUPLE_FACTOR * len(pickle) + _TUPLE_SLACK
    room = BUILD_FACTOR * size + COPY_SLACK
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    referenced = built = 0
    end, at = len(pickle), 0
    runs, u4 = _RUNS, _U4
    while at < end:
        if built > room:
            raise _Refused(f"builds more than {room:,} bytes of objects before its load could refuse them "
                           f"({BUILD_FACTOR} times its {size:,} bytes, and {COPY_SLACK >> 20} MiB): empty containers "
                           "by the million, or the same ones copied over and over")
        op = pickle[at]
        run = runs.get(op)
        if run is not None:
            found = run.match(pickle, at)
            if found is None:  # its argument cut short
                return
            count = (found.end() - at) // run.size
            stack.extend(repeat(None, count))
            built += count * run.cost
            at = found.end()
            continue
        at += 1
        if op == 0x58:  # BINUNICODE: a 4-byte length, then the string's bytes
            length = u4(pickle, at)[0] if at + 4 <= end else end
            at += 4 + length
            if at > end:
                return
            stack.append(length if length > _LONG_STRING else None)
            built += 57 + length
        elif op in _EMPTY:  # EMPTY_LIST, EMPTY_DICT, EMPTY_SET: a container, by the elements put in it
            stack.append([0])
            built += _EMPTY[op]
        elif op in _MEMO:  # BINPUT, LONG_BINPUT, BINGET, LONG_BINGET: a 1- or 4-byte index
            width = _MEMO[op]
            if at + width > end:
                return
            index = pickle[at] if width == 1 else u4(pickle, at)[0]
            at += width
            if op in _PUT:
                if not stack:
                    return
                memo[index] = stack[-1]
                built += 0 if width == 1 else 32  # an entry of the load's memo (256 at most with 1-byte indices)
                continue
            item = memo.get(index, _UNSET)
            if item is _UNSET:
                return
            if type(item) is tuple:
                referenced += item[0]
                if referenced > budget:
                    raise _Refused(f"refers to tuples that expand to more than {budget:,} elements, the same ones "
                                   "referenced over and over")
            stack.append(item)
            built += 8
        elif op in _TUPLES:
            start = (marks.pop() if marks else -1) if op == 0x74 else len(stack) - _TUPLES[op]
            if start < 0:
                return
            size_ = depth = 0
            held = []
            for item in stack[start:]:
                if item is None:
                    size_ += 1
                elif type(item) is tuple:
                    size_ += item[0]
                    depth = max(depth, item[1])
                else:
                    size_ += 1
                    held.append(item)
            if depth >= MAX_NESTING:
                raise _Refused(f"nests tuples more than {MAX_NESTING} deep")
            built += 48 + 8 * (len(stack) - start) if len(stack) > start else 0  # Python has one empty tuple
            del stack[start:]
            stack.append((1 + size_, 1 + depth, tuple(held)))
        elif op == 0x28:  # MARK
            marks.append(len(stack))
            built += 64  # the load's stack for what follows the mark
        elif op in _FILLS:  # APPEND, SETITEM: the last one or two values; APPENDS, SETITEMS: those above the mark
            start = len(stack) - _FILLS[op] if _FILLS[op] else (marks.pop() if marks else 0)
            if start < 1:
                return
            items = stack[start:]
            target = stack[start - 1]
            if type(target) is list:  # what a call over it will walk: its elements, a tuple's expanded
                plain = items.count(None)
                target[0] += len(items) if plain == len(items) else plain + sum(
                    item[0] if type(item) is tuple else 1 for item in items if item is not None)
            built += (8 if op in (0x61, 0x65) else 24) * len(items)  # a list's slot; a dict's key or value
            del stack[start:]
        elif op in _CALLS:  # REDUCE, NEWOBJ (a callable and its arguments), BUILD (an object's state)
            pops = _CALLS[op]
            if pops > len(stack):
                return
            elements, nbytes = _walked(stack[-1])
            referenced += elements
            if referenced > budget:
                raise _Refused(f"has its calls walk containers of more than {budget:,} elements in all, the same "
                               "ones over and over")
            built += 128 + nbytes
            del stack[len(stack) - pops:]
            if op != 0x62:  # the result, as a container: what is put in it later (an OrderedDict() filled by
                # SETITEMS) and what a later call over it walks again are counted (a long string copy: its length)
                stack.append(nbytes if not elements and nbytes > _LONG_STRING else [elements])
        elif op in _OTHERS:
            pops, pushes, width, cost = _OTHERS[op]
            if width < 0:  # SHORT_BINSTRING, LONG1: a length byte, then as many bytes
                width = 1 + pickle[at] if at < end else end
            if pops > len(stack) or at + width > end:
                return
            at += width
            del stack[len(stack) - pops:]
            stack.extend(repeat(None, pushes))
            built += cost
        elif op == 0x63:  # GLOBAL: a module and a name, each ending at a newline
            first = pickle.find(b"\n", at)
            at = pickle.find(b"\n", first + 1) + 1 if first >= 0 else 0
            if not at:
                return
            stack.append(None)
            built += 8
        else:  # STOP, or what the weights-only unpickler refuses by itself
            return


def _walked(argument: Any) -> tuple[int, int]:
    """What a call over ``argument`` (a stack entry of :func:`_check_pickle`) walks, and about what it builds:
    (elements, bytes). A tuple of arguments: the containers and long strings it holds itself (a call walks its
    arguments, not what they hold)."""
    if argument is None:
        return 0, 0
    kind = type(argument)
    if kind is int:  # a long string, by its length: a copy of it (_codecs.encode)
        return 0, argument
    if kind is list:  # a container: a set, Counter or dict of as many elements
        return argument[0], 64 * argument[0]
    elements = nbytes = 0
    for held in argument[2]:
        walk = _walked(held)
        elements, nbytes = elements + walk[0], nbytes + walk[1]
    return elements, nbytes


class _Refused(ValueError):
    """A pickle that :func:`_check_pickle` refuses."""


class _Run:
    """Consecutive opcodes of one kind that take ``width`` argument bytes each, matched at once; each builds about
    ``cost`` bytes (its slot on the load's stack, and the number's object unless Python keeps one)."""

    def __init__(self, op: int, width: int, cost: int) -> None:
        # Possessive (++): a greedy group keeps a backtracking frame for each repetition, 117 MiB for a million.
        self.match = re.compile(b"(?:%s[\\x00-\\xff]{%d})++" % (re.escape(bytes([op])), width)).match
        self.size, self.cost = 1 + width, cost


_UNSET = object()
_U4 = struct.Struct("<I").unpack_from
#: The weights-only unpickler's opcodes that put a number, None or a bool on the stack and take none, by the
#: bytes of their argument and what each builds: NONE, NEWTRUE, NEWFALSE; BININT1 (Python keeps 0 to 256), BININT2,
#: BININT, BINFLOAT.
_RUNS = {op: _Run(op, width, cost) for op, (width, cost) in {
    0x4E: (0, 8), 0x88: (0, 8), 0x89: (0, 8), 0x4B: (1, 8), 0x4D: (2, 40), 0x4A: (4, 40), 0x47: (8, 32)}.items()}
#: EMPTY_LIST, EMPTY_DICT, EMPTY_SET: the bytes of each, empty.
_EMPTY = {0x5D: 64, 0x7D: 72, 0x8F: 224}
#: A string longer than this is kept on the dry run's stack by its length (a call over it copies it); a shorter one
#: as None, its copy within what any call is counted to build.
_LONG_STRING = 256
#: BINPUT, LONG_BINPUT, BINGET, LONG_BINGET: the bytes of their index.
_MEMO = {0x71: 1, 0x72: 4, 0x68: 1, 0x6A: 4}
_PUT = (0x71, 0x72)
#: TUPLE, EMPTY_TUPLE, TUPLE1, TUPLE2, TUPLE3: how many values each takes off the stack (TUPLE: down to its mark).
_TUPLES = {0x74: -1, 0x29: 0, 0x85: 1, 0x86: 2, 0x87: 3}
#: APPEND, SETITEM (the values they take off the stack), APPENDS, SETITEMS (0: down to the last mark).
_FILLS = {0x61: 1, 0x73: 2, 0x65: 0, 0x75: 0}
#: REDUCE, NEWOBJ (their callable and its arguments), BUILD (its state): the values each takes off the stack.
_CALLS = {0x52: 2, 0x81: 2, 0x62: 1}
#: Its other opcodes but GLOBAL and those above: (values taken off the stack, values put on it, argument bytes, -1
#: for a length byte and as many bytes, bytes built): PROTO, BINPERSID (a storage: its bytes are the archive's
#: record, counted in its size), SHORT_BINSTRING, LONG1 (at most 256 bytes).
_OTHERS = {0x80: (0, 0, 1, 0), 0x51: (1, 1, 0, 64), 0x55: (0, 1, -1, 320), 0x8A: (0, 1, -1, 320)}


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
