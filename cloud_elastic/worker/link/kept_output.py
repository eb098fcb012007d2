"""A local worker's output while no driver reads it: kept (bounded), then relayed to the driver that adopts it.

A local worker's standard output and error (file descriptors 1 and 2) are a pipe to its driver. When the
driver dies the pipe breaks. :class:`KeptOutput` then points both descriptors at a file in the job's private
runtime directory (``.out-WORKER.log``, mode 0600, beside the driver's ``adopt.json``), so that every write
goes on (the user's prints, native code, the worker's own children) and none of it is lost:

* bounded: past :data:`TRIM_AT` bytes the file is cut back to the newest :data:`KEEP_BYTES`, at a line start,
  after one line that says how many bytes were cut so far (:func:`dropped_line`, kept in the file, so that a
  driver relaying the file of a worker that ended reads it too). Checked after each Python write and at each
  tick of the heartbeat thread; so the file holds at most ``TRIM_AT`` plus what native code writes between
  two ticks;
* relayed: a restarted driver that takes a handle on the worker makes a FIFO beside it (``.out-WORKER.fifo``,
  :mod:`cloud_elastic.driver.restart.relay`) and reads it as it read the old pipe. At its next tick (or
  write) the worker opens it, cuts the file to the newest :data:`KEEP_BYTES` (and that line), writes it into
  the FIFO, points descriptors 1 and 2 at the FIFO, writes whatever native code added to the file meanwhile, and
  removes the file. Python writes wait for the switch (one lock), so none is duplicated or reordered;
* again: when that driver dies in turn, the FIFO breaks like the pipe did, and the same happens again;
* children: a process forked from the worker (DataLoader workers) gets a keeper of its own that owns nothing
  (``os.register_at_fork``): it never creates, trims, relays or removes the file, so it never takes the driver's
  FIFO, which that driver opens for one writer. A broken pipe points its descriptors at /dev/null, as before kept
  output existed; a child forked while the worker was detached writes into the worker's kept file (relayed with
  it) until the worker removes it, then (its next write, at most every :data:`RETRY_S` later) to /dev/null. Its
  output while no driver reads it, and after, is not relayed.

``sys.stdout`` and ``sys.stderr`` are wrapped (:func:`_survive_output_loss`, at the worker's start) so that a
write that finds the pipe broken does not raise into the training loop: it lands in the kept file instead.

Only a worker on the driver's own machine does this: its job directory there holds ``driver.json``. Started
by the SSH remote wrapper (which outlives the driver and keeps the output itself), or with no such directory,
a broken pipe points the descriptors at ``/dev/null`` as before.
"""

from __future__ import annotations

import errno
import io
import os
import select
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cloud_elastic.records import EXIT_REPORT_ENV, exit_report_path

__all__ = ["KEEP_BYTES", "KeptOutput", "TRIM_AT", "current", "dropped_line", "keep_for", "output_paths"]

#: The newest output kept while no driver reads it (per worker); the relay starts with at most this much.
KEEP_BYTES = 1 << 20
#: The kept file is cut back to :data:`KEEP_BYTES` once it is this long (so the cut is rare: once a MiB).
TRIM_AT = 2 * KEEP_BYTES
#: While detached, a write tries the restarted driver's FIFO at most this often (the heartbeat tick tries too).
RETRY_S = 0.5
_CHUNK = 64 * 1024
#: While detached, a Python write checks the kept file's size and the time to try the driver once in this many.
_CHECK_EVERY = 256

_current: "KeptOutput | None" = None
_current_lock = threading.Lock()


def output_paths(job_id: str, worker_id: str, root: Path | None = None) -> tuple[Path, Path] | None:
    """Where a local worker keeps its output while detached, and the FIFO its adopting driver reads:
    ``(log, fifo)`` in the job's runtime directory; None for an id that is not a plain name."""
    try:
        report = exit_report_path(job_id, worker_id, root)
    except Exception:  # noqa: BLE001 - ConfigError for a job id that is not a plain name: nothing kept
        return None
    if report is None:
        return None
    return report.with_name(f".out-{worker_id}.log"), report.with_name(f".out-{worker_id}.fifo")


