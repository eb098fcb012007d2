"""Whether bytes are a ``torch.save`` archive that ``torch.load`` reads within their own size.

``torch.load`` allocates each record's announced size and inflates a compressed record (1 MB into a
GiB): a checkpoint read from storage (``checkpoint.safety``) and a state received from a peer
(``worker.comm.statecodec``) are both checked here, from the archive's directory alone, before they
are loaded. Light on purpose (no torch): a worker imports it at start-up.
"""

from __future__ import annotations

import errno
import io
import os
import zipfile
from typing import IO

__all__ = ["stored_records"]


def stored_records(file: IO[bytes], offset: int, length: int) -> list[zipfile.ZipInfo]:
    """The records of the zip archive in the ``length`` bytes of ``file`` from ``offset``, read from its directory
    alone; ValueError, saying why, unless it is one as ``torch.save`` writes (not the legacy format, whose header
    gives the sizes to allocate) of stored records whose sizes sum to at most ``length``: ``torch.load`` allocates
    each record's announced size and inflates a compressed one (1 MB into a GiB). An OSError of ``file`` is
    raised as it is: storage trouble, not a bad archive."""
    window = _Window(file, offset, length)
    try:
        records = zipfile.ZipFile(window).infolist() if window.read(4) == b"PK\x03\x04" else None
    except Exception as exc:  # zipfile's BadZipFile, ValueError, EOFError, ... for a forged directory
        if isinstance(exc, OSError) and not isinstance(exc, _OutOfArchive):
            raise
        why = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise ValueError(f"is not a readable zip archive (torch.save's format): {why}") from None
    if records is None:
        raise ValueError("is not a zip archive (torch.save's format)")
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED or record.compress_size != record.file_size:
            raise ValueError(f"holds a compressed record {record.filename!r} ({record.compress_size:,} bytes "
                             f"announcing {record.file_size:,}), which torch.save never writes")
    total = sum(record.file_size for record in records)
    if total > length:
        raise ValueError(f"holds records of {total:,} bytes in {length:,}")
    return records


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
