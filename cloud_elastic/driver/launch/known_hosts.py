"""A job-private known-hosts file that survives recycled private IP addresses.

Autoscaling groups give a replaced instance's private address to a later
instance, which has another host key. With a known-hosts file shared across
instances, ssh (``StrictHostKeyChecking=accept-new``) refuses the newcomer as a
host-key mismatch and the driver blacklists a healthy host. Discovery knows
which instance stands behind each address (``WorkerSpec.instance``), so
:class:`JobKnownHosts` keeps the keys this job learned in a file of its own and
forgets an address's keys when a *different* instance is launched there. A
changed key for the *same* instance is still refused: that is a real mismatch.

The file lives in a private temporary directory (0700, file 0600), created on
first use and removed by :meth:`JobKnownHosts.close`. ssh expands ``%`` tokens
in its path, which the launcher escapes; should ssh still record no key (a path
it cannot use), :meth:`JobKnownHosts.check_recorded` says so once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import shutil
import tempfile
import threading
from typing import Iterable

__all__ = ["JobKnownHosts", "drop_host"]

logger = logging.getLogger(__name__)


def _names(host: str, port: int | None) -> set[str]:
    """How ssh writes ``host`` in known_hosts: bare for port 22, ``[host]:port`` otherwise."""
    return {host} if port in (None, 22) else {f"[{host}]:{port}"}


def _hashed_match(entry: str, names: set[str]) -> bool:
    # HashKnownHosts entries: |1|base64(salt)|base64(HMAC-SHA1(salt, name))
    parts = entry.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except ValueError:
        return False
    return any(hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest) for name in names)


def _matches(entry: str, host: str, names: set[str]) -> bool:
    if entry.startswith("|"):
        return _hashed_match(entry, names)
    # A plain entry names the address on any port: an address held by another
    # instance is stale whichever port ssh_config gave it.
    return entry == host or entry.startswith(f"[{host}]:")


def drop_host(lines: Iterable[str], host: str, port: int | None) -> list[str]:
    """The known_hosts ``lines`` without the keys recorded for ``host``.

    A line naming several hosts (``a,b key``) loses only ``host``'s name.
    Plain names match on any port; hashed names (``HashKnownHosts``) match on
    ``port`` (22 when ``None``). Comments, blank lines and marker lines
    (``@cert-authority``, ``@revoked``) are kept: the job never writes them.
    """
    names = _names(host, port) | {host}
    kept = []
    for line in lines:
        fields = line.split(None, 1)
        if len(fields) < 2 or line.startswith(("#", "@")):
            kept.append(line)
            continue
        entries = fields[0].split(",")
        left = [entry for entry in entries if not _matches(entry, host, names)]
        if len(left) == len(entries):
            kept.append(line)
        elif left:
            kept.append(",".join(left) + " " + fields[1])
    return kept


class JobKnownHosts:
    """The job's own known-hosts file, and which instance each address was last launched for.

    Thread-safe. The constructor does no I/O; :attr:`path` creates the file.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dir: str | None = None
        self._instances: dict[str, str] = {}
        self._checked = False

    @property
    def path(self) -> str:
        """The file's path; creates the private directory and the empty file on first use."""
        with self._lock:
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="cloud-elastic-ssh-")  # 0700
                os.close(os.open(os.path.join(self._dir, "known_hosts"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return os.path.join(self._dir, "known_hosts")

    def admit(self, host: str, instance: str | None, port: int | None) -> bool:
        """Before connecting to ``host`` for ``instance``: forget the address's keys if another instance held it.

        Returns whether keys were forgotten. ``instance=None`` (static lists,
        scripts) never forgets: without an identity, a changed key stays a
        mismatch.
        """
        path = self.path
        with self._lock:
            previous = self._instances.get(host)
            if instance is None:
                return False
            self._instances[host] = instance
            if previous is None or previous == instance:
                return False
            try:
                with open(path) as f:
                    lines = f.read().splitlines()
                kept = drop_host(lines, host, port)
                if kept != lines:
                    # Replace, not truncate: ssh appends with O_APPEND. A line another
                    # ssh appends between the read and the rename is lost, and that
                    # host's key is then accepted anew on its next connection.
                    tmp = f"{path}.tmp"
                    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
                    with os.fdopen(fd, "w") as f:
                        f.write("".join(line + "\n" for line in kept))
                    os.replace(tmp, path)
            except OSError as exc:
                logger.warning("cannot forget the host key of %s in %s: %s", host, path, exc)
                return False
        logger.info("address %s now belongs to instance %s (was %s): forgot its old host key", host, instance, previous)
        return True

    def check_recorded(self, destination: str) -> None:
        """After a connection to ``destination`` got through on which ssh said it added the host's key (or failed
        to): log one WARNING, the first time, if the file is empty.

        ssh records a new host's key before it authenticates ("Permanently added"), or says it could not ("Failed
        to add the host"); an empty file then means ssh would accept any later key for that host
        (``accept-new``). A key that ssh's system-wide ``ssh_known_hosts`` knew already is not added, and not
        checked here.
        """
        with self._lock:
            if self._checked or self._dir is None:
                return
            self._checked = True
            path = os.path.join(self._dir, "known_hosts")
        try:
            empty = not os.path.isfile(path) or os.path.getsize(path) == 0
        except OSError:
            empty = True
        if empty:
            logger.warning("ssh recorded no host key in %s after connecting to %s: a changed host key will not be "
                           "noticed (can ssh write that path? it expands %% and ${...} in it)", path, destination)

    def close(self) -> None:
        """Remove the private directory. Idempotent."""
        with self._lock:
            directory, self._dir = self._dir, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
