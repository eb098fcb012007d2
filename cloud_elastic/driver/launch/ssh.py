"""The SSH launcher: start workers on remote hosts through the system ``ssh`` client.

One ``ssh`` process and connection per worker (``ControlMaster=no``), non-interactive (``BatchMode=yes``), no tty.
The remote login shell runs ``python3 -m cloud_elastic.driver.launch.ssh_remote`` (see
:mod:`cloud_elastic.driver.launch.ssh_remote`; its command line holds no secret), which:

1. reads the per-job secret from the first line of its stdin and hands it to
   the worker through an inherited pipe (``CLOUD_ELASTIC_SECRET_FD``), so it
   never appears on any command line, local or remote, nor in the worker's
   ``/proc/PID/environ``; and the worker's variables (but ``PATH`` and ``PYTHON*``,
   which pick the wrapper's Python) from the second, so their values are on no command line;
2. starts ``spec.command`` in ``spec.cwd`` in a **new session and process
   group**, stdin from ``/dev/null``, stderr merged into stdout;
3. runs a watchdog on its own stdin. End of file (the driver closed the pipe,
   the local ssh died, the connection dropped), a ``KILL`` or ``TERM <grace>``
   line, a missing keepalive, or a TERM/HUP/INT to the wrapper itself stops the
   worker's *whole process group*: TERM, then KILL after the grace;
4. when the worker ends and its output is out, reports the worker's exact status
   (``-N`` for signal N) on a marker line on stderr, then stops whatever is left
   in its group. ``poll()`` tells the exit at that line once the output before it is
   forwarded, not when ssh ends: a child the worker left may keep the wrapper busy.

So ``ExitStatus.code`` is the worker's own status, and ``transport_error`` is
set only when ssh itself failed (exit 255 without a marker, classified from
ssh's stderr), when the remote wrapper ended without starting the worker (for
example cloud-elastic missing on that host), when the local ssh client was
killed by someone else, or when the remote watchdog lost the driver's keepalive.

Host keys: unless the user's ssh options choose a known-hosts file or strict
checking, ssh checks keys against a job-private known-hosts file
(:class:`~cloud_elastic.driver.launch.known_hosts.JobKnownHosts`) that forgets an
address's key when discovery reports a different instance behind it.

The remote PATH gets the driver's Python bin directory prepended, so
``python3`` (for the wrapper) and a worker command such as ``python train.py``
use the same virtualenv path remotely: cloud images are expected to install
cloud-elastic at that same path.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable

from cloud_elastic.config import ENV_NAME, SSH_OPTION, SSHConfig
from cloud_elastic.driver.launch.known_hosts import JobKnownHosts
from cloud_elastic.driver.launch.api import ExitStatus, OutputSink, WorkerSpec
from cloud_elastic.driver.launch.drain import DRAIN_WAIT_S, DrainClock
from cloud_elastic.driver.launch.local import forward_lines
from cloud_elastic.driver.launch.ssh_orphans import Orphans
from cloud_elastic.driver.launch.ssh_remote import SECRET_ENV, WrapperArgs, parse_marker, wrapper_argv
from cloud_elastic.driver.launch.ssh_setup import (MAX_SETUPS_PER_HOST, SETUP_HOLD_S, SETUP_RETRIES, ConnectionLines,
                                                   HostGate, Stdout, destination, env_line, exit_status, is_noise,
                                                   is_started, refusal, refused_before_key_exchange, remote_prefix,
                                                   retry_delay, ssh_argv, ssh_environ, transport_error,
                                                   wants_job_known_hosts)
from cloud_elastic.errors import ConfigError, LaunchError, SSHError

__all__ = ["SSHLauncher", "SSHWorkerProcess", "SECRET_ENV"]

logger = logging.getLogger(__name__)


class SSHLauncher:
    """Starts workers on remote hosts through the system ``ssh`` client.

    Guarantees, in addition to those of :class:`~cloud_elastic.driver.launch.api.Launcher`:

    * ssh runs with ``BatchMode=yes`` (never prompts), ``-T`` (no tty) and the
      ConnectTimeout, port, user and identity of ``config``. ``config.extra_options``
      are ``Key=Value`` ssh options; they come before the launcher's defaults
      (``StrictHostKeyChecking=accept-new``, ``LogLevel=INFO``,
      ``ServerAliveInterval=5``, ``ServerAliveCountMax=3``, ``IdentitiesOnly=yes``
      with an identity file), so they override them. ``BatchMode=yes``, ``ControlMaster=no`` and
      ``ControlPath=none`` cannot be overridden. ssh runs without ``LANG``, ``LC_*`` and the other variables
      distributions' ssh_config sends (``SendEnv``): a worker gets only ``spec.env`` from the driver.
    * The launcher writes a keepalive line to every live worker's stdin each
      ``keepalive_interval_s``; a remote wrapper that hears nothing for
      ``keepalive_timeout_s`` (0 disables) stops its worker, so a silently dead
      connection or driver VM leaves no orphan even when sshd never notices.
    * If the connection drops, the remote group gets TERM, then KILL after
      ``disconnect_grace_s``.
    * Host keys are checked against a job-private known-hosts file
      (``UserKnownHostsFile``, with ``HashKnownHosts=no``), unless
      ``config.extra_options`` set ``UserKnownHostsFile`` or demand strict
      checking (``StrictHostKeyChecking=yes``), in which case the user's files
      are used and never edited. When ``spec.instance`` differs from the
      instance an address was last launched for, the address's recorded keys
      are forgotten first: a recycled private IP is accepted as a new host.
      The file is removed in ``close``.
    * ``kill`` never waits: the order is written and a short-lived thread ends
      the local ssh if the remote side has not finished within ``kill_wait_s``.
    * At most ``max_setups_per_host`` connections to one host are being set up
      at once (sshd drops unauthenticated ones past its ``MaxStartups``); the
      others wait their turn. A connection dropped before key exchange is tried
      again up to 3 times (see :mod:`cloud_elastic.driver.launch.ssh_setup`).

    The constructor does no I/O and starts no thread; the keepalive thread
    starts with the first ``launch`` and stops in ``close``. The launcher is a
    context manager that calls ``close``.
    """

    def __init__(
        self,
        config: SSHConfig,
        *,
        keepalive_interval_s: float = 5.0,
        keepalive_timeout_s: float = 30.0,
        disconnect_grace_s: float = 5.0,
        kill_wait_s: float = 1.0,
        max_setups_per_host: int = MAX_SETUPS_PER_HOST,
    ) -> None:
        for option in config.extra_options:
            if not SSH_OPTION.match(option):
                raise ConfigError(f"extra ssh option {option!r} must look like Key=Value (it is passed as ssh -o)")
        if keepalive_interval_s <= 0 or disconnect_grace_s < 0 or kill_wait_s < 0:
            raise ConfigError("keepalive_interval_s must be > 0, disconnect_grace_s and kill_wait_s >= 0")
        if keepalive_timeout_s and keepalive_timeout_s <= 2 * keepalive_interval_s:
            raise ConfigError("keepalive_timeout_s must exceed twice keepalive_interval_s (or be 0 to disable)")
        self._config = config
        self._orphans = Orphans(self.attach)  # workers whose connection dropped while they ran: stopped anew
        self._keepalive_interval_s = keepalive_interval_s
        self._keepalive_timeout_s = keepalive_timeout_s
        self._disconnect_grace_s = disconnect_grace_s
        self._kill_wait_s = kill_wait_s
        self._known_hosts = JobKnownHosts() if wants_job_known_hosts(config.extra_options) else None
        self._gate = HostGate(max_setups_per_host)
        self._lock = threading.Lock()
        self._live: list[SSHWorkerProcess] = []
        self._closed = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._logged_options = False

    def ssh_argv(self, host: str) -> list[str]:
        """The ssh client invocation (without the remote command) used for ``host``."""
        ssh = shutil.which("ssh")
        if ssh is None:
            raise SSHError("the ssh client is not installed on the driver host (install openssh-client)")
        return ssh_argv(ssh, self._config, self._known_hosts.path if self._known_hosts is not None else None, host)

    def remote_command(self, spec: WorkerSpec, nonce: str) -> str:
        """The shell command line the remote login shell runs. Holds no secret, and of ``spec.env`` only ``PATH``
        and ``PYTHON*``: the other variables follow the secret on ssh's stdin."""
        for name in spec.env:
            if not ENV_NAME.match(name):
                raise LaunchError(f"cannot forward environment variable {name!r} to {spec.host}: not a valid name")
        if SECRET_ENV in spec.env:
            raise LaunchError(f"{SECRET_ENV} must not be in WorkerSpec.env; the secret travels on stdin")
        wrapper = WrapperArgs(nonce, float(self._disconnect_grace_s), float(self._keepalive_timeout_s), spec.cwd,
                              tuple(spec.command), env_on_stdin=True)
        return " ".join(remote_prefix(spec) + [shlex.quote(arg) for arg in wrapper_argv(wrapper)])

    def launch(self, spec: WorkerSpec, on_output: OutputSink) -> SSHWorkerProcess:
        """Start ``spec`` on ``spec.host`` over ssh; return at once.

        Raises :class:`~cloud_elastic.errors.SSHError` if the ssh client is not
        installed and :class:`~cloud_elastic.errors.LaunchError` for a spec that
        cannot be sent (bad variable name, secret with a newline). Unreachable
        hosts and refused keys are reported later by ``poll()`` as a transport error.
        ssh starts once the host has a free set-up turn; ``poll()`` says ``None`` until then.
        """
        if self._closed.is_set():
            raise LaunchError("the SSH launcher is closed")
        if not spec.command:
            raise LaunchError(f"worker {spec.worker_id}: empty command")
        if "\n" in spec.secret or "\r" in spec.secret:
            raise LaunchError("the job secret must be a single line")
        nonce = secrets.token_hex(8)
        argv = self.ssh_argv(spec.host) + [self.remote_command(spec, nonce)]
        if self._known_hosts is not None:
            self._known_hosts.admit(spec.host, spec.instance, self._config.port)
        self._log_options_once(argv)
        logger.debug("launching worker %s (slot %s) on %s over ssh", spec.worker_id, spec.slot, spec.host)
        return self._track(SSHWorkerProcess(spec, argv, nonce, on_output, destination(self._config, spec.host),
                                            self._keepalive_timeout_s, env_line=env_line(spec),
                                            **self._process_options()))

    def attach(self, spec: WorkerSpec, nonce: str, on_output: OutputSink) -> SSHWorkerProcess:
        """Adopt a worker that another driver launched with ``nonce`` on ``spec.host``; return at once.

        A fresh ssh connection runs ``remote --attach NONCE``, which speaks for
        the driver to the worker's remote wrapper from then on: keepalives,
        ``kill``/``terminate`` orders and the worker's exit status work as for a
        worker this launcher started (see :mod:`cloud_elastic.driver.launch.ssh_remote`).
        The worker's output comes on this connection's stdout, as on the first one's: what it printed while no
        driver read it (the newest MiB the wrapper kept, after one line counting the bytes dropped), then the rest.
        A worker that has already ended is reported by ``poll()`` with exit code 1.
        """
        if self._closed.is_set():
            raise LaunchError("the SSH launcher is closed")
        if not re.fullmatch(r"[0-9a-f]{1,64}", nonce):
            raise LaunchError(f"worker {spec.worker_id}: malformed launch id {nonce!r}")
        argv = self.remote_argv(spec, "--attach", nonce)
        logger.debug("attaching to worker %s on %s over ssh", spec.worker_id, spec.host)
        # The wrapper already has the secret: the first line is only a keepalive.
        return self._track(SSHWorkerProcess(dataclasses.replace(spec, secret=""), argv, nonce, on_output,
                                            destination(self._config, spec.host), self._keepalive_timeout_s,
                                            **self._process_options()))

    def remote_argv(self, spec: WorkerSpec, *args: str) -> list[str]:
        """The ssh command running ``ssh_remote ARGS`` (``--attach``, ``--exit-reports``) on ``spec.host`` with the
        ssh options, timeouts and environment of a launch (so that the same cloud-elastic answers, same ``TMPDIR``)."""
        return self.ssh_argv(spec.host) + [" ".join(remote_prefix(spec) + [shlex.quote(arg) for arg in args])]

    def _process_options(self) -> dict[str, object]:
        hold_s = max(1, math.ceil(self._config.connect_timeout_s)) + SETUP_HOLD_S
        check = self._known_hosts.check_recorded if self._known_hosts is not None else None
        return {"kill_wait_s": self._kill_wait_s, "gate": self._gate, "setup_hold_s": hold_s, "on_connected": check}

    def _track(self, proc: SSHWorkerProcess) -> SSHWorkerProcess:
        """Start ``proc`` and keep it among the live workers (the keepalive thread starts with the first)."""
        proc.start()
        with self._lock:
            ended = [p for p in self._live if not p.connected()]
            self._live = [p for p in self._live if p not in ended] + [proc]
            if self._keepalive is None and self._keepalive_timeout_s:
                self._keepalive = threading.Thread(target=self._keepalive_loop, name="ssh-keepalive", daemon=True)
                self._keepalive.start()
        self._orphans.stop(ended)
        return proc

    def __enter__(self) -> SSHLauncher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def known_hosts_file(self) -> str | None:
        """The job-private known-hosts file, or ``None`` when the user's ssh options choose their own."""
        return self._known_hosts.path if self._known_hosts is not None else None

    def close(self) -> None:
        """Stop the keepalive thread and remove the job-private known-hosts file. Idempotent.

        Workers should have been stopped already; any still running get their
        stdin closed here, so their remote watchdog stops them (TERM, then KILL
        after ``disconnect_grace_s``) instead of leaving them unattended.
        """
        with self._lock:
            ended = [p for p in self._live if not p.connected()]
            self._live = [p for p in self._live if p not in ended]
        self._orphans.stop(ended)  # before the close: they are reached through this launcher
        self._orphans.wait()
        self._closed.set()
        with self._lock:
            live, self._live = [p for p in self._live if p.poll() is None], []
            thread, self._keepalive = self._keepalive, None
        for proc in live:
            logger.warning("closing the SSH launcher with worker %s still running on %s: stopping it",
                           proc.spec.worker_id, proc.spec.host)
            proc.hang_up()
        if thread is not None:
            thread.join(timeout=self._keepalive_interval_s + 1)
        if self._known_hosts is not None:
            self._known_hosts.close()  # ssh reads it only while connecting; live sessions do not need it

    def _keepalive_loop(self) -> None:
        while not self._closed.wait(self._keepalive_interval_s):
            with self._lock:
                ended = [p for p in self._live if not p.connected()]
                live = self._live = [p for p in self._live if p not in ended]
            self._orphans.stop(ended)
            for proc in live:
                proc.send_keepalive()

    def _log_options_once(self, argv: list[str]) -> None:
        if not self._logged_options:
            self._logged_options = True
            logger.info("ssh client for remote hosts: %s (keepalive %gs, remote timeout %gs)",
                        " ".join(shlex.quote(a) for a in argv[:-3]), self._keepalive_interval_s,
                        self._keepalive_timeout_s)


