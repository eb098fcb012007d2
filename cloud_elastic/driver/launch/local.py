"""Starting workers on this machine (``localhost`` and every loopback address)."""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from cloud_elastic.driver.launch import forkserver
from cloud_elastic.driver.launch.forkserver import ForkServer
from cloud_elastic.driver.launch.api import ExitStatus, OutputSink, WorkerSpec
from cloud_elastic.driver.launch.local_main import through_main
from cloud_elastic.driver.launch.drain import DRAIN_WAIT_S, DrainClock
from cloud_elastic.driver.launch.ssh_output import pending_bytes
from cloud_elastic.driver.launch.ssh_remote import secret_fd_value, secret_pipe
from cloud_elastic.errors import LaunchError
from cloud_elastic.worker.settings import SECRET_ENV, SECRET_FD_ENV

__all__ = ["CommandNotStarted", "ForkedProcess", "LocalLauncher", "LocalProcess", "NotStarted", "forward_lines",
           "kill_group", "process_start_time"]

log = logging.getLogger(__name__)

#: Distinct sets of start-up variables given a fork server each; workers of any other start from scratch.
_MAX_SERVERS = 4


#: Bytes read at a time, and the longest piece of a line forwarded at once: a stream costs at most a few times this.
_CHUNK = 64 * 1024
_BREAK = re.compile(rb"\r\n|\r|\n")
#: A progress bar redrawn in place (lines ended by a bare \r) is forwarded at most once per this many seconds.
REDRAW_EVERY_S = 5.0


def forward_lines(stream, on_output: OutputSink, *, on_first_data: Callable[[], None] | None = None,
                  clock: Callable[[], float] = time.monotonic, idle: threading.Event | None = None) -> None:
    """Read ``stream`` into ``on_output``, a line per call, until EOF (runs on its own thread).

    A line ends at ``\n`` or at a bare ``\r`` (a progress bar redrawing itself, as tqdm does without
    ever writing ``\n``). Of the ``\r``-ended lines, one is forwarded at most every :data:`REDRAW_EVERY_S`;
    the latest one held back goes before the next ``\n``-ended line and at EOF, so the bar's last state is
    never lost while a bar redrawn ten times a second costs the driver's output a line per few seconds, not
    ten. A line longer than ``_CHUNK`` bytes goes in pieces, so memory stays bounded however the worker
    writes. ``on_first_data`` is called once, when the first bytes arrive. ``idle`` is set while it waits in a
    read, everything read before forwarded (see :class:`OutputReader`).
    """
    read = getattr(stream, "read1", None) or stream.read
    rest, after_cr, redraws = b"", False, _Redraws(on_output, clock)
    try:
        while True:
            if idle is not None:
                idle.set()
            data = read(_CHUNK)
            if idle is not None:
                idle.clear()
            if not data:
                break
            if on_first_data is not None:
                on_first_data()
                on_first_data = None
            if after_cr and data.startswith(b"\n"):
                data = data[1:]  # the \n of a \r\n split between two reads
            after_cr = data.endswith(b"\r")
            rest = _forward_segments(rest + data, redraws)
        redraws.flush()
        if rest:
            on_output(_text(rest))
    except (OSError, ValueError):
        pass
    finally:
        stream.close()


class _Redraws:
    """The ``\r``-ended lines of one stream: forwarded at most one per :data:`REDRAW_EVERY_S`, the latest held."""

    def __init__(self, on_output: OutputSink, clock: Callable[[], float]) -> None:
        self.on_output = on_output
        self._clock = clock
        self._held = b""  # at most one line: the latest redraw not yet forwarded
        self._last = -math.inf

    def redraw(self, segment: bytes) -> None:
        if not segment.strip():
            return  # a bar being wiped (tqdm.write clears it with spaces)
        now = self._clock()
        if now - self._last >= REDRAW_EVERY_S:
            self._last, self._held = now, b""
            _forward_pieces(segment, self.on_output, keep_last=False)
        else:
            self._held = segment

    def flush(self) -> None:
        held, self._held = self._held, b""
        if held:
            self._last = self._clock()
            _forward_pieces(held, self.on_output, keep_last=False)


def _forward_segments(buf: bytes, redraws: _Redraws) -> bytes:
    """Forward the lines ``buf`` completes; return the unfinished rest (at most ``_CHUNK`` bytes)."""
    start = 0
    for match in _BREAK.finditer(buf):
        segment, start = buf[start:match.start()], match.end()
        if match.group() == b"\r":
            redraws.redraw(segment)
        else:
            redraws.flush()
            _forward_pieces(segment, redraws.on_output, keep_last=False)
    return _forward_pieces(buf[start:], redraws.on_output, keep_last=True)