def dropped_line(worker_id: str, dropped: int) -> str:
    """The line a relay starts with when the newest :data:`KEEP_BYTES` were not all of it."""
    return (f"cloud-elastic: worker {worker_id}: {dropped} bytes of its output, written while no driver read it, "
            f"were dropped (the newest {KEEP_BYTES} bytes were kept)\n")


def current() -> "KeptOutput | None":
    """This process's keeper, once :func:`keep_for` made one (None: a broken pipe goes to /dev/null)."""
    return _current


def keep_for(job_id: str, worker_id: str) -> "KeptOutput | None":
    """This process's keeper for worker ``worker_id`` of ``job_id`` (made once), or None where its output is not
    kept: under the SSH remote wrapper, or with no job directory on this machine that a driver writes."""
    global _current
    with _current_lock:
        if _current is None and not os.environ.get(EXIT_REPORT_ENV):
            paths = output_paths(job_id, worker_id)
            if paths is not None and (paths[0].parent / "driver.json").is_file():
                _current = KeptOutput(worker_id, *paths)
        return _current


def _after_fork_in_child() -> None:
    global _current_lock
    _current_lock = threading.Lock()
    if _current is not None:
        _current._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _file_id(fd: int) -> tuple[int, int] | None:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _broken(fd: int) -> bool:
    """``fd`` is a pipe or FIFO whose every reader is gone (poll says POLLERR to a writer then)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class KeptOutput:
    """Descriptors 1 and 2 of this process while no driver reads them (see module docstring).

    ``lock`` is held by every write of ``sys.stdout``/``sys.stderr`` (``driver_link._SurvivingStream``) and by
    the switches, so Python's writes are never duplicated, reordered or lost across one. Never raises.
    """

    def __init__(self, worker_id: str, log_path: Path, fifo_path: Path) -> None:
        self.worker_id = worker_id
        self.log_path = log_path
        self.fifo_path = fifo_path
        self.lock = threading.RLock()
        self.dropped = 0  # bytes cut from the kept file since it was last relayed
        self._head = 0  # the length of the line saying so, at the start of the kept file
        self._file: int | None = None  # the kept file, open O_RDWR | O_APPEND, while detached
        self._fds: tuple[int, ...] = ()  # the descriptors pointed at it
        self._next_try = 0.0
        self._writes = self._written = 0  # Python writes (and their characters) since wrote() last checked
        #: Why the last trim or relay failed (for a debugger): never logged, as it happens under ``lock``, which a
        #: write holds, and a logging handler's own lock taken inside it could deadlock with one taken outside.
        self.last_error = ""
        self._relayer: threading.Thread | None = None
        #: The process whose output this is. A child forked from it (a DataLoader worker, a multiprocessing
        #: helper) inherits this object but must neither trim, relay nor remove the file: it would take the
        #: adopting driver's FIFO, which that driver opens for one writer, and the worker's output would be lost.
        self.pid = os.getpid()
        self._kept_id: tuple[int, int] | None = None  # (device, inode) of the kept file a forked child writes to

    def _forked(self) -> None:
        """In a child just forked (``os.register_at_fork``): a lock of its own (the parent's may be held by a
        thread that does not exist here), and no kept file of its own: its descriptors 1 and 2 go where the
        parent's went at the fork. If they break (the driver died), they go to /dev/null (:meth:`broken`), and if
        they were the worker's kept file, they do once the worker removed it (:meth:`_drop_removed`): a child
        never creates, grows or follows anything of the worker's (review s60 rvW: a child that created the file
        anew after the worker's switch grew it unbounded, unrelayed; one that followed the worker through
        ``/proc/PID/fd`` wrote into an unrelated process once the worker had ended and its pid was reused)."""
        self.lock = threading.RLock()
        self._relayer = None
        self._fds = ()
        self._next_try = 0.0
        if self._file is not None:
            try:
                self._kept_id = _file_id(self._file)
                os.close(self._file)
            except OSError:
                pass
        self._file = None

    @property
    def detached(self) -> bool:
        return self._file is not None

    def broken(self) -> bool:
        """A write found the pipe broken: point the broken descriptors at the kept file (at /dev/null where it
        cannot be opened). True when kept (the write can go again), False when at /dev/null."""
        with self.lock:
            if self._file is not None:
                self._point(self._file, tuple(fd for fd in (1, 2) if _broken(fd)))
                return True
            fds = tuple(fd for fd in (1, 2) if _broken(fd))
            if self.pid != os.getpid():  # a forked child: its output goes nowhere once its pipe broke (see _forked)
                self._point(None, fds)
                return False
            try:
                self._file = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                                     | os.O_CLOEXEC, 0o600)
            except OSError:
                self._point(None, fds)
                return False
            self._fds = fds
            self._point(self._file, fds)
            self._next_try = 0.0
            return True

    @staticmethod
    def _point(target: int | None, fds: tuple[int, ...]) -> None:
        try:
            if target is None:
                target = os.open(os.devnull, os.O_WRONLY)
                try:
                    for fd in fds:
                        os.dup2(target, fd)
                finally:
                    os.close(target)
                return
            for fd in fds:
                os.dup2(target, fd)
        except OSError:
            pass

    def wrote(self, size: int = 1) -> None:
        """After a Python write of ``size`` characters (``lock`` held): keep the file bounded, try the restarted
        driver now and then."""
        if self.pid != os.getpid():
            self._drop_removed()
            return
        if self._file is None:
            return
        # Counted, not measured: an fstat and a clock read on every write made a detached print() cost 2.7 times
        # a plain file's. The file may pass TRIM_AT by up to _CHUNK characters before it is cut.
        self._writes += 1
        self._written += size
        if self._writes < _CHECK_EVERY and self._written < _CHUNK:
            return
        self._writes = self._written = 0
        self._trim(TRIM_AT)
        if time.monotonic() >= self._next_try:
            self._relay()

    def tend(self) -> None:
        """A tick of the heartbeat thread: notice a broken pipe nobody wrote to yet (native writes then go to
        the file, not to a dead pipe), keep the file bounded, and relay it to an adopting driver (on a thread of
        its own, so the heartbeat never waits for that driver to read)."""
        if self.pid != os.getpid():
            return
        if self._file is None:
            if not any(_broken(fd) for fd in (1, 2)):
                return
            with self.lock:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()  # through _SurvivingStream: its BrokenPipeError lands in broken()
                    except (OSError, ValueError):
                        pass
                if self._file is None:
                    self.broken()
            return
        if not self.lock.acquire(blocking=False):
            return  # a write holds it, or a relay under way: the next tick
        try:
            if self._file is not None:
                self._trim(TRIM_AT)
            due = self._file is not None and os.path.exists(self.fifo_path)
        finally:
            self.lock.release()
        if due and (self._relayer is None or not self._relayer.is_alive()):
            # On a thread of its own: the copy waits for the driver to read up to a MiB, and heartbeats must not.
            self._relayer = threading.Thread(target=self._relay_now, name="output-relay", daemon=True)
            self._relayer.start()

    def _drop_removed(self) -> None:
        """In a forked child, now and then: a descriptor still on the worker's kept file after the worker relayed
        and removed it goes to /dev/null, so that the removed file does not grow unseen for the child's life."""
        now = time.monotonic()
        if now < self._next_try or self._kept_id is None:
            return
        self._next_try = now + RETRY_S
        for fd in (1, 2):
            try:
                info = os.fstat(fd)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == self._kept_id and not info.st_nlink:
                self._point(None, (fd,))

    def _relay_now(self) -> None:
        with self.lock:
            if self._file is not None:
                self._relay()

    def _trim(self, limit: int) -> None:
        """Cut the kept file back to its newest :data:`KEEP_BYTES` (from a line start) once over ``limit``."""
        fd = self._file
        try:
            size = os.fstat(fd).st_size
            if size <= limit:
                return
            tail = os.pread(fd, KEEP_BYTES, size - KEEP_BYTES)
            start = tail.find(b"\n") + 1  # 0 when no line ends in it: keep it all
            kept = tail[start:] if start < len(tail) else tail
            self.dropped += size - len(kept) - self._head  # the last count's own line is no output of the worker's
            line = dropped_line(self.worker_id, self.dropped).encode()
            os.ftruncate(fd, 0)
            _write_all(fd, line + kept)  # O_APPEND: at the start of the emptied file
            self._head = len(line)
        except OSError as exc:
            self.last_error = f"could not trim its kept output: {exc}"

    def _relay(self) -> None:
        """Hand the kept output to the driver reading our FIFO, then point descriptors 1 and 2 at it (``lock``
        held). Nothing when there is no FIFO or no reader yet: tried again later."""
        self._next_try = time.monotonic() + RETRY_S
        try:
            fifo = os.open(self.fifo_path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENXIO):
                self.last_error = f"cannot open {self.fifo_path}: {exc}"
            return
        try:
            info = os.fstat(fifo)
            if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.getuid():
                return
            os.set_blocking(fifo, True)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()  # what Python still buffers goes to the file first, in order
                except (OSError, ValueError):
                    pass
            self._trim(KEEP_BYTES + self._head)
            sent = self._copy(fifo, 0)
            fds = self._fds or (1, 2)
            for fd in fds:
                os.dup2(fifo, fd)
            self._copy(fifo, sent)  # what native code wrote between the copy and the switch
        except OSError as exc:  # that driver died meanwhile: stay detached, the next one gets it
            self.last_error = f"could not relay its kept output: {exc}"
            return
        finally:
            os.close(fifo)
        os.close(self._file)
        self._file, self._fds, self.dropped, self._head = None, (), 0, 0
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def _copy(self, to: int, offset: int) -> int:
        """Write the kept file from ``offset`` to its end into ``to``; the offset reached."""
        while data := os.pread(self._file, _CHUNK, offset):
            _write_all(to, data)
            offset += len(data)
        return offset


