"""A restarted driver relays an adopted local worker's output, as the dead driver did through its pipe.

The worker's pipe to the dead driver broke; since then the worker keeps what it writes in its job
directory (``cloud_elastic.worker.link.kept_output``: the newest MiB, and a count of what was dropped).
:class:`OutputRelay` makes a FIFO beside it (``.out-WORKER.fifo``, 0600, in the private runtime directory)
and waits on it on a thread of its own; the worker opens it at its next heartbeat tick or write, writes what
it kept (after one line saying how many bytes were dropped, if any), and then points its standard output and
error at it. The thread reads it into the driver's output with the worker's rank prefix
(:func:`~cloud_elastic.driver.launch.local.forward_lines`, as for a worker this driver started), until the
worker and its children have closed it. The FIFO is removed as soon as the worker has it open, and at
:meth:`OutputRelay.close` when it never came (it ended first, or it was stopped): nothing is left behind.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Callable

from cloud_elastic.driver.launch.local import forward_lines
from cloud_elastic.worker.link.kept_output import TRIM_AT

__all__ = ["DRAIN_S", "OutputRelay"]

log = logging.getLogger(__name__)

#: After an adopted worker's end, how long its output may still take to reach the driver's (before its exit
#: is told to the job, so the job's end line comes after the worker's last lines).
DRAIN_S = 2.0
#: The most of a kept file relayed from an ended worker (the worker holds it under ``TRIM_AT``, and its tick's slack).
_KEPT_MAX = 2 * TRIM_AT


class OutputRelay:
    """The FIFO an adopted local worker writes its output into, and the thread reading it (see module docstring).

    ``start`` makes the FIFO (a stale one of a dead driver is replaced) and starts the thread; ``close`` wakes
    a thread still waiting for the worker and removes the FIFO. Neither raises: without a relay the worker's
    output stays in its kept file, as before a driver adopted it.
    """

    def __init__(self, fifo_path: Path, on_output: Callable[[str], None], name: str, *,
                 kept: Path | None = None) -> None:
        self.fifo_path = fifo_path
        self.kept = kept  # the worker's kept output, relayed from there if it ends before it opened the FIFO
        self._on_output = on_output
        self._name = name
        self._thread: threading.Thread | None = None
        self._opened = threading.Event()
        self._closed = False
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> None:
        self._started = True
        try:
            self._remove()
            os.mkfifo(self.fifo_path, 0o600)
        except OSError as exc:
            log.warning("cannot relay the output of %s (%s): %s", self._name, self.fifo_path, exc)
            return
        self._thread = threading.Thread(target=self._run, name=f"relay-{self._name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            fd = os.open(self.fifo_path, os.O_RDONLY | os.O_CLOEXEC)  # until the worker (or close) opens it
        except OSError as exc:
            log.debug("relay of %s: %s", self._name, exc)
            return
        self._opened.set()
        self._remove()
        info = os.fstat(fd)
        if self._closed or not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.getuid():
            os.close(fd)
            return
        forward_lines(os.fdopen(fd, "rb"), self._on_output)

    def _remove(self) -> None:
        try:
            if stat.S_ISFIFO(os.lstat(self.fifo_path).st_mode):
                os.unlink(self.fifo_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.debug("relay of %s: cannot remove %s: %s", self._name, self.fifo_path, exc)

    def drained(self, ended_at: float, now: float | None = None) -> bool:
        """Whether the worker's output, ended at ``ended_at`` (monotonic), has all been read, or waiting for it
        is over (:data:`DRAIN_S`: a child of the worker may hold the FIFO open for longer)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return True
        if not self._opened.is_set():
            self.close()
            self._relay_kept()  # the worker ended before it opened the FIFO
            return True
        return (time.monotonic() if now is None else now) - ended_at >= DRAIN_S

    def _relay_kept(self) -> None:
        """What a worker that ended detached kept (its line of bytes dropped included) goes to the driver's output."""
        if self.kept is None:
            return
        try:
            fd = os.open(self.kept, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                return
            with os.fdopen(os.dup(fd), "rb") as fh:
                fh.seek(max(0, info.st_size - _KEPT_MAX))  # a file past the worker's own bound: its end
                forward_lines(fh, self._on_output)
            os.unlink(self.kept)
        except OSError as exc:
            log.debug("relay of %s: cannot read %s: %s", self._name, self.kept, exc)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Stop waiting for the worker (a thread reading goes on to the end of its output) and remove the FIFO."""
        self._closed = True
        if self._thread is not None and not self._opened.is_set():
            try:  # wakes the thread waiting in open(); it then finds the relay closed
                os.close(os.open(self.fifo_path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC))
            except OSError:
                pass
        self._remove()