def _forward_pieces(raw: bytes, on_output: OutputSink, *, keep_last: bool) -> bytes:
    """Forward ``raw`` in pieces of at most ``_CHUNK`` bytes; return the last piece instead if ``keep_last``."""
    while len(raw) > _CHUNK:
        cut = _CHUNK
        while cut > _CHUNK - 3 and raw[cut] & 0xC0 == 0x80:
            cut -= 1  # not inside a UTF-8 character
        on_output(_text(raw[:cut]))
        raw = raw[cut:]
    if keep_last:
        return raw
    on_output(_text(raw))
    return b""


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace")


class OutputReader:
    """The thread that forwards a local worker's output (stdout and stderr) line by line, and whether it is behind."""

    def __init__(self, stream, on_output: OutputSink, worker_id: str) -> None:
        self._fd = stream.fileno()
        self._idle = threading.Event()
        self.thread = threading.Thread(target=forward_lines, args=(stream, on_output), kwargs={"idle": self._idle},
                                       name=f"out-{worker_id}", daemon=True)
        self.thread.start()

    def behind(self) -> bool:
        """Whether bytes written to the pipe are still to be forwarded: read and not forwarded yet, or still in the
        pipe. Not whether the pipe has ended: a child the worker left (DataLoader workers, a helper process) may
        hold it open for seconds after the worker's exit, and the exit must not wait for it (review rvL: a kill -9
        was told 2 s late, and the survivors waited that long in a collective the child's inherited socket kept
        open)."""
        if not self.thread.is_alive():
            return False
        if not self._idle.is_set():
            return True
        return pending_bytes(self._fd) > 0 or not self._idle.is_set()


