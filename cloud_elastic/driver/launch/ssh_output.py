"""The SSH remote wrapper's relay of its worker's output: to the driver that started it, else kept, else to the
driver that attached to it (standard library only, as :mod:`.ssh_remote`).

The worker's standard output and error are a pipe to its wrapper, and :class:`OutputPump` (one thread) copies it:

* to the wrapper's own standard output, the first ssh connection, while its driver is there;
* once that driver is gone, into memory: the newest :data:`KEEP_BYTES`, from a line start, and a count of the
  bytes dropped before them. The wrapper tells the pump (:meth:`OutputPump.driver_gone`) when the connection's
  stdin ends, milliseconds after the driver died: a write to the connection fails only later, after a line that
  sshd took and the dead driver's ssh could not deliver (its reply then reaches sshd), so every line printed
  until then would be lost. A write that fails first (the connection dropped) switches too;
* once a restarted driver attached (``ssh_remote --attach``, over the wrapper's private Unix socket:
  :meth:`OutputPump.attach`), to that connection: first one line saying how many bytes were dropped (if any),
  then what was kept, then everything after, in frames (:func:`frame`) that the attach process unpacks onto its
  own standard output (the worker's output) and error (the wrapper's marker line), so the restarted driver
  reads them as it reads a worker it started. When that driver dies in turn, output is kept again for the next.

When the worker ends, its status goes once what it wrote has gone where it goes (:meth:`OutputPump.forwarded`), not at
the pipe's end: a child it left (DataLoader workers, a helper in a session of its own) may hold that off for as long as
it lives. What such a child writes later still goes where the output goes, until the wrapper ends.

Every send is made by the pump's thread, so nothing is duplicated or reordered across a switch. What was in
flight when a driver died is lost with it: what it had not shown yet (in its pipe, its ssh, the connection) and
what the pump sent in the moment before it learnt of the death. Nothing says which of it the driver showed, so
sending it again could show lines twice.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import struct
import termios
import threading
import time
from typing import Callable

__all__ = ["ERR", "KEEP_BYTES", "OUT", "OutputPump", "dropped_line", "frame", "pending_bytes", "relay_frames",
           "unframe"]

#: The newest output kept while no driver reads it (as a local worker keeps it: ``worker.link.kept_output``).
KEEP_BYTES = 1 << 20
#: Frame kinds on an attach connection: the worker's output, the wrapper's words (its marker line).
OUT, ERR = b"O", b"E"
_HEADER = struct.Struct(">cI")
_CHUNK = 64 * 1024


def pending_bytes(fd: int) -> int:
    """How many bytes wait in pipe ``fd`` (either end) to be read; 0 for what cannot say (a closed descriptor)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def frame(kind: bytes, data: bytes) -> bytes:
    """One frame: its kind (:data:`OUT` or :data:`ERR`), its length, its bytes."""
    return _HEADER.pack(kind, len(data)) + data


def unframe(buffer: bytearray) -> list[tuple[bytes, bytes]]:
    """The whole frames at the start of ``buffer``, removed from it (a frame cut short stays for the next read)."""
    frames = []
    while len(buffer) >= _HEADER.size:
        kind, size = _HEADER.unpack_from(buffer)
        if len(buffer) < _HEADER.size + size:
            break
        frames.append((kind, bytes(buffer[_HEADER.size:_HEADER.size + size])))
        del buffer[:_HEADER.size + size]
    return frames


def dropped_line(dropped: int) -> bytes:
    """The line a relay starts with when the newest :data:`KEEP_BYTES` were not all of it."""
    return (f"cloud-elastic remote: {dropped} bytes of the worker's output, written while no driver read it, "
            f"were dropped (the newest {KEEP_BYTES} bytes were kept)\n").encode()


