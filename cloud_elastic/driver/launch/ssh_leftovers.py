"""What the SSH wrappers of earlier launches left on a host, removed by a later one: :func:`sweep`.

Each wrapper (:mod:`.ssh_remote`) binds a control socket, ``LAUNCH-ID.sock``, and its worker leaves an exit report,
``LAUNCH-ID.exit.json``, in the user's private directory ``$TMPDIR/cloud-elastic-UID``. A wrapper removes its socket
when it ends, but not when it is killed (SIGKILL, the OOM killer, a reboot keeping ``/tmp``), and no one removed the
reports: a host that outlives many jobs (a static host list, an on-premises fleet, a long-lived spot instance) kept
one file a launch, without bound (1,123 on the test machine after a day of runs).

A wrapper starting there removes, at most once an hour per directory (``.swept``'s age):

- a socket that no process of this network namespace has bound (it is not in ``/proc/net/unix``) and that is older
  than :data:`SOCKET_SETTLE_S` (a wrapper between its ``bind`` and ``listen`` is listed already, but a minute spares
  any doubt); off Linux, where there is no such list, sockets are left alone;
- an exit report (and its writers' temporaries, ``.status`` and ``.tmp``: one killed mid-write) older than
  :data:`REPORT_KEEP_S`: a restarted driver asks for the reports of the workers it adopts (``--exit-reports``),
  within its adoption window, minutes after its predecessor died; a week leaves any restart its report.

A socket of a live wrapper in another network namespace sharing this ``/tmp`` under the same user is not listed
here and may be removed: that wrapper's worker then cannot be adopted by a restarted driver (nothing else changes).
Errors are ignored: the sweep never stops a launch.
"""

from __future__ import annotations

import os
import stat
import time

__all__ = ["REPORT_KEEP_S", "SOCKET_SETTLE_S", "SWEEP_EVERY_S", "private_socket_dir", "sweep"]

#: How long an exit report is kept (a restarted driver reads it within its adoption window).
REPORT_KEEP_S = 7 * 24 * 3600.0

#: A socket file younger than this is never removed.
SOCKET_SETTLE_S = 60.0

#: A directory is swept at most this often (the mtime of its ``.swept`` file).
SWEEP_EVERY_S = 3600.0

#: An exit report, and the temporaries of its writers (the wrapper's ``.status``, the worker's ``.tmp``).
_REPORTS = (".exit.json", ".exit.json.status", ".exit.json.tmp")

#: At most this many entries are looked at per sweep: bounded work for a launch however much was left.
MAX_ENTRIES = 100_000


def private_socket_dir(path: str) -> bool:
    """Create the directory of socket (or report) ``path`` 0700; False if it is not a private directory of this
    user (then no socket is made there and no report read from it: another user could forge one)."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


def _bound_paths() -> set[str] | None:
    """The paths of the Unix sockets bound in this network namespace, or None where that cannot be read."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as fh:
            next(fh, None)  # the header
            # The path is the eighth field, the rest of the line: it may hold spaces ($TMPDIR's).
            return {fields[7] for fields in (line.rstrip("\n").split(None, 7) for line in fh) if len(fields) == 8}
    except OSError:
        return None


def sweep(directory: str, *, now: float | None = None) -> int:
    """Remove what killed wrappers and old exit reports left in ``directory`` (see module docstring); the count."""
    now = time.time() if now is None else now
    marker = os.path.join(directory, ".swept")
    try:
        if now - os.stat(marker).st_mtime < SWEEP_EVERY_S:
            return 0
    except FileNotFoundError:
        pass
    except OSError:
        return 0
    try:
        with open(marker, "w"):
            pass  # its mtime is the sweep's: the next launches leave the directory alone for an hour
        names = []
        with os.scandir(directory) as entries:
            for entry in entries:
                names.append(entry.name)
                if len(names) >= MAX_ENTRIES:
                    break
    except OSError:
        return 0
    bound = _bound_paths() if any(n.endswith(".sock") for n in names) else set()
    removed = 0
    for name in names:
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
            age = now - info.st_mtime
            if name.endswith(".sock"):
                stale = (bound is not None and stat.S_ISSOCK(info.st_mode) and age > SOCKET_SETTLE_S
                         and path not in bound)
            else:
                stale = name.endswith(_REPORTS) and stat.S_ISREG(info.st_mode) and age > REPORT_KEEP_S
            if stale:
                os.unlink(path)
                removed += 1
        except OSError:
            continue
    return removed
