"""What the driver's two servers (control plane, rendezvous store) share against bad or hostile clients.

:class:`RefusalLog`: the warnings about refused clients, de-duplicated by kind. A kind is a fixed
string the server chooses, never text from the client: keyed on the client's own bytes (or on its
address), each garbage request would log a line of its own, and the set of what was logged would
grow with them.

:func:`descriptor_share`: how many connections a server may hold, as a share of the process's
descriptor limit: the control plane half, the rendezvous store a quarter (a worker holds two
control connections and one store connection), the metrics port a sixteenth (and 64 at most), so
strangers on every port leave more than a sixth for the rest of the driver, a worker launch's pipes
first (without them the launch fails).

:func:`raise_descriptor_limit`: at the driver's start, the soft descriptor limit up to the hard one, with a
warning when even that is too low for the job.

:class:`AcceptPause`: a listening socket that cannot accept (the process is out of descriptors):
pause it, do not spin.

A connection that ``accept()`` cannot take stays in the listener's backlog, so the
listener stays readable and a selector loop would wake at once, fail again and
log again, at full CPU, for as long as the shortage lasts. :class:`AcceptPause`
takes the listener out of the selector for a moment instead and puts it back
when the loop asks (:meth:`resume_if_due`); the waiting connections are accepted
then. One warning per shortage, not one per attempt.
"""

from __future__ import annotations

import errno
import logging
import resource
import selectors
import time
from typing import Any

__all__ = ["AcceptPause", "CONTROL_SHARE", "METRICS_SHARE", "PAUSE_S", "RefusalLog", "STORE_SHARE", "UNPROVEN_SHARE",
           "descriptor_share", "power_of_ten", "raise_descriptor_limit"]

log = logging.getLogger(__name__)

#: How long the listener is left alone after an accept that failed for want of descriptors or memory.
PAUSE_S = 0.25
_SHORTAGES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: The shares of the descriptor limit the two servers' connections may take (see the module docstring).
CONTROL_SHARE = 0.5
STORE_SHARE = 0.25
METRICS_SHARE = 1 / 16
#: The share of a server's own share that connections which have sent nothing that counts yet may take (on the
#: control plane, no signed request; on the store, not even torch's validation): past it the oldest is closed
#: (see :mod:`.selector_server`).
UNPROVEN_SHARE = 0.25
#: How high :func:`raise_descriptor_limit` takes the soft limit at most (a hard limit of "unlimited" included).
MAX_RAISED_LIMIT = 1 << 20
#: What the driver holds open for each worker: two control-plane connections, a store connection (and one more
#: while a next group forms), the pipes of its output and its process handle; about 5 were measured (18
#: descriptors at -np 1, 45 at -np 7, 73 at -np 12), the rest is room. And what the driver holds open besides.
DESCRIPTORS_PER_WORKER = 6
DRIVER_DESCRIPTORS = 64
#: Kinds a RefusalLog tells apart; past them, everything is "other" (kinds are the servers' own strings,
#: but a bound keeps a mistake from growing the driver).
MAX_KINDS = 64


