"""Setting up the SSH launcher's connections: how many to one host at once, which failed set-ups are tried
again, how ssh's failures are named, and the pieces of its ssh invocation (options, environment, remote command).

sshd drops unauthenticated connections past its ``MaxStartups`` (by default, from the 10th on, 30% of them,
rising to all at 100), with "kex_exchange_identification: read: Connection reset by peer" on the client's
side. So the launcher sets up at most :data:`MAX_SETUPS_PER_HOST` connections to a host at once (a set-up
ends when the remote wrapper says the worker runs, or when ssh ends), and tries a connection refused that
early again, :data:`SETUP_RETRIES` times after a random pause, before calling it a transport failure: the
remote side ran nothing yet, so trying again cannot start a worker twice. So is a TCP connection refused
(ssh's own "connect to host ... Connection refused"): a pod's sshd not listening yet, or restarting.

A wrapper from an older cloud-elastic never says the worker runs: its set-up also ends at the worker's first
output, and once a host has shown such a wrapper its later set-ups keep their turn only
:data:`OLD_WRAPPER_HOLD_S`.

What ssh says before the connection is set up (an sshd ``Banner``, say) is held back by
:class:`ConnectionLines`: the output and a failure's last words get it only when ssh fails before then.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shlex
import sys
import threading
import time
from collections import deque
from typing import Callable, Mapping

from cloud_elastic.config import SSH_OPTION, SSHConfig
from cloud_elastic.driver.launch.api import ExitStatus, WorkerSpec
from cloud_elastic.driver.launch.ssh_output import pending_bytes
from cloud_elastic.driver.launch.ssh_remote import MODULE, REASON_GONE_UNKNOWN, REASON_KEEPALIVE, STARTED
from cloud_elastic.driver.launch.ssh_wire import SENT

__all__ = ["MAX_SETUPS_PER_HOST", "OLD_WRAPPER_HOLD_S", "QUIET_S", "SETUP_HOLD_S", "SETUP_RETRIES",
           "ConnectionLines", "HostGate", "Stdout", "classify", "env_line", "exit_status", "is_noise", "is_started",
           "option_key", "refusal", "refused_before_key_exchange", "remote_prefix", "retry_delay", "ssh_argv",
           "ssh_environ", "ssh_path", "transport_error", "wants_job_known_hosts", "wrapper_failure"]

#: After the marker of an older wrapper (one that counts no output, ``ssh_wire.SENT``), an exit is held while lines
#: came this recently: ssh's own buffer is not seen in the pipe.
QUIET_S = 0.05


class Stdout:
    """One ssh process's stdout against its wrapper's marker: the bytes its reader has read (the stream it reads
    wrapped by :meth:`stream`), whether it waits in a read with all it read forwarded (``idle``), when it last
    forwarded a line (``read_at``), and how many bytes the wrapper said it sent before the marker (:meth:`heard`)."""

    def __init__(self, fd: int = -1) -> None:
        self.fd, self.read, self.read_at = fd, 0, 0.0
        self.sent: int | None = None  # an older wrapper says none
        self.idle = threading.Event()

    def stream(self, raw):
        """``raw`` (ssh's stdout, a buffered reader) as ``local.forward_lines`` reads it, counted."""
        count = self

        class Counted:
            def read1(self, n: int = -1) -> bytes:
                data = raw.read1(n)
                if data:  # not idle before counted: else poll() saw every byte read, the reader idle, the last
                    count.idle.clear()  # chunk not yet forwarded, and told the end without it (CI, 2026-12-01)
                count.read += len(data)
                return data

            def close(self) -> None:
                raw.close()
        return Counted()

    def heard(self, line: str, nonce: str) -> bool:
        """Whether ``line`` (on ssh's stderr) is this wrapper's count (``ssh_wire.sent_line``), kept if so."""
        words = line.split()
        if len(words) != 3 or words[0] != SENT or words[1] != nonce or not (words[2].isascii() and words[2].isdigit()):
            return False
        self.sent = int(words[2])
        return True

    def behind(self, now: float, alive: bool) -> bool:
        """Whether output before the marker is still to forward (``alive``: the reader runs): read and not forwarded,
        in ssh's stdout pipe (as a local worker's), or still in ssh's own buffer: the bytes the wrapper counted not
        all read, or, from an older wrapper, a line forwarded less than :data:`QUIET_S` ago."""
        if self.sent is not None and alive and self.read < self.sent:  # the count first: once all is read, the
            return True  # reader was not idle until it forwarded the last chunk (see :meth:`stream`)
        if alive and (not self.idle.is_set() or self.fd >= 0 and pending_bytes(self.fd)):
            return True
        return self.sent is None and now - self.read_at < QUIET_S


#: Connections to one host being set up at once: below sshd's default MaxStartups (10), leaving room for others.
MAX_SETUPS_PER_HOST = 8
#: How many times a connection refused before key exchange is tried again.
SETUP_RETRIES = 3
#: How long a set-up may keep its turn past ssh's ConnectTimeout without a word from the wrapper.
SETUP_HOLD_S = 30.0
#: How long a set-up keeps its turn at a host that has shown a wrapper that never says the worker runs.
OLD_WRAPPER_HOLD_S = 2.0
#: ssh's last stderr lines kept to name a failure.
STDERR_TAIL = 20
#: Bytes of ssh's stderr held back before the connection is set up; beyond them the oldest lines are shown.
_HELD_BYTES = 64 * 1024
#: ssh's warning that a host's key changed (it connects anyway under StrictHostKeyChecking=no): never dropped.
_KEY_WARNING = re.compile(r"@@@@|REMOTE HOST IDENTIFICATION HAS CHANGED|differs from the key")

# (substring of ssh's stderr, lower case) -> what went wrong. First match wins.
_SSH_FAILURES = (
    ("kex_exchange_identification", "the server dropped the connection before key exchange (its MaxStartups?)"),
    ("remote host identification has changed", "host key mismatch (the host key changed)"),
    ("host key is known", "host key unknown (not in known_hosts, and strict checking is on)"),
    ("host key verification failed", "host key verification failed"),
    ("permission denied", "authentication refused"),
    ("too many authentication failures", "authentication refused"),
    ("connection refused", "host unreachable: connection refused (nothing listens on the ssh port: sshd not "
                           "started, or restarting)"),
    ("no route to host", "host unreachable: no route to host"),
    ("network is unreachable", "host unreachable: network is unreachable"),
    ("connection timed out", "host unreachable: connection timed out"),
    ("could not resolve hostname", "host name does not resolve"),
    ("not responding", "connection lost: the server stopped responding"),
    ("timed out", "connection lost: the server stopped responding"),
    ("closed by remote host", "connection lost: closed by the remote host"),
    ("connection reset", "connection lost: reset"),
    ("connection closed", "connection lost: closed"),
    ("broken pipe", "connection lost: broken pipe"),
)

# Options the user may override through SSHConfig.extra_options (ssh keeps the first value it sees for an
# option, and the user's options come first).
_DEFAULT_OPTIONS = (
    "StrictHostKeyChecking=accept-new",
    # INFO, not ERROR: ssh says "Timeout, server ... not responding" and "Connection ... timed out" at INFO.
    "LogLevel=INFO",
    "ServerAliveInterval=5",
    "ServerAliveCountMax=3",
)
# Options the user cannot override: ssh never prompts, and each worker has a connection of its own. With the user's
# ControlMaster, every worker on a host would be a session in the first one's connection: stopping that worker
# ended the others, and its own end went unnoticed while they ran.
_FIXED_OPTIONS = ("BatchMode=yes", "ControlMaster=no", "ControlPath=none")
# What distributions' ssh_config sends by default (SendEnv): LANG and LC_* (Debian, Ubuntu), COLORTERM and NO_COLOR
# (Ubuntu), LANGUAGE and XMODIFIERS (Fedora, RHEL). `-o SendEnv=-*` cannot stop it: ssh reads the command line's
# options first, and the config files' SendEnv adds the names again afterwards (OpenSSH 9.2).
_SENT_BY_DEFAULT = re.compile(r"LANG|LANGUAGE|LC_\w*|COLORTERM|NO_COLOR|XMODIFIERS")

# What ssh says at INFO that is news to nobody (lower case prefixes): neither output nor a failure's last words.
_SSH_NOISE = ("warning: permanently added", "learned new hostkey", "adding new key for")


class HostGate:
    """At most ``limit`` connection set-ups per host at once; the others wait for a turn."""

    def __init__(self, limit: int = MAX_SETUPS_PER_HOST) -> None:
        self._limit = max(1, limit)
        self._busy: dict[str, int] = {}
        self._old: set[str] = set()  # hosts whose wrapper was seen not to say the worker runs
        self._cond = threading.Condition()

    def enter(self, host: str, cancelled: threading.Event) -> bool:
        """Wait for a turn at ``host``; ``False`` (no turn taken) once ``cancelled`` is set."""
        with self._cond:
            while self._busy.get(host, 0) >= self._limit and not cancelled.is_set():
                self._cond.wait()
            if cancelled.is_set():
                return False
            self._busy[host] = self._busy.get(host, 0) + 1
            return True

    def leave(self, host: str) -> None:
        """End a turn taken by ``enter``."""
        with self._cond:
            self._busy[host] -= 1
            if not self._busy[host]:
                del self._busy[host]
            self._cond.notify_all()

    def wake(self) -> None:
        """Have every waiter look at its ``cancelled`` again."""
        with self._cond:
            self._cond.notify_all()

    def note_wrapper(self, host: str, says_started: bool) -> None:
        """Record whether ``host``'s wrapper says the worker runs (the last word wins: hosts get upgraded)."""
        with self._cond:
            if says_started:
                self._old.discard(host)
            else:
                self._old.add(host)

    def await_setup(self, host: str, progress: threading.Event, hold_s: float) -> bool:
        """Wait for ``progress`` up to ``hold_s``, or :data:`OLD_WRAPPER_HOLD_S` once ``host`` shows an old
        wrapper (even while waiting); whether it came."""
        began = time.monotonic()
        while not progress.wait(0.25):
            with self._cond:
                limit = min(hold_s, OLD_WRAPPER_HOLD_S) if host in self._old else hold_s
            if time.monotonic() - began >= limit:
                return False
        return True


class ConnectionLines:
    """ssh's stderr lines for one connection: held back until :meth:`connect` (the wrapper said the worker runs):
    then they were the connection's chatter (an sshd ``Banner``) and are dropped; if ssh ends first, :meth:`end`
    shows them. ``tail`` is what names a failure: only lines since the connection was set up once it was (the
    worker's own stderr travels on stdout, so these are ssh's and the wrapper's words). Only the wrapper's word
    counts, not the worker's first output: that comes through another pipe, maybe read before ssh's earlier
    lines are. An older wrapper never says it, so its lines are shown when ssh ends.
    """

    def __init__(self, forward: Callable[[str], None]) -> None:
        self._forward = forward
        self._lock = threading.Lock()
        self._held: deque[str] = deque()
        self._held_bytes = 0
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self.connected = False

    def reset(self) -> None:
        """Forget a previous try's lines."""
        with self._lock:
            self._held.clear()
            self._held_bytes = 0
            self.tail.clear()
            self.connected = False

    def add(self, line: str) -> None:
        """One line of ssh's stderr (from the one thread reading it)."""
        shown = []
        with self._lock:
            self.tail.append(line)
            if self.connected:
                shown.append(line)
            else:
                self._held.append(line)
                self._held_bytes += len(line)
                while self._held_bytes > _HELD_BYTES:  # ssh at DEBUG: show the oldest rather than grow
                    shown.append(self._held.popleft())
                    self._held_bytes -= len(shown[-1])
        for text in shown:
            self._forward(text)

    def connect(self) -> None:
        """The connection is set up: what ssh said meanwhile was the connection's chatter (a Banner), except
        a warning that the host's key changed, which ssh prints and then connects anyway where the user's
        options let it (``StrictHostKeyChecking=no``): that one is still shown."""
        with self._lock:
            self.connected = True
            shown = [line for line in self._held if _KEY_WARNING.search(line)]
            self._held.clear()
            self._held_bytes = 0
            self.tail.clear()
        for text in shown:
            self._forward(text)

    def end(self) -> None:
        """ssh's stderr ended: show what was held back (ssh failed before the connection was set up)."""
        with self._lock:
            shown, self._held, self._held_bytes = list(self._held), deque(), 0
        for text in shown:
            self._forward(text)


def is_started(line: str, nonce: str) -> bool:
    """Whether ``line`` is the remote wrapper's word that the worker of launch ``nonce`` runs."""
    return line.split() == [STARTED, nonce]


def is_noise(line: str) -> bool:
    """Whether ``line`` is ssh's INFO chatter (a host key added to known_hosts), to keep out of the output."""
    return line.lower().startswith(_SSH_NOISE)


#: ssh's own words for a TCP connection refused (not a worker's or the wrapper's, which may have run).
_TCP_REFUSED = re.compile(r"ssh: connect to host \S+ port \d+: connection refused", re.IGNORECASE)


def refusal(stderr_tail: deque[str] | list[str]) -> str | None:
    """How ssh was refused before key exchange (nothing ran on the host, so trying again is safe), or None."""
    if any("kex_exchange_identification" in line for line in stderr_tail):
        return "dropped before key exchange (sshd's MaxStartups?)"
    if any(_TCP_REFUSED.match(line.strip()) for line in stderr_tail):
        return "refused (sshd not listening yet, or restarting?)"
    return None


def refused_before_key_exchange(stderr_tail: deque[str] | list[str]) -> bool:
    """Whether ssh failed before key exchange (sshd past MaxStartups, or not listening): nothing ran on the host."""
    return refusal(stderr_tail) is not None


def retry_delay(attempt: int) -> float:
    """Seconds before try ``attempt`` + 1 (from 1): doubling, with jitter so that retries do not come as a burst."""
    return random.uniform(0.5, 1.5) * 2 ** (attempt - 1)


#: Lines of a Python that could not start that say nothing of why: its stack's header and frames, its state dump.
_NO_CAUSE = re.compile(r"<no Python frame>|(Current thread|Thread) 0x|File \"|Python runtime state|Extension modules|"
                       r"\]$|sys\.|[a-z ]+ = ")


def wrapper_failure(rc: int, stderr_tail: deque[str] | list[str]) -> str:
    """Name a remote wrapper that ended with ``rc`` without starting the worker; its telling words quoted: a Python
    that could not start (``-x PYTHONHOME=/x``) ends on its stack's header, after the fatal error and its cause."""
    lines = [line.strip() for line in stderr_tail if line.strip()]
    told = [line for line in lines if not _NO_CAUSE.match(line)]
    fatal = next((line for line in told if line.startswith("Fatal Python error")), None)
    last = told[-1] if told else lines[-1] if lines else "nothing"
    last = f"{fatal} ({last})" if fatal is not None and fatal != last else last
    if any("no module named" in line.lower() and "cloud_elastic" in line for line in lines):
        return (f"python3 on that host cannot import cloud_elastic: install cloud-elastic there at the driver's "
                f"path ({os.path.dirname(sys.executable)}) (remote said: {last})")
    return f"the remote wrapper exited with {rc} without starting the worker (remote said: {last})"


def classify(stderr_tail: deque[str] | list[str]) -> str:
    """Name an ssh exit-255 failure from ssh's stderr; quote ssh's last words."""
    lines = [line.strip() for line in stderr_tail if line.strip()]
    if not lines:  # ssh reports every failure of its own; silence means the remote side died
        return "the remote wrapper ended without reporting the worker's status (killed by a signal?)"
    text = " ".join(lines).lower()
    last = lines[-1]
    for needle, what in _SSH_FAILURES:
        if needle in text:
            return f"{what} (ssh said: {last})"
    return f"ssh exited with 255 (ssh said: {last})"


def transport_error(destination: str, what: str) -> str:
    """The ``transport_error`` of a worker that ssh's failure ended, not the worker itself: ``what`` happened."""
    return f"SSH failure on {destination} (not a worker failure): {what}"


def exit_status(rc: int | None, marker: tuple[int, str] | None, stopping: bool, stderr_tail: deque[str] | list[str],
                transport: Callable[[str], str], keepalive_timeout_s: float) -> ExitStatus:
    """A worker's end: the exact status its wrapper's ``marker`` says (``rc`` None: ssh still runs, the wrapper stops
    what the worker left), else ssh's exit code ``rc``, an SSH failure (``transport`` names it, with ssh's
    ``stderr_tail``) unless the driver was ``stopping`` the worker."""
    if marker is not None:
        code, reason = marker
        if reason == REASON_GONE_UNKNOWN:  # ended while no driver watched, and left no exit report that says a code
            return ExitStatus(1, known=False)  # (reason "gone": the code its exit report on the host says)
        if reason == REASON_KEEPALIVE:
            return ExitStatus(code, transport(f"the connection went silent for {keepalive_timeout_s:g}s and the "
                                              "remote watchdog stopped the worker"))
        return ExitStatus(code)
    rc = 255 if rc is None else rc  # not called so: without a marker, ssh has ended
    if rc == 255:
        return ExitStatus(rc, transport(classify(stderr_tail)))
    if rc < 0 and not stopping:
        return ExitStatus(rc, transport(f"the local ssh client was killed by signal {-rc}"))
    if not stopping:
        # No marker and not stopped by us: the wrapper ended before it could start the worker.
        return ExitStatus(rc, transport(wrapper_failure(rc, stderr_tail)))
    return ExitStatus(rc)


def wants_job_known_hosts(extra_options: tuple[str, ...] | list[str]) -> bool:
    """Whether to use a job-private known-hosts file: not if the user chose a file or strict checking."""
    given = {}
    for option in extra_options:
        match = SSH_OPTION.match(option)
        if match:
            given.setdefault(match.group(1).lower(), option[match.end(2):].strip().lower())
    strict = given.get("stricthostkeychecking", "")
    return "userknownhostsfile" not in given and strict not in ("yes", "true", "ask")


def ssh_path(path: str) -> str:
    """``path`` as the value of an ssh option that takes files (UserKnownHostsFile): ssh expands ``%`` tokens
    and a leading ``~`` there, and splits the value on whitespace unless it is double-quoted."""
    path = os.path.abspath(path).replace("%", "%%")
    return f'"{path}"' if any(c.isspace() for c in path) else path


def ssh_argv(ssh: str, config: SSHConfig, known_hosts: str | None, host: str) -> list[str]:
    """The ssh client invocation for ``host`` (without the remote command): the fixed options, the user's, then
    the defaults the user's do not override; ``known_hosts``, the job-private file, unless ``None``."""
    argv = [ssh, "-T"]
    for option in _FIXED_OPTIONS + tuple(config.extra_options):
        argv += ["-o", option]
    argv += ["-o", f"ConnectTimeout={max(1, math.ceil(config.connect_timeout_s))}"]
    defaults = _DEFAULT_OPTIONS + (("IdentitiesOnly=yes",) if config.identity_file else ())
    if known_hosts is not None:
        defaults += (f"UserKnownHostsFile={ssh_path(known_hosts)}", "HashKnownHosts=no")
    overridden = {option_key(option) for option in config.extra_options}
    for option in defaults:
        if option_key(option) not in overridden:
            argv += ["-o", option]
    if config.identity_file:
        argv += ["-i", config.identity_file]
    if config.port is not None:
        argv += ["-p", str(config.port)]
    if config.user:
        argv += ["-l", config.user]
    return argv + ["--", host]


def ssh_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The local ssh's environment: ``environ`` without the variables a distribution's ssh_config sends to the
    remote host by default (LANG, LC_*...), so that a worker gets only what the driver gives it."""
    return {name: value for name, value in environ.items() if not _SENT_BY_DEFAULT.fullmatch(name)}


def option_key(option: str) -> str:
    match = SSH_OPTION.match(option)
    return match.group(1).lower() if match else option.lower()


#: Not secrets, and the wrapper's own process needs them: where its control socket goes (TMPDIR), and what lets
#: a site python3 start at all (a shared libpython without an rpath).
_FOR_THE_WRAPPER = frozenset({"TMPDIR", "LD_LIBRARY_PATH", "LD_PRELOAD"})


def _on_command_line(name: str) -> bool:
    # They choose the python3 that runs the wrapper, and the cloud_elastic it imports, or the wrapper needs them.
    return name == "PATH" or name.startswith("PYTHON") or name in _FOR_THE_WRAPPER


def remote_prefix(spec: WorkerSpec) -> list[str]:
    """``exec env -- PATH=... PYTHON...=... python3 -m cloud_elastic.driver.launch.ssh_remote`` for ``spec``,
    shell-quoted. Only ``PATH``, ``PYTHON*``, ``TMPDIR`` and ``LD_LIBRARY_PATH``/``LD_PRELOAD`` are on this line; the
    other variables go in :func:`env_line`."""
    bindir = os.path.dirname(sys.executable)
    if "PATH" in spec.env:
        path = shlex.quote(f"PATH={bindir}:{spec.env['PATH']}")
    else:
        path = shlex.quote(f"PATH={bindir}:") + '"$PATH"'
    assignments = [shlex.quote(f"{k}={v}") for k, v in spec.env.items() if k != "PATH" and _on_command_line(k)]
    return ["exec", "env", "--", path, *assignments, "python3", "-m", MODULE]


def env_line(spec: WorkerSpec) -> str:
    """What follows the secret's line on ssh's stdin for a wrapper started with ``--env``: the variables of ``spec``
    that :func:`remote_prefix` leaves off the command line, as one line of ASCII JSON (``ssh_remote.parse_env``)."""
    return json.dumps({k: v for k, v in spec.env.items() if not _on_command_line(k)}) + "\n"


def destination(config: SSHConfig, host: str) -> str:
    """``user@host:port`` as the lines name it: the port only where the job knows it (``--ssh-port`` or an
    ``--ssh-option Port=``); else ssh's own configuration picks it, which a guessed 22 would misname."""
    user = f"{config.user}@" if config.user else ""
    port = config.port or next((o.split("=", 1)[1].strip() for o in config.extra_options
                                if o.split("=", 1)[0].strip().lower() == "port"), None)
    return f"{user}{host}" + (f":{port}" if port else "")
