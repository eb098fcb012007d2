"""The remote half of the SSH launcher: runs on the worker host as ``python3 -m cloud_elastic.driver.launch.ssh_remote``.

usage: ``python3 -m cloud_elastic.driver.launch.ssh_remote [--env] [--term-kills] NONCE GRACE_S KEEPALIVE_S CWD
COMMAND...``
or ``python3 -m cloud_elastic.driver.launch.ssh_remote --attach NONCE`` (see 5. below)
or ``python3 -m cloud_elastic.driver.launch.ssh_remote --exit-reports NONCE...`` (see 6. below)

One wrapper per worker, started by :class:`~cloud_elastic.driver.launch.ssh.SSHLauncher` through ssh. It

1. reads the per-job secret from the first line of its stdin and hands it to the worker through an inherited pipe
   whose descriptor ``CLOUD_ELASTIC_SECRET_FD`` names (:func:`secret_pipe`), so the secret is on no command line,
   local or remote, and not in the worker's environment (``/proc/PID/environ``, which other processes of the user
   can read, shows the environment a process started with, whatever it removes later); with ``--env``, it reads
   the worker's variables from the second line (:func:`parse_env`), so their values are on no command line either;
2. starts ``COMMAND`` in ``CWD`` in a **new session and process group**, stdin from ``/dev/null``, stderr merged
   into stdout, asks the kernel to KILL that process if the wrapper dies (``PR_SET_PDEATHSIG``), and says so
   (:data:`STARTED`);
3. watches its own stdin (:class:`Watchdog`). A ``KILL`` or ``TERM <grace>`` line, or a HUP/INT to the wrapper,
   stops the worker's *whole process group* at once: TERM, then KILL after the grace. The first TERM to the
   wrapper (the host is going: start-sshd.sh passes a pod's SIGTERM on) goes to the worker's process alone, which
   may leave at its next commit (``worker.termination``); a second stops the group. With ``--term-kills`` (a Ray
   actor's wrapper: Ray TERMs a dead actor's process group) a SIGTERM, or end of file, KILLs the group: the actor
   died, its host is not going. Otherwise end of file (the driver died, the local ssh died, the connection dropped)
   or no keepalive line for ``KEEPALIVE_S`` (0 = off) means the driver is gone: the worker may train on for the
   driver grace (``CLOUD_ELASTIC_DRIVER_GRACE_S`` in the worker's variables, as the driver passes it to workers)
   and normally exits by itself at its end; the wrapper stops its group a margin later (:data:`GRACE_MARGIN_S`), so
   nothing outlives a lost driver for long. Keepalive lines that resume within the grace cancel it;
4. when the worker ends, writes its exact status on a marker line on stderr (:func:`marker_line`), which the launcher
   parses (:func:`parse_marker`) and removes from the output, as soon as the worker's own output is out (not at its
   pipe's end, which a child it left may hold off), after a line counting the bytes of it sent on that connection
   (:func:`sent_line`: the launcher reads them all first), then stops whatever is left in its group and exits;
5. listens on a Unix socket private to the user (:func:`control_path`, in a 0700 directory), so that a driver
   restarted within the grace can adopt the worker through a fresh ssh connection running ``--attach NONCE``: that
   process relays its stdin to the wrapper (keepalives, ``KILL``, ``TERM``: the same watchdog, and any data from it
   cancels a pending "driver lost" stop) and the wrapper's marker line back on its stderr. The worker's own output
   goes through the wrapper (:class:`~cloud_elastic.driver.launch.ssh_output.OutputPump`): to the first connection
   while its driver is there, kept (the newest MiB) once its stdin ended (with a driver grace) or it broke, and to an
   attach connection, in frames that ``--attach`` unpacks onto its stdout, from the kept output on;
6. tells the worker where to leave its exit report once its training function returned (:data:`EXIT_REPORT_ENV`,
   :func:`report_path`, beside the control socket) and, when the worker ends, writes the worker's exact status into
   it as its ``code`` (a plain interpreter cannot tell its own exit code): a driver restarted after the worker ended
   (the marker line went to a dead connection) fetches it with ``--exit-reports NONCE...`` (:func:`print_reports`),
   and an ``--attach`` that finds no wrapper any more puts the code it says on its ``gone`` marker line
   (:func:`reported_code`; none that can be read: ``gone-unknown``, an unknown status).

It imports the standard library only (no torch, no cloud SDK, nothing else of cloud-elastic but its wire,
:mod:`~cloud_elastic.driver.launch.ssh_wire`, which is standard library too): it must start in
milliseconds and must not fail on a host whose worker environment is broken, so that the driver learns what went
wrong. So it spells the variables of the worker's environment contract it handles itself (:data:`SECRET_FD_ENV`,
:data:`DRIVER_GRACE_ENV`, whose owner is :mod:`cloud_elastic.worker.settings`; :data:`EXIT_REPORT_ENV`, whose owner
is :mod:`cloud_elastic.records`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

# The wire is re-exported here too: the launchers, Ray, Spark and the tests import it from this module.
from cloud_elastic.driver.launch.ssh_wire import (EXIT_REPORT_ENV, MARKER, MODULE, REASON_GONE, REASON_GONE_UNKNOWN,
                                                  REASON_KEEPALIVE, REASON_NONE, REPORT_DIR_NOT_PRIVATE, REPORT_LIMIT,
                                                  SECRET_ENV, SECRET_FD_ENV, STARTED, WrapperArgs, exit_code,
                                                  marker_line, parse_args, parse_env, parse_exit_report, parse_marker,
                                                  report_line, secret_fd_value, secret_pipe, sent_line, wrapper_argv)
from cloud_elastic.driver.launch.ssh_leftovers import private_socket_dir as _private_socket_dir, sweep
from cloud_elastic.driver.launch.ssh_output import OutputPump, relay_frames

__all__ = ["SECRET_ENV", "SECRET_FD_ENV", "secret_pipe", "secret_fd_value", "MARKER", "WrapperArgs", "parse_args",
           "wrapper_argv", "parse_env", "Watchdog", "Order", "STARTED", "marker_line", "parse_marker",
           "exit_code", "control_path", "report_path", "print_reports", "reported_code", "attach", "main",
           "die_with_parent"]

_POLL_S = 0.5
#: At the worker's end, how long its output may take to go out before its status is sent anyway; and after the stop
#: of what it left in its group, how long a child of it that still holds its pipe may print on.
_DRAIN_S = 5.0
#: After the driver grace, what the worker may still spend on rank 0's last checkpoint before the wrapper stops it.
GRACE_MARGIN_S = 15.0
#: Where the driver's ``--driver-grace`` reaches the wrapper (and the worker).
DRIVER_GRACE_ENV = "CLOUD_ELASTIC_DRIVER_GRACE_S"


@dataclass(frozen=True)
class Order:
    """What the watchdog decided: stop the worker's group with this grace, for this reason.

    ``after_s`` > 0: the driver is gone; stop only if the worker is still there that many seconds later (it trains
    on for the driver grace).
    """

    grace_s: float
    reason: str = REASON_NONE
    after_s: float = 0.0


class Watchdog:
    """Decides, from what arrives on the wrapper's stdin and when, whether to stop the worker.

    Pure: it is fed bytes and times, and returns an :class:`Order` or ``None``. Lines: ``KILL`` (grace 0),
    ``TERM <grace>`` (``TERM`` alone or with a bad number: the default grace), ``STACKS`` (``on_stacks`` is called:
    the worker is asked for its Python stacks), anything else is a keepalive. End of file stops with the default
    grace; silence longer than ``keepalive_timeout_s`` (0 disables) stops with the default grace and the reason
    ``keepalive``. Both mean the driver is gone, so their orders wait ``driver_grace_s`` first (``Order.after_s``).
    """

    def __init__(self, grace_s: float, keepalive_timeout_s: float, now: float, driver_grace_s: float = 0.0,
                 on_stacks: Callable[[], None] | None = None) -> None:
        self._on_stacks = on_stacks
        self._grace_s = grace_s
        self._after_s = driver_grace_s
        self._keepalive_timeout_s = keepalive_timeout_s
        self._last = now
        self._buffer = b""

    def received(self, chunk: bytes, now: float) -> Order | None:
        """Bytes read from stdin at ``now``; an empty chunk is end of file."""
        if not chunk:
            return Order(self._grace_s, after_s=self._after_s)
        self._last = now
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            order = self._order(line)
            if order is not None:
                return order
        return None

    def idle(self, now: float) -> Order | None:
        """Nothing arrived until ``now``."""
        if self._keepalive_timeout_s > 0 and now - self._last > self._keepalive_timeout_s:
            return Order(self._grace_s, REASON_KEEPALIVE, after_s=self._after_s)
        return None

    def _order(self, line: bytes) -> Order | None:
        words = line.split()
        if words[:1] == [b"KILL"]:
            return Order(0.0)
        if words[:1] == [b"STACKS"]:
            if self._on_stacks is not None:
                self._on_stacks()
            return None
        if words[:1] != [b"TERM"]:
            return None
        try:
            grace_s = float(words[1])
        except (IndexError, ValueError):
            return Order(self._grace_s)
        return Order(max(grace_s, 0.0))


# ---------------------------------------------------------------- process group


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a live (non-zombie) member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    # killpg(…, 0) also succeeds for unreaped zombies (the worker's children
    # whose parent is gone are reaped by init only later): look closer.
    for name in names:
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError, ValueError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def control_path(nonce: str) -> str:
    """The Unix socket of the wrapper of launch ``nonce`` (its directory is created 0700 by the wrapper)."""
    return os.path.join(tempfile.gettempdir(), f"cloud-elastic-{os.getuid()}", f"{nonce}.sock")


def report_path(nonce: str) -> str:
    """Where the worker of launch ``nonce`` leaves its exit report (:data:`EXIT_REPORT_ENV`), beside its socket."""
    return os.path.join(os.path.dirname(control_path(nonce)), f"{nonce}.exit.json")


def _read_report(nonce: str) -> bytes | None:
    """The first ``REPORT_LIMIT + 1`` bytes of launch ``nonce``'s exit report (more tells the reader it is too long);
    None when there is none, or ``nonce`` is not one (a launch's nonce is hex)."""
    if not nonce or not all(c in "0123456789abcdef" for c in nonce):
        return None
    try:
        with open(report_path(nonce), "rb") as fh:
            return fh.read(REPORT_LIMIT + 1)
    except OSError:
        return None


def complete_report(nonce: str, status: int) -> None:
    """The worker of launch ``nonce`` ended with ``status``: make it the ``code`` of the exit report it left (none
    left, or not a JSON object: nothing; the driver reading it refuses a garbled one)."""
    data = _read_report(nonce)
    try:
        report = json.loads(data) if data is not None and len(data) <= REPORT_LIMIT else None
        if not isinstance(report, dict):
            return
        tmp = report_path(nonce) + ".status"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(report, code=status)))
        os.replace(tmp, report_path(nonce))
    except (OSError, ValueError) as exc:
        _say(f"cannot complete the exit report {report_path(nonce)}: {exc}")