class _SurvivingStream:
    """``sys.stdout``/``sys.stderr`` that outlive their reader.

    A local worker's output is a pipe to its driver. When the driver dies the
    pipe breaks, and the next ``print`` would raise BrokenPipeError inside the
    training loop, although workers are meant to train on for the driver
    grace. The first write that finds the pipe broken points the file
    descriptors at the job's kept output (:class:`KeptOutput`: bounded, and
    relayed to a driver that adopts this worker), or at /dev/null where there
    is none (a worker under the SSH remote wrapper, which keeps its output
    itself), and writes again there: the line that found the pipe broken is
    kept too. While output is kept, every write holds the keeper's lock, so
    the switch to an adopting driver's FIFO never splits or reorders them.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _lost(self) -> bool:
        """The pipe broke: True when the descriptors now go to kept output, False when to /dev/null."""
        keeper = current()
        if keeper is not None:
            return keeper.broken()
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return False

    def _again(self, data: Any) -> None:
        """After :meth:`_lost`: what the failed write held goes to the new place. An unbuffered stream
        dropped it (write it again); a buffered one holds it (flush it)."""
        try:
            if isinstance(getattr(self._stream, "buffer", None), io.RawIOBase):
                self._stream.write(data)
            else:
                self._stream.flush()
        except OSError:
            pass

    def write(self, data: Any) -> int:
        keeper = current()
        if keeper is None:
            return self._write(data)
        with keeper.lock:
            written = self._write(data)
            keeper.wrote(len(data))
            return written

    def _write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except BrokenPipeError:
            self._lost()
            self._again(data)
            return len(data)

    def flush(self) -> None:
        keeper = current()
        if keeper is None:
            self._flush()
            return
        with keeper.lock:
            self._flush()

    def _flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._lost()
            try:
                self._stream.flush()  # drains the buffered bytes into their new place
            except OSError:
                pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _survive_output_loss() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _SurvivingStream):
            setattr(sys, name, _SurvivingStream(stream))