class SSHWorkerProcess:
    """One worker started through one local ``ssh`` process.

    ``poll``/``terminate``/``kill`` are safe from any thread; ``poll``, ``kill``
    and ``hang_up`` never block. The local ssh runs in its own session, so a
    Ctrl-C at the driver's terminal reaches the driver only, which then stops
    workers in order. A thread of its own sets the connection up (:meth:`start`);
    a worker stopped before its ssh runs never starts (``poll()``: ``-SIGKILL`` or ``-SIGTERM``).
    """

    def __init__(self, spec: WorkerSpec, argv: list[str], nonce: str, on_output: OutputSink,
                 destination: str, keepalive_timeout_s: float, *, kill_wait_s: float = 1.0,
                 gate: HostGate | None = None, setup_hold_s: float = 60.0, env_line: str = "",
                 on_connected: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self._argv = argv
        self._nonce = nonce
        self._on_output = on_output
        self._destination = destination
        self._keepalive_timeout_s = keepalive_timeout_s
        self._kill_wait_s = kill_wait_s
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self._out = Stdout()  # the stdout reader's, against the wrapper's marker (a new one each ssh)
        self._lines = ConnectionLines(self._forward)  # ssh's stderr: held back until the connection is set up
        self._marker: tuple[int, str] | None = None
        self._stdin_fd: int | None = None
        self._unsent = b""  # what ssh's stdin pipe did not take yet: it goes before anything written later
        self._preamble = f"{spec.secret}\n{env_line}".encode()
        self._on_connected = on_connected  # with the destination once the worker runs, if ssh added its key
        self._stopping = False
        self._reaper: threading.Thread | None = None
        self._exited_at: float | None = None
        self._drain = DrainClock()
        self._status: ExitStatus | None = None
        self._gate = gate or HostGate()
        self._setup_hold_s = setup_hold_s
        self._setting_up: threading.Thread | None = None
        self._progress = threading.Event()  # the wrapper said the worker runs, the worker wrote, or ssh's stderr ended
        self._started = False  # the wrapper said so
        self._key_added = False  # ssh said it added the host's key to the known-hosts file, or failed to
        self._wrote = False  # the worker wrote: set up, whether the wrapper says so or not
        self._cancelled = threading.Event()  # stopped while no ssh ran: it never starts
        self._cancel_code = -signal.SIGTERM

    def handle(self) -> dict[str, object]:
        """How a restarted driver reaches this worker again (:meth:`SSHLauncher.attach`)."""
        return {"kind": "ssh", "nonce": self._nonce}

    @property
    def ssh_pid(self) -> int | None:
        """Process id of the local ssh client (``None`` until its set-up turn comes)."""
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        """Set the connection up on a thread of its own; return at once.

        The thread waits for a set-up turn at the host, starts ssh, hands over the
        secret on stdin, starts the output readers and keeps the turn until the
        remote wrapper says the worker runs or ssh ends; a connection dropped
        before key exchange is tried again after a pause.
        """
        self._setting_up = threading.Thread(target=self._set_up, name=f"ssh-setup-{self.spec.worker_id}", daemon=True)
        self._setting_up.start()

    def _set_up(self) -> None:
        for attempt in range(1, SETUP_RETRIES + 2):
            if not self._gate.enter(self._destination, self._cancelled):
                break
            try:
                again = self._connect(attempt)
            finally:
                self._gate.leave(self._destination)
            if not again:
                return
            if self._cancelled.is_set():
                break
            delay = retry_delay(attempt)
            logger.warning("ssh to %s for worker %s was %s: trying again in %.1fs (%d of %d)", self._destination,
                           self.spec.worker_id, refusal(self._lines.tail), delay, attempt, SETUP_RETRIES)
            if self._cancelled.wait(delay):
                break
        with self._lock:
            self._status = ExitStatus(self._cancel_code)

    def _connect(self, attempt: int) -> bool:
        """One ssh connection, until the wrapper says the worker runs or ssh ends; whether to try again."""
        with self._lock:
            if self._cancelled.is_set():
                return True  # the caller sees the cancel
            self._close_stdin()  # a previous try's
            self._progress.clear()
            self._lines.reset()
            try:
                self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, start_new_session=True,
                                              env=ssh_environ(os.environ))
            except OSError as exc:
                self._status = ExitStatus(255, self._transport(f"cannot start the ssh client: {exc}"))
                return False
            self._stdin_fd, self._out = self._proc.stdin.fileno(), Stdout(self._proc.stdout.fileno())
            os.set_blocking(self._stdin_fd, False)
            self._write(self._preamble)
            self._readers = [threading.Thread(target=forward_lines, args=(self._out.stream(self._proc.stdout),
                                                                          self._on_stdout),
                                              kwargs={"on_first_data": self._on_first_stdout, "idle": self._out.idle},
                                              name=f"ssh-out-{self.spec.worker_id}", daemon=True),
                             threading.Thread(target=self._read_stderr, args=(self._proc.stderr,),
                                              name=f"ssh-err-{self.spec.worker_id}", daemon=True)]
            for reader in self._readers:
                reader.start()
        deadline = time.monotonic() + self._setup_hold_s
        while self._unsent and time.monotonic() < deadline and not self._progress.wait(0.05):
            self._write(b"")  # a preamble larger than the pipe goes as ssh reads it
        if not self._gate.await_setup(self._destination, self._progress, self._setup_hold_s):
            self._gate.note_wrapper(self._destination, says_started=False)  # authenticated long ago, yet silent
            return False
        if self._started or self._wrote:
            return False
        try:
            rc = self._proc.wait(timeout=DRAIN_WAIT_S)  # its stderr ended: ssh is ending
        except subprocess.TimeoutExpired:
            return False
        return (rc == 255 and attempt <= SETUP_RETRIES and self._marker is None and not self._stopping
                and refused_before_key_exchange(self._lines.tail))

    def _read_stderr(self, stream) -> None:
        try:
            forward_lines(stream, self._on_stderr)
        finally:
            self._lines.end()
            self._progress.set()
            self._close_stdin()  # ssh is ending: poll() may have told the worker's end already (at its marker)

    def poll(self) -> ExitStatus | None:
        """The exit status once the wrapper's marker said it and the output before it is forwarded (or ssh has ended
        and its output is drained), within ``drain.DrainClock``'s bound; else ``None``. Never blocks."""
        setting_up = self._setting_up
        if self._status is not None or self._proc is None or setting_up is None or setting_up.is_alive():
            return self._status
        rc = self._proc.poll()
        if rc is None and self._marker is None:
            return None
        with self._lock:
            if self._status is not None:
                return self._status
            now = time.monotonic()
            self._exited_at = self._exited_at or now
            # After the marker, ssh may still hold up to its channel's window of output that the pipe has no room
            # for (a slow driver output): held until it is read (review rvQ), the bound counted from the last line.
            reader = self._readers[0] if self._readers else None
            held = self._out.behind(now, bool(reader and reader.is_alive())) if rc is None else any(
                r.is_alive() for r in self._readers)
            if held and not self._drain.up(max(self._exited_at, self._out.read_at)):  # in time it had a CPU
                return None
            if rc is not None:
                self._close_stdin()
            self._status = exit_status(rc, self._marker, self._stopping, self._lines.tail, self._transport,
                                       self._keepalive_timeout_s)
        logger.debug("worker %s on %s ended: %s", self.spec.worker_id, self._destination, self._status.describe)
        return self._status

    def connected(self) -> bool:
        """Whether its ssh runs or may yet (keepalives go on while the wrapper stops what a reported worker left)."""
        return self.poll() is None or (self._proc is not None and self._proc.poll() is None)

    def terminate(self, grace_s: float = 5.0) -> None:
        """TERM the remote process group, KILL it after ``grace_s``; then end the local ssh.

        Blocks up to ``grace_s`` (call it from a thread of its own). If the
        remote side has not finished by then the local ssh is killed; the remote
        wrapper, which already has its orders, still delivers the KILL. Idempotent.
        """
        if self._order(f"TERM {max(grace_s, 0.0)!r}\n", -signal.SIGTERM):
            self._end_ssh(grace_s)
        elif self._setting_up is not None:
            self._setting_up.join(timeout=max(grace_s, 0.0))  # cancelled: it ends at once

    def kill(self) -> None:
        """KILL the remote process group; return at once. Idempotent.

        The ``KILL`` order is written to the remote wrapper, which kills the
        group. A thread of this process ends the local ssh (and so the
        connection, which makes the wrapper stop the group anyway) if the remote
        side has not finished within the launcher's ``kill_wait_s``. ``poll()``
        reports the end.
        """
        if not self._order("KILL\n", -signal.SIGKILL):
            return
        with self._lock:
            if self._reaper is not None:
                return
            self._reaper = threading.Thread(target=self._end_ssh, args=(self._kill_wait_s,),
                                            name=f"ssh-kill-{self.spec.worker_id}", daemon=True)
        self._reaper.start()

    def dump_stacks(self) -> bool:
        """Ask the remote wrapper to have the worker print its Python stacks (SIGUSR1); False if ssh ended."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        self._write(b"STACKS\n")
        return True

    def hang_up(self) -> None:
        """Close ssh's stdin: the remote watchdog stops the worker with its default grace. Never blocks."""
        with self._lock:
            self._stopping = True
            self._cancel(-signal.SIGTERM)
        self._close_stdin()

    def send_keepalive(self) -> None:
        """Write one keepalive line to the remote watchdog; never blocks."""
        self._write(b"\n")

    def _order(self, order: str, code: int) -> bool:
        """Send a stop order and close stdin; ``False`` when no ssh runs (one still to start never will)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._cancel(code)
                return False
            self._stopping = True
        self._write(order.encode())
        self._close_stdin()
        return True

    def _cancel(self, code: int) -> None:
        """Stop a set-up while no ssh runs (it waits for its turn, or to try again): it ends with ``code``."""
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._setting_up is not None and self._setting_up.is_alive() and not self._cancelled.is_set():
            self._cancel_code = code
            self._cancelled.set()
            self._gate.wake()

    def _end_ssh(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for ssh to end after an order; then kill the local client."""
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=max(wait_s, 0.0))
        except subprocess.TimeoutExpired:
            logger.warning("ssh to %s did not end within %gs of stopping worker %s: killing the ssh client",
                           self._destination, wait_s, self.spec.worker_id)
            self._proc.kill()
            self._proc.wait()

    def _write(self, data: bytes) -> None:
        """Write ``data`` to ssh's stdin after what it did not take yet; what it does not take now waits."""
        with self._lock:
            if self._stdin_fd is None:
                return
            self._unsent += data
            try:
                self._unsent = self._unsent[os.write(self._stdin_fd, self._unsent):]
            except BlockingIOError:
                pass  # ssh is not reading (connecting, or stalled): it goes with the next write
            except BrokenPipeError:
                self._unsent = b""  # ssh is gone; poll() reports it
            except OSError as exc:
                logger.debug("writing to ssh for worker %s failed: %s", self.spec.worker_id, exc)

    def _close_stdin(self) -> None:
        with self._lock:
            if self._stdin_fd is None or self._proc is None or self._proc.stdin is None:
                return
            self._stdin_fd, self._unsent = None, b""
            try:
                self._proc.stdin.close()
            except OSError:
                pass  # BrokenPipe on flush: nothing buffered matters any more

    def _on_stdout(self, line: str) -> None:
        self._forward(line)
        self._out.read_at = time.monotonic()

    def _on_first_stdout(self) -> None:
        # The wrapper starts the worker only once the connection is set up, which an older one never says.
        with self._lock:
            self._wrote = True
            if not self._started:  # the STARTED line may still be on its way: it clears this
                self._gate.note_wrapper(self._destination, says_started=False)
        self._progress.set()

    def _on_stderr(self, line: str) -> None:
        if self._out.heard(line, self._nonce):  # the wrapper's count of the output before its marker
            return
        marker = parse_marker(line, self._nonce)
        if marker is not None:
            self._marker = marker
            return
        if is_started(line, self._nonce):
            with self._lock:
                self._started = True
                self._gate.note_wrapper(self._destination, says_started=True)
                self._lines.connect()
            self._progress.set()
            if self._on_connected is not None and self._key_added:  # a key a system-wide file knew is not added
                self._on_connected(self._destination)
            return
        if line.lower().startswith(("warning: permanently added", "failed to add the host")):
            self._key_added = True
        if not is_noise(line):
            self._lines.add(line)

    def _forward(self, line: str) -> None:
        try:
            self._on_output(line)
        except Exception:  # a broken sink must not stop draining, or the worker blocks on a full pipe
            logger.exception("output callback failed for worker %s", self.spec.worker_id)

    def _transport(self, what: str) -> str:
        return transport_error(self._destination, what)