def print_reports(nonces: Sequence[str]) -> None:
    """``--exit-reports NONCE...``: a :func:`~cloud_elastic.driver.launch.ssh_wire.report_line` on stdout for each
    launch that left an exit report on this host (bounded: :data:`REPORT_LIMIT` + 1 bytes each); when their
    directory is not private to this user (anyone could have left them), none but one
    :data:`~cloud_elastic.driver.launch.ssh_wire.REPORT_DIR_NOT_PRIVATE` line, which the driver warns of; exit 0."""
    private = _private_socket_dir(report_path("0"))
    if not private:
        sys.stdout.write(f"{REPORT_DIR_NOT_PRIVATE} {os.path.dirname(report_path('0'))}\n")
    for nonce in nonces if private else ():
        data = _read_report(nonce)
        if data is not None:
            sys.stdout.write(report_line(nonce, data) + "\n")
    sys.stdout.flush()
    os._exit(0)


def reported_code(nonce: str) -> int | None:
    """The exit code the exit report of launch ``nonce`` on this host says, read as ``--exit-reports`` reads it for
    the driver (a private directory, :func:`~cloud_elastic.driver.launch.ssh_wire.parse_exit_report`); None when
    there is none or it does not say one (said on stderr)."""
    if not _private_socket_dir(report_path(nonce)):
        _say(f"{os.path.dirname(report_path(nonce))} is not a private directory of this user: no exit report is read")
        return None
    data = _read_report(nonce)
    if data is None:
        return None
    try:
        return parse_exit_report(data)[2]
    except ValueError as exc:
        _say(f"cannot read the exit report {report_path(nonce)} ({exc})")
        return None