class OutputEnd:
    """Whether a local worker's exit may be told yet: only once its output reader has forwarded what the pipe
    held, so that its last lines (the error line it died with among them: the job's end line names it) have been
    forwarded before its exit is judged (under a slow reader of the driver's own stdout it falls behind); or
    once :class:`~cloud_elastic.driver.launch.drain.DrainClock`'s bound is up, counted from the exit first seen,
    in time the driver had a CPU (a backlog that keeps moving to a slow terminal does not hold it longer, nor the
    recovery waiting for it). Only output still to forward holds it (under a slow reader of the driver's own stdout:
    a pager, a stalled terminal), not a pipe a child the worker left keeps open. ``reader`` None (a process of no
    output of ours) never holds an exit back. A line the worker left unended is forwarded at the pipe's end only."""

    def __init__(self, reader: OutputReader | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._reader = reader
        self._drain = DrainClock(clock)

    def holds(self) -> bool:
        """Called with the exit seen: True while its output is still being forwarded, within the bound."""
        if self._reader is None or not self._reader.behind():
            return False
        return not self._drain.up()

    def wait(self) -> None:
        """Block until the output is read to its end, or :data:`~cloud_elastic.driver.launch.drain.DRAIN_WAIT_S` of
        wall time (a stop, which may block)."""
        if self._reader is not None:
            self._reader.thread.join(DRAIN_WAIT_S)


def _ended_unreaped(pid: int) -> bool:
    """Whether child ``pid`` has ended and is not reaped yet (a zombie); it stays so (``WNOWAIT``)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False


def kill_group(pid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pid``; a group that is gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (None if it is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class LocalProcess:
    """A worker running as a child process in its own session (process group).

    ``poll`` and ``kill`` never block; ``terminate`` blocks up to its grace.
    The child stays unreaped (a zombie) until ``poll`` or ``terminate`` sees it end.
    ``reader`` is the thread reading its output: its exit is told once that has read it all (:class:`OutputEnd`).
    """

    def __init__(self, spec: WorkerSpec, popen: subprocess.Popen, reader: OutputReader | None = None) -> None:
        self.spec = spec
        self._popen = popen
        self._lock = threading.Lock()
        self._start = process_start_time(popen.pid)
        self._output = OutputEnd(reader)

    def handle(self) -> dict[str, object]:
        """How a restarted driver finds this process again (see :mod:`cloud_elastic.driver.restart.record`)."""
        return {"kind": "local", "pid": self._popen.pid, "start": self._start}

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> ExitStatus | None:
        """The exit status once the child has ended (reaping it) and its output is read, else ``None``. Never blocks.

        When it has ended, what it left in its process group (a helper it started, a ``subprocess`` it never waited
        for) is killed before it is reaped, as the ssh wrapper does on a host: such a process outlived a worker that
        exited by itself (review h13). Its zombie keeps the group's id from reuse until then."""
        if self._popen.returncode is None and self._lock.acquire(blocking=False):  # else terminate() is at it
            try:
                if _ended_unreaped(self._popen.pid):
                    kill_group(self._popen.pid, signal.SIGKILL)
            finally:
                self._lock.release()
        code = self._popen.poll()
        return None if code is None or self._output.holds() else ExitStatus(code)

    def terminate(self, grace_s: float = 5.0) -> None:
        """TERM the group, KILL it after ``grace_s``, reap the child. Blocks up to ``grace_s``; idempotent."""
        with self._lock:
            if self._popen.poll() is None:
                kill_group(self._popen.pid, signal.SIGTERM)
                deadline = time.monotonic() + grace_s
                while self._popen.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            # Children the worker left behind in its group go too.
            kill_group(self._popen.pid, signal.SIGKILL)
            self._popen.wait()
        self._output.wait()

    def kill(self) -> None:
        """SIGKILL the whole group and return at once; ``poll`` reaps the child. Idempotent."""
        kill_group(self._popen.pid, signal.SIGKILL)

    def dump_stacks(self) -> bool:
        """Ask the worker process (not its children) to print its Python stacks (SIGUSR1, which the worker
        library hands to ``faulthandler``: it answers even with its interpreter stuck); False if it is gone."""
        try:
            os.kill(self._popen.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return self._popen.poll() is None


class ForkedProcess:
    """A worker forked by a :class:`~cloud_elastic.driver.launch.forkserver.ForkServer`, with ``LocalProcess``'s interface.

    The server is its parent and reaps it at once, so its pid could be reused after its
    exit: signals go to it only while its exit is unreported and ``/proc`` still shows
    the process that started. Its exit is told once ``reader`` has read its output (:class:`OutputEnd`).
    """

    def __init__(self, spec: WorkerSpec, server: ForkServer, pid: int, reader: OutputReader | None = None) -> None:
        self.spec = spec
        self._server = server
        self._pid = pid
        self._lock = threading.Lock()
        self._start = process_start_time(pid)
        self._output = OutputEnd(reader)

    def handle(self) -> dict[str, object]:
        return {"kind": "local", "pid": self._pid, "start": self._start}

    @property
    def pid(self) -> int:
        return self._pid

    def _alive(self) -> bool:
        return self._server.exit_code(self._pid) is None and process_start_time(self._pid) == self._start

    def poll(self) -> ExitStatus | None:
        status = self._ended()
        return None if status is None or self._output.holds() else status

    def _ended(self) -> ExitStatus | None:
        code = self._server.exit_code(self._pid)
        if code is not None:
            return ExitStatus(code)
        if self._server.gone and process_start_time(self._pid) != self._start:
            return ExitStatus(1, known=False)  # ended after its server: nobody here learnt how
        return None

    def _signal_group(self, sig: int) -> None:
        if self._alive():
            kill_group(self._pid, sig)

    def terminate(self, grace_s: float = 5.0) -> None:
        with self._lock:
            if self._ended() is None:
                self._signal_group(signal.SIGTERM)
                deadline = time.monotonic() + grace_s
                while self._ended() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._signal_group(signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self._ended() is None and time.monotonic() < deadline:
                self._server.wait_exit(self._pid, 0.2)
        self._output.wait()

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def dump_stacks(self) -> bool:
        if not self._alive():
            return False
        try:
            os.kill(self._pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return self.poll() is None


@dataclass(frozen=True)
class NotStarted(ExitStatus):
    """A worker on this machine that could not be started: its own failure, never its host's (this machine is
    reachable). ``code`` is a shell's (127: command not found, 126: not executable); ``why`` says what
    could not start, and is what the job's messages show for it."""

    why: str = ""

    @property
    def describe(self) -> str:
        return self.why or super().describe


#: Why exec(2) refuses a command itself (not the driver's resources: descriptors, memory, processes).
_EXEC_ERRORS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR,
                          errno.ELOOP, errno.ENAMETOOLONG, errno.E2BIG})


class CommandNotStarted(LaunchError):
    """The worker's command could not be executed here: a typo, a script without ``python`` or without its
    x bit, a missing working directory. ``status`` is the exit the job takes it as (:class:`NotStarted`)."""

    def __init__(self, command: str, cwd: str | None, exc: OSError) -> None:
        code = 127 if exc.errno == errno.ENOENT else 126
        what = exc.strerror or str(exc)
        if cwd is not None and exc.filename == cwd:
            what += f" (its working directory {cwd!r})"
        elif code == 127 and os.sep in command and os.path.isfile(os.path.join(cwd or "", command)):
            what += " (the interpreter its #! line names; a CRLF line end?)"
        elif code == 126 and os.sep in command and os.path.isdir(os.path.join(cwd or "", command)):
            what += " (it is a directory, not a program)"
        elif code == 126 and os.sep in command and os.path.isfile(os.path.join(cwd or "", command)):
            what += " (no execute permission: chmod +x it, or name its interpreter, e.g. python script.py)"
        why = f"could not start its command {command!r}: {what} (exit code {code})"
        super().__init__(why)
        self.status = NotStarted(code, why=why)


class LocalLauncher:
    """Starts each worker as a process with its own process group: forked from a server
    that imported torch once when it can (:mod:`.forkserver`), otherwise as a child process (the driver's Python
    running a script or a module runs it through :mod:`.local_main`, and so knows its exit code).

    The secret is never on a command line nor in a worker's environment, where ``/proc/PID/environ``
    would show it to every process of the user for the worker's life: a forked worker gets it from the
    server (over its private socket), one started from scratch through an inherited pipe
    (``CLOUD_ELASTIC_SECRET_FD``), which a shell wrapping the worker passes on.
    """

    def __init__(self) -> None:
        self._forking = forkserver.enabled()
        self._servers: dict[tuple[tuple[str, str], ...], ForkServer | None] = {}
        self._servers_lock = threading.Lock()

    def _server_for(self, env: dict[str, str]) -> ForkServer | None:
        key = forkserver.startup_key(env)
        with self._servers_lock:
            if key not in self._servers:
                if len(self._servers) >= _MAX_SERVERS:
                    return None
                self._servers[key] = forkserver.start_server(env)
            server = self._servers[key]
        return None if server is None or server.gone else server

    def _fork(self, spec: WorkerSpec, env: dict[str, str], on_output: OutputSink) -> ForkedProcess | None:
        cwd = spec.cwd or os.getcwd()
        how = forkserver.forkable(spec.command, env, cwd) if self._forking else None
        server = self._server_for(env) if how is not None else None
        if server is None or not server.fits(spec.command, env):
            return None
        how = {**how, "argv": list(spec.command)}
        read_fd, write_fd = os.pipe()
        try:
            pid = server.spawn(how, env, cwd, write_fd)
        except LaunchError:
            os.close(read_fd)
            if not server.gone:
                raise
            return None  # the server died: start this one from scratch
        finally:
            os.close(write_fd)
        reader = OutputReader(os.fdopen(read_fd, "rb"), on_output, spec.worker_id)
        log.debug("forked %s as pid %d", spec.worker_id, pid)
        return ForkedProcess(spec, server, pid, reader)

    def launch(self, spec: WorkerSpec, on_output: OutputSink) -> LocalProcess | ForkedProcess:
        env = dict(os.environ)
        env.update(spec.env)
        # `python` in the command means the driver's interpreter (its virtualenv), as over SSH.
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        # The fork server takes the secret out of the request's environment before the worker runs.
        forked = self._fork(spec, {**env, SECRET_ENV: spec.secret}, on_output)
        if forked is not None:
            return forked
        # A script run through local_main knows the code it exits with and says it: a driver restarted after this one
        # adopts the worker but cannot reap it (see local_main).
        command = through_main(spec.command, forkserver.forkable(spec.command, env, spec.cwd or os.getcwd()))
        secret_fd = secret_pipe(spec.secret)
        env[SECRET_FD_ENV] = secret_fd_value(secret_fd)
        try:
            popen = subprocess.Popen(
                command,
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(secret_fd,),
                start_new_session=True,
            )
        except OSError as exc:
            if exc.errno in _EXEC_ERRORS:
                raise CommandNotStarted(spec.command[0], spec.cwd, exc) from exc
            raise LaunchError(f"cannot start {spec.command[0]!r} for {spec.worker_id}: {exc.strerror or exc}") from exc
        finally:
            os.close(secret_fd)
        reader = OutputReader(popen.stdout, on_output, spec.worker_id)
        log.debug("started %s as pid %d", spec.worker_id, popen.pid)
        return LocalProcess(spec, popen, reader)

    def close(self) -> None:
        with self._servers_lock:
            servers, self._servers = [s for s in self._servers.values() if s is not None], {}
        for server in servers:
            server.close()
