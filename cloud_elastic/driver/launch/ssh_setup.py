"""Setting up the SSH launcher's connections: how many to one host at once, which failed set-ups are tried
again, how ssh's failures are named, and the pieces of its ssh options.

sshd drops unauthenticated connections past its ``MaxStartups`` (by default, from the 10th on, 30% of them,
rising to all at 100), with "kex_exchange_identification: read: Connection reset by peer" on the client's
side. So the launcher sets up at most :data:`MAX_SETUPS_PER_HOST` connections to a host at once (a set-up
ends when the remote wrapper says the worker runs, or when ssh ends), and tries a connection refused that
early again, :data:`SETUP_RETRIES` times after a random pause, before calling it a transport failure: the
remote side ran nothing yet, so trying again cannot start a worker twice.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from collections import deque

from cloud_elastic.config import SSH_OPTION
from cloud_elastic.driver.launch.ssh_remote import STARTED

__all__ = ["MAX_SETUPS_PER_HOST", "SETUP_HOLD_S", "SETUP_RETRIES", "HostGate", "classify", "is_noise", "is_started",
           "option_key", "refused_before_key_exchange", "retry_delay", "ssh_quote", "wants_job_known_hosts",
           "wrapper_failure"]

#: Connections to one host being set up at once: below sshd's default MaxStartups (10), leaving room for others.
MAX_SETUPS_PER_HOST = 8
#: How many times a connection refused before key exchange is tried again.
SETUP_RETRIES = 3
#: How long a set-up may keep its turn past ssh's ConnectTimeout without a word from the wrapper.
SETUP_HOLD_S = 30.0

# (substring of ssh's stderr, lower case) -> what went wrong. First match wins.
_SSH_FAILURES = (
    ("kex_exchange_identification", "the server dropped the connection before key exchange (its MaxStartups?)"),
    ("remote host identification has changed", "host key mismatch (the host key changed)"),
    ("host key is known", "host key unknown (not in known_hosts, and strict checking is on)"),
    ("host key verification failed", "host key verification failed"),
    ("permission denied", "authentication refused"),
    ("too many authentication failures", "authentication refused"),
    ("connection refused", "host unreachable: connection refused"),
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

# What ssh says at INFO that is news to nobody (lower case prefixes): neither output nor a failure's last words.
_SSH_NOISE = ("warning: permanently added", "learned new hostkey", "adding new key for")


class HostGate:
    """At most ``limit`` connection set-ups per host at once; the others wait for a turn."""

    def __init__(self, limit: int = MAX_SETUPS_PER_HOST) -> None:
        self._limit = max(1, limit)
        self._busy: dict[str, int] = {}
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


def is_started(line: str, nonce: str) -> bool:
    """Whether ``line`` is the remote wrapper's word that the worker of launch ``nonce`` runs."""
    return line.split() == [STARTED, nonce]


def is_noise(line: str) -> bool:
    """Whether ``line`` is ssh's INFO chatter (a host key added to known_hosts), to keep out of the output."""
    return line.lower().startswith(_SSH_NOISE)


def refused_before_key_exchange(stderr_tail: deque[str] | list[str]) -> bool:
    """Whether ssh failed before key exchange (sshd past MaxStartups): nothing ran on the host."""
    return any("kex_exchange_identification" in line for line in stderr_tail)


def retry_delay(attempt: int) -> float:
    """Seconds before try ``attempt`` + 1 (from 1): doubling, with jitter so that retries do not come as a burst."""
    return random.uniform(0.5, 1.5) * 2 ** (attempt - 1)


def wrapper_failure(rc: int, stderr_tail: deque[str] | list[str]) -> str:
    """Name a remote wrapper that ended with ``rc`` without starting the worker."""
    lines = [line.strip() for line in stderr_tail if line.strip()]
    last = lines[-1] if lines else "nothing"
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


def wants_job_known_hosts(extra_options: tuple[str, ...] | list[str]) -> bool:
    """Whether to use a job-private known-hosts file: not if the user chose a file or strict checking."""
    given = {}
    for option in extra_options:
        match = SSH_OPTION.match(option)
        if match:
            given.setdefault(match.group(1).lower(), option[match.end(2):].strip().lower())
    strict = given.get("stricthostkeychecking", "")
    return "userknownhostsfile" not in given and strict not in ("yes", "true", "ask")


def ssh_quote(value: str) -> str:
    # ssh splits an -o value on whitespace (UserKnownHostsFile takes several files) unless double-quoted.
    return f'"{value}"' if any(c.isspace() for c in value) else value


def option_key(option: str) -> str:
    match = SSH_OPTION.match(option)
    return match.group(1).lower() if match else option.lower()