class Wrapper:
    """One worker under the wrapper's watch. ``run`` never returns: the wrapper exits with the worker."""

    def __init__(self, args: WrapperArgs, stdin_fd: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self._args = args
        self._driver_grace_s = 0.0  # CLOUD_ELASTIC_DRIVER_GRACE_S, once the variables are in (run)
        self._fd = stdin_fd
        self._clock = clock
        self._lock = threading.RLock()  # re-entered by the signal handler, which runs on the main thread
        self._reason = REASON_NONE
        self._pgid: int | None = None
        self._attached: list[socket.socket] = []  # connections of restarted drivers (``--attach``)
        self._socket_path: str | None = None
        self._term_passed_on = False  # a SIGTERM to the wrapper went to the worker (see _on_signal)
        self._pump: OutputPump | None = None  # the worker's output to the driver (see ssh_output)
        self._early_signals: list[int] = []  # came while the worker was starting (see _on_signal)

    def run(self) -> None:
        """Read the secret (and the variables), start the worker, watch it, report its status, exit."""
        secret = self._read_line()
        line = self._read_line() if secret is not None and self._args.env_on_stdin else "{}"
        if secret is None or line is None:
            _say("the driver went away before the worker started")
            os._exit(1)
        env = {**os.environ, **parse_env(line)}
        self._driver_grace_s = _driver_grace_s(env.get(DRIVER_GRACE_ENV))
        if not os.path.isdir(self._args.cwd):
            _say(f"working directory {self._args.cwd} does not exist on this host")
            self._done(127, "cwd")
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        secret_fd = secret_pipe(secret)
        env[SECRET_FD_ENV] = secret_fd_value(secret_fd)
        if _private_socket_dir(report_path(self._args.nonce)):  # else another user could forge its report
            env[EXIT_REPORT_ENV] = report_path(self._args.nonce)
        listener = self._listen()  # here: bound (and its directory swept) before the worker can end and _done unlink it
        out_r, out_w = os.pipe()  # the worker's output, relayed by the pump (kept while no driver reads it)
        try:
            proc = subprocess.Popen(list(self._args.command), cwd=self._args.cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out_w, stderr=subprocess.STDOUT,
                                    pass_fds=(secret_fd,), start_new_session=True, preexec_fn=die_with_parent())
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(out_r)
            _say(f"cannot start {self._args.command[0]}: {exc}")
            self._done(127, "exec")
        finally:
            os.close(secret_fd)
            os.close(out_w)
        self._pgid = proc.pid  # before the pump: a signal sent once the worker's output is out must find its group
        self._pump = OutputPump(out_r)
        self._pump.start()
        _say(f"{STARTED} {self._args.nonce}\n", raw=True)  # the driver may open its next connection to this host
        threading.Thread(target=self._watch, args=(listener,), name="watchdog", daemon=True).start()
        for signum in self._early_signals:
            self._on_signal(signum, None)
        status = None
        while status is None:  # in slices: a signal the kernel handed another thread has the main thread run its
            try:               # handler within 50 ms (Popen's polling), not once the worker ends (review: a hung test)
                status = proc.wait(_POLL_S)
            except subprocess.TimeoutExpired:
                pass
        self._done(status, self._reason)

    def stop(self, grace_s: float) -> None:
        """TERM the worker's group, KILL it after ``grace_s`` (at once if 0); return when it is empty."""
        pgid = self._pgid
        if pgid is None:
            return
        with self._lock:
            steps = [(signal.SIGKILL, 0.0)]
            if grace_s > 0:
                steps.insert(0, (signal.SIGTERM, grace_s))
            for sig, wait_s in steps:
                if not group_alive(pgid):
                    return
                try:
                    os.killpg(pgid, sig)
                    os.killpg(pgid, signal.SIGCONT)  # a stopped process cannot act on TERM
                except ProcessLookupError:
                    return
                deadline = self._clock() + wait_s
                while self._clock() < deadline and group_alive(pgid):
                    time.sleep(0.05)

    def _listen(self) -> socket.socket | None:
        """The control socket a restarted driver attaches to; None if it cannot be made (no adoption then)."""
        path = control_path(self._args.nonce)
        if not _private_socket_dir(path):
            _say(f"cannot make a private directory for {path}: a restarted driver cannot adopt this worker")
            return None
        sweep(os.path.dirname(path))  # what killed wrappers and old exit reports left there (once an hour)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.exists(path):
                os.unlink(path)
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(4)
        except OSError as exc:
            listener.close()
            _say(f"cannot listen on {path} ({exc}): a restarted driver cannot adopt this worker")
            return None
        self._socket_path = path
        return listener

    def _watch(self, listener: socket.socket | None) -> None:
        kills = self._args.term_kills  # Ray: end of file means the actor died (not the driver): KILL, as on SIGTERM
        after = self._driver_grace_s + GRACE_MARGIN_S if self._driver_grace_s > 0 and not kills else 0.0
        watchdog = Watchdog(0.0 if kills else self._args.grace_s, self._args.keepalive_timeout_s, self._clock(), after,
                            on_stacks=self._dump_stacks)
        eof = False
        pending: Order | None = None
        deadline = 0.0
        attached: list[socket.socket] = []  # attach connections still speaking (self._attached: all, for the marker)
        while True:
            watched: list = ([] if eof else [self._fd]) + ([listener] if listener is not None else []) + attached
            ready = select.select(watched, [], [], _POLL_S)[0] if watched else []
            if not watched:
                time.sleep(_POLL_S)
            order: Order | None = None
            for source in ready:
                if source is listener:
                    conn, _ = listener.accept()
                    attached.append(conn)
                    with self._lock:
                        self._attached.append(conn)
                    if self._pump is not None:
                        self._pump.attach(conn)  # what the worker printed meanwhile, then all it prints
                    _say("a restarted driver attached to the worker")
                    continue
                if isinstance(source, int):  # the first connection's stdin
                    try:
                        chunk = os.read(self._fd, 4096)
                    except OSError:
                        chunk = b""
                    eof = not chunk
                    if eof and after > 0 and self._pump is not None:
                        self._pump.driver_gone()  # keep what the worker prints for a driver that adopts it
                    if eof and attached:
                        continue  # the old connection ended; the restarted driver speaks for it now
                else:
                    try:
                        chunk = source.recv(4096)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        attached.remove(source)  # kept in self._attached: it still reads the marker line
                        if self._pump is not None:
                            self._pump.lost(source)  # its driver went: the worker's output is kept again
                        if attached or not eof:
                            continue  # someone else still speaks for the driver
                got = watchdog.received(chunk, self._clock())
                if got is None and pending is not None and (not isinstance(source, int)
                                                            or pending.reason == REASON_KEEPALIVE):
                    _say("the driver is back")
                    pending = None  # the driver is back within the grace
                if got is not None:
                    order = got
                    break
            if not ready and (not eof or attached):
                order = watchdog.idle(self._clock())
            if order is not None and order.after_s > 0:
                if pending is None:
                    pending, deadline = order, self._clock() + order.after_s
                    _say(f"lost the driver; the worker may train on for --driver-grace {self._driver_grace_s:g}s")
                order = None
            if order is None and pending is not None and self._clock() >= deadline:
                order = pending
            if order is not None:
                break
        if order.reason == REASON_KEEPALIVE:
            self._reason = REASON_KEEPALIVE
            _say(f"no keepalive from the driver for {self._args.keepalive_timeout_s:g}s: stopping the worker")
        self.stop(order.grace_s)

    def _dump_stacks(self) -> None:
        """The driver wants the worker's stacks: SIGUSR1 to the worker process only (its children may die of it)."""
        if self._pgid is not None:
            try:
                os.kill(self._pgid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._pgid is None:  # the worker is starting (its process may exist already): run() acts on it then
            self._early_signals.append(signum)
            return
        if signum == signal.SIGTERM and self._args.term_kills:  # passed on, the worker would report its host going
            _say("SIGTERM: the Ray actor or Spark task that started this worker is gone: killing the worker")
            self.stop(0.0)
            return
        if signum == signal.SIGTERM and not self._term_passed_on:
            # The host is going (a pod's SIGTERM, which start-sshd.sh passes on): the worker decides what to
            # do with it, e.g. leave at its next commit. Its process only: its own children (a DataLoader's
            # workers) die of a SIGTERM that does not come from their parent, mid-step. The driver's orders
            # still stop the group, and so does a second SIGTERM.
            self._term_passed_on = True
            _say("SIGTERM: passed on to the worker")
            try:
                os.kill(self._pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            return
        self.stop(self._args.grace_s)

    def _read_line(self) -> str | None:
        # Byte by byte: whatever follows the first line (the second, with --env) is the watchdog's.
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(self._fd, 1)
            if not chunk:
                return None
            data += chunk
        return data[:-1].decode()

    def _done(self, status: int, reason: str) -> None:
        """The worker ended with ``status``: say so once its own output is out, then stop what it left in its group
        (TERM, KILL after the grace) and exit. Its status waits neither for that stop nor for its pipe's end (a
        child it left may hold it): a kill -9 was told 4.8 s late, past the driver's heartbeat timeout (fixS)."""
        if self._pgid is not None:
            complete_report(self._args.nonce, status)  # before the marker: a driver it reaches may be gone next
        line, told = marker_line(self._args.nonce, status, reason) + "\n", []
        sent = lambda n: (sent_line(self._args.nonce, n) + "\n").encode()  # noqa: E731 (ssh_wire.SENT)
        if self._pump is not None:
            self._pump.forwarded(_DRAIN_S)  # the worker's last output goes before its status
            told = list(self._attached)  # not under the lock: the watch thread may hold it, stopping the group
            _say(sent(self._pump.sent_first).decode() + line, raw=True)
            self._pump.tell(told, line.encode(), sent)
            self.stop(self._args.grace_s)  # whatever the worker left behind in its group
            self._pump.join(_DRAIN_S)  # what it printed meanwhile, shown after the worker's end
        else:
            _say(line, raw=True)  # the worker never started: no watch thread, no attached driver
        with self._lock:
            if self._pump is not None:
                self._pump.close_conns(told, b"", sent)
                self._pump.close_conns([c for c in self._attached if c not in told], line.encode(), sent)
        if self._socket_path is not None:
            try:
                os.unlink(self._socket_path)
            except OSError:
                pass
        os._exit(exit_code(status))


def _say(message: str, raw: bool = False) -> None:
    try:
        sys.stderr.write(message if raw else f"cloud-elastic remote: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A preexec function asking the kernel to send ``sig`` to the child if the thread that started it dies (Linux
    only): here KILL to the worker's leader when the wrapper dies; TERM to a Ray actor's wrapper (``--term-kills``)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None).prctl
    except (ImportError, OSError, AttributeError):  # not Linux, or no libc: best effort only
        return None

    def preexec() -> None:
        prctl(1, sig)  # PR_SET_PDEATHSIG

    return preexec


def attach(nonce: str, stdin_fd: int = 0) -> None:
    """``--attach NONCE``: relay stdin to the wrapper of launch ``nonce`` and its answers to stderr; never returns.

    Without such a wrapper (the worker has ended), write a marker line with the code its exit report says and the
    reason ``gone`` (:func:`reported_code`; none that can be read: reason ``gone-unknown``, its status unknown) and
    exit 1.
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(control_path(nonce))
    except OSError:
        code = reported_code(nonce)
        _say(f"no worker of launch {nonce} runs on this host any more; its exit report says "
             + ("nothing: its exit code is unknown" if code is None else f"exit code {code}"))
        _say(marker_line(nonce, 1 if code is None else code, REASON_GONE_UNKNOWN if code is None else REASON_GONE)
             + "\n", raw=True)
        os._exit(1)
    _say(f"{STARTED} {nonce}\n", raw=True)

    # The worker's output to stdout, the wrapper's marker line to stderr; the process ends with the connection.
    threading.Thread(target=relay_frames, args=(conn,), name="answers", daemon=True).start()
    while True:
        try:
            chunk = os.read(stdin_fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            try:
                conn.shutdown(socket.SHUT_WR)  # the wrapper sees the driver go, as with the first connection
            except OSError:
                pass
            while True:
                time.sleep(3600)  # answers() ends the process when the wrapper closes
        try:
            conn.sendall(chunk)
        except OSError:  # the wrapper closed (its worker ended): answers passes its last words on, then exits;
            time.sleep(60.0)  # exiting here cut the marker off (a finished worker read as one never started)
            os._exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python3 -m cloud_elastic.driver.launch.ssh_remote``; never returns."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--attach":
        attach(argv[1])
    if argv[:1] == ["--exit-reports"]:
        print_reports(argv[1:])
    try:
        args = parse_args(argv)
    except ValueError as exc:
        _say(f"bad arguments ({exc}); is the driver's cloud-elastic version installed on this host?")
        os._exit(2)
    Wrapper(args).run()


def _driver_grace_s(raw: str | None) -> float:
    """The driver grace from the environment; 0 (stop at once, the old behaviour) when absent or bad."""
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        return 0.0


if __name__ == "__main__":
    main()