def descriptor_share(share: float) -> int:
    """``share`` of the process's descriptor limit (``RLIMIT_NOFILE``, soft), read now: it can change.

    No limit (``RLIM_INFINITY``, which some systems report): no cap either, as far as this goes."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft < 0:
        return 1 << 62
    return int(soft * share)


def raise_descriptor_limit(workers: int) -> int:
    """Raise the process's soft descriptor limit to its hard one (at most :data:`MAX_RAISED_LIMIT`), and warn
    once if it is still below what ``workers`` (``--max-np`` and ``--spares``) need; returns the soft limit.

    Most systems start a process at a soft limit of 1024 with a hard limit far above: a driver left there
    could not hold much more than 250 workers (each takes two control-plane connections, and the control
    plane may hold half the limit, :func:`descriptor_share`), and a launch past it fails with "Too many
    open files". The servers read the limit at each accept, so their shares follow it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MAX_RAISED_LIMIT if hard == resource.RLIM_INFINITY or hard < 0 else min(hard, MAX_RAISED_LIMIT)
    if soft != resource.RLIM_INFINITY and 0 <= soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("driver: raised the soft descriptor limit (RLIMIT_NOFILE) from %d to %d", soft, target)
        except (ValueError, OSError) as exc:  # macOS caps it below an "unlimited" hard limit
            log.debug("driver: cannot raise the soft descriptor limit from %d to %d: %s", soft, target, exc)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    need = DRIVER_DESCRIPTORS + DESCRIPTORS_PER_WORKER * workers
    if need > MAX_RAISED_LIMIT:  # no real bound (Ray's and Spark's unset max_np): no advice a system can follow
        log.debug("driver: %d workers at most: no descriptor limit is checked for them", workers)
        return soft
    if soft != resource.RLIM_INFINITY and 0 <= soft < need:
        log.warning("driver: its descriptor limit is %d, and %d workers need about %d (%d each, "
                    "%d for the driver): past it, launches fail with 'Too many open files'; raise it before the "
                    "driver starts (ulimit -n %d in its shell, which needs a hard limit as high: LimitNOFILE=%d in "
                    "a systemd unit, nofile in /etc/security/limits.conf)", soft, workers, need,
                    DESCRIPTORS_PER_WORKER, DRIVER_DESCRIPTORS, need, need)
    return soft


class RefusalLog:
    """Warnings about refused clients, one per kind and then a count at 10, 100, 1,000, ... of that kind.

    ``first`` formats the first warning of a kind (``%s`` placeholders for the peer and the detail,
    which may carry the client's bytes, escaped by the caller) for ``logger`` (the server's own); the
    counts name the kind and the latest peer only. So a flood of N refusals logs about ``log10(N)``
    lines per kind, whatever it sends. Not thread-safe: each server calls it from its one thread.
    """

    def __init__(self, logger: logging.Logger, what: str, first: str) -> None:
        self._log, self._what, self._first = logger, what, first
        self._counts: dict[str, int] = {}

    def refused(self, kind: str, peer: str, detail: str) -> None:
        if kind not in self._counts and len(self._counts) >= MAX_KINDS:
            kind = "other"
        n = self._counts[kind] = self._counts.get(kind, 0) + 1
        if n == 1:
            self._log.warning(self._first, peer, detail)
        elif power_of_ten(n):
            self._log.warning("%s: %d refusals of this kind so far (%s), the latest from %s",
                              self._what, n, kind, peer)


def power_of_ten(n: int) -> bool:
    """Whether ``n`` is 1, 10, 100, ...: when a count of refusals or failures is worth a line."""
    while n % 10 == 0:
        n //= 10
    return n == 1


class AcceptPause:
    """Pauses ``listener`` (registered in ``selector`` with ``data``) while accepting fails for want of resources."""

    def __init__(self, selector: selectors.BaseSelector, listener: Any, data: Any, what: str) -> None:
        self._selector, self._listener, self._data, self._what = selector, listener, data, what
        self._until: float | None = None
        self._short = False  # a shortage was logged and no accept has succeeded since

    def failed(self, exc: OSError) -> bool:
        """``accept()`` raised ``exc``: True if it was a shortage (the listener is then paused)."""
        if exc.errno not in _SHORTAGES:
            return False
        if self._until is None:
            self._selector.unregister(self._listener)
        self._until = time.monotonic() + PAUSE_S
        if not self._short:
            self._short = True
            log.warning("%s: cannot accept connections (%s); they wait, and are accepted once descriptors are "
                        "free again", self._what, exc)
        return True

    def accepted(self) -> None:
        if self._short:
            self._short = False
            log.warning("%s: accepting connections again", self._what)

    def timeout(self, other: float | None) -> float | None:
        """The selector's timeout: ``other`` (None: none), or less, to resume accepting on time."""
        if self._until is None:
            return other
        left = max(0.0, self._until - time.monotonic())
        return left if other is None else min(other, left)

    def resume_if_due(self) -> None:
        if self._until is not None and time.monotonic() >= self._until:
            self._until = None
            self._selector.register(self._listener, selectors.EVENT_READ, self._data)