class OutputPump:
    """Copies the worker's output pipe to whoever reads it now (see module docstring).

    ``start`` runs the thread; ``attach``/``lost``/``driver_gone`` (from the wrapper's watch thread) hand it a
    restarted driver's connection or say one has gone, or the first one's driver; ``join`` waits for the end of
    the worker's output. Never raises.
    """

    def __init__(self, pipe_fd: int, out_fd: int = 1) -> None:
        self._pipe = pipe_fd
        self._out: int | None = out_fd  # the first connection; None once its driver went or another attached
        self._first_gone = False  # the first connection's driver is gone (driver_gone): stop writing to it
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one writer on a connection at a time: the pump, or the marker at the end
        self._pending: list[socket.socket] = []  # attached, not yet given the kept output
        self._gone: set[socket.socket] = set()
        self._conn: socket.socket | None = None  # the attach connection output goes to now
        self._kept = bytearray()
        self._dropped = 0
        #: Bytes of output sent on the first connection, and on each attach connection (``ssh_wire.SENT``).
        self.sent_first = 0
        self._sent_on: dict[socket.socket, int] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._idle = threading.Event()  # set while the pump waits, all it read sent
        self._thread = threading.Thread(target=self._run, name="output", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until the worker's output ended and went where it goes."""
        self._thread.join(timeout_s)

    def forwarded(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until the bytes in the worker's pipe have gone where they go, and sshd has read
        those written to the first connection (so they travel before a line the wrapper writes next on stderr).
        Not until the pipe's end: a child the worker left may hold it. Whether they have (the output ended too)."""
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive():
            out = self._out
            # The pipe before the pump: its idle flag is cleared before it reads, so an empty pipe then an idle
            # pump means the bytes read are sent; the other order missed a chunk read between the two looks.
            if not pending_bytes(self._pipe) and self._idle.is_set() and (out is None or not pending_bytes(out)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def attach(self, conn: socket.socket) -> None:
        """A restarted driver attached on ``conn``: it gets the kept output, then the live output."""
        with self._lock:
            self._pending.append(conn)
        self._wake()

    def driver_gone(self) -> None:
        """The first connection's driver went (its stdin ended): keep the output from now on, not after a write to
        the connection fails (see module docstring)."""
        with self._lock:
            self._first_gone = True
        self._wake()

    def lost(self, conn: socket.socket) -> None:
        """``conn``'s driver went away (its attach process closed its side): keep the output again."""
        with self._lock:
            self._gone.add(conn)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _run(self) -> None:
        try:
            while True:
                self._idle.set()
                ready = select.select([self._pipe, self._wake_r], [], [])[0]
                self._idle.clear()
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                    self._switch()
                if self._pipe in ready:
                    data = os.read(self._pipe, _CHUNK)
                    if not data:
                        return
                    self._send(data)
        except OSError:
            return
        finally:
            os.close(self._pipe)

    def _switch(self) -> None:
        """Take up a newly attached connection (the newest wins), or drop one whose driver has gone (the first
        connection's too)."""
        with self._lock:
            pending, self._pending = self._pending, []
            gone = self._gone
            if self._first_gone:
                self._out = None
        if self._conn is not None and self._conn in gone:
            self._conn = None
        for conn in pending:
            if conn in gone:
                continue
            self._out = None  # a restarted driver speaks for the job: the first connection's reader is dead
            self._trim(KEEP_BYTES)
            payload = (dropped_line(self._dropped) if self._dropped else b"") + bytes(self._kept)
            try:
                with self._sending:
                    if payload:
                        conn.sendall(frame(OUT, payload))
                    self._sent_on[conn] = len(payload)
            except OSError:
                continue
            self._conn, self._kept, self._dropped = conn, bytearray(), 0

    def _send(self, data: bytes) -> None:
        if self._conn is not None:
            try:
                with self._sending:
                    self._conn.sendall(frame(OUT, data))
                    self._sent_on[self._conn] = self._sent_on.get(self._conn, 0) + len(data)
                return
            except OSError:
                self._conn = None
        elif self._out is not None:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self._out, view)
                    self.sent_first += n
                    view = view[n:]
                return
            except OSError:
                self._out = None  # the first connection broke: its driver died
        self._keep(data)

    def _keep(self, data: bytes) -> None:
        self._kept += data
        self._trim(2 * KEEP_BYTES)  # cut once a MiB, not at every write

    def _trim(self, limit: int) -> None:
        """Cut the kept output to its newest :data:`KEEP_BYTES`, from a line start, once it is over ``limit``."""
        if len(self._kept) <= limit:
            return
        cut = len(self._kept) - KEEP_BYTES
        line = self._kept.find(b"\n", cut, len(self._kept) - 1)
        cut = line + 1 if line >= 0 else cut
        self._dropped += cut
        del self._kept[:cut]

    def tell(self, conns: list[socket.socket], line: bytes, sent: Callable[[int], bytes]) -> None:
        """``line`` (the marker) to each of ``conns`` as the wrapper's words, after ``sent`` of the bytes of output
        sent on it (``ssh_wire.sent_line``); the worker's output may follow."""
        with self._sending:
            for conn in conns:
                try:
                    conn.sendall(frame(ERR, sent(self._sent_on.get(conn, 0))) + frame(ERR, line))
                except OSError:
                    pass

    def close_conns(self, conns: list[socket.socket], line: bytes, sent: Callable[[int], bytes]) -> None:
        """At the end: ``line`` (the marker) to each of ``conns`` (none: they were told), then close them."""
        if line:
            self.tell(conns, line, sent)
        for conn in conns:
            conn.close()


def relay_frames(conn: socket.socket) -> None:
    """``ssh_remote --attach``'s reader of the wrapper's connection: the worker's output (:data:`OUT` frames) to its
    stdout, the wrapper's words (:data:`ERR`: the marker line) to its stderr; a wrapper started before frames
    sends its marker line bare, passed on as such. Exits the process when the wrapper closes the connection (its
    marker went first), or when a write fails (the restarted driver's ssh died): the wrapper then sees the
    connection close and keeps the worker's output for the next driver. Never returns."""
    buffer, framed = bytearray(), None
    while True:
        try:
            data = conn.recv(_CHUNK)
        except OSError:
            data = b""
        if not data:
            os._exit(0)
        if framed is None:
            framed = data[:1] in (OUT, ERR)
        if not framed:
            _write_or_exit(2, data)
            continue
        buffer += data
        for kind, payload in unframe(buffer):
            _write_or_exit(1 if kind == OUT else 2, payload)


def _write_or_exit(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os._exit(1)
