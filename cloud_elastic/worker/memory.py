"""Keep freed memory for reuse: no page faults for the tensors every step allocates anew.

Each step, autograd allocates fresh gradient and activation tensors and
``zero_grad()`` frees them. glibc's allocator returns freed memory at the
top of its heap to the OS once more than its trim threshold (dynamically
about twice the largest freed block) is free there, and the next backward
faults the same pages back in, zero-filled by the kernel. Whether that
happens depends on where the blocks happen to lie, so the same job runs
clean one time and pays thousands of page faults per step the next
(for the benchmark model, from about a hundred to tens of thousands of
faults per second).

:func:`keep_freed_memory` fixes glibc's thresholds: blocks up to 32 MiB (its
maximum for this setting) come from the heap, and up to 1 GiB of free heap
is kept for the next step instead of being trimmed. The memory kept is what
the step itself needs again; nothing is leaked. It is skipped when the user
set either threshold through glibc's own environment variables, and
``CLOUD_ELASTIC_MALLOC_TUNING=0`` turns it off (both read into
:class:`~cloud_elastic.worker.settings.WorkerSettings`).

:func:`collector_paused` holds Python's cyclic garbage collector off while a worker imports what it preloads
(``torch._dynamo`` on top of torch; the fork server's whole preload): each full pass the import's allocations set
off goes over every object torch already made, and the collector, not the import, was much of that CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
from typing import Iterator

__all__ = ["keep_freed_memory", "collector_paused", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES"]

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # not a GNU system
        return False


def keep_freed_memory(enabled: bool) -> bool:
    """Set glibc's mmap and trim thresholds as described above; True if they were set.

    ``enabled`` is ``WorkerSettings.malloc_tuning``: false when the user turned
    it off or tuned the allocator through glibc's own variables (theirs wins).
    """
    if not enabled:
        return False
    if not _is_glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mmap threshold first: setting either one turns glibc's dynamic thresholds off.
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    log.debug("glibc malloc thresholds %s", "set" if ok else "refused")
    return ok


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, then as it was (a caller that had it off keeps it off).

    For imports only, which make few cycles that die: importing ``torch._dynamo`` after torch took 1.5 CPU-s with
    the collector on and 0.8 with it off (2026-12-02, this project's 2-core VM, three runs each), since each full
    pass went over torch's own objects again. Objects made in the block are the collector's again after it; the
    preload ends with one full pass of its own (``context._preload_lazy_modules``), so that the collector's later
    passes over them do not come in a worker's first steps.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
