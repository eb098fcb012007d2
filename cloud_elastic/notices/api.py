"""What a notice watcher reports, and the interface every watcher has.

A watcher runs on a worker host, reads that host's own instance-metadata
service and reports each distinct notice once through a callback. It never
decides anything: what the driver does with a notice (drain the host, remove it
before the deadline, complete a lifecycle action) is the driver's business.

Guarantees every watcher gives:

* The constructor does no I/O and starts no thread. :meth:`NoticeWatcher.start`
  starts exactly one daemon thread; :meth:`NoticeWatcher.close` stops it.
* Each distinct notice (by :attr:`Notice.event_id`) is reported once: a
  report counts when the ``report`` callback returns; one that raises is tried
  again at the notice's next sighting (the next read that still shows it).
* Nothing raises out of the watcher's thread: bad answers, timeouts and an
  unreachable service are logged (rate-limited) and retried, and an exception
  from the ``report`` callback is logged (and the report retried, above).
* No work happens on the caller's thread except in :meth:`acknowledge`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable

__all__ = [
    "Notice",
    "NoticeWatcher",
    "Report",
    "TERMINATE",
    "REBALANCE",
    "MAINTENANCE",
    "KINDS",
    "SOURCE_AWS",
    "SOURCE_GCP",
    "SOURCE_AZURE",
    "SOURCES",
    "GCP_MAINTENANCE_REASON",
    "renewed",
    "NOTICE_GRACE_S",
    "SOFT_NOTICE_TTL_S",
    "MAX_NOTICE_LEAD_S",
]

#: The host will be taken away (Spot interruption, preemption, terminating lifecycle state).
TERMINATE = "terminate"
#: Soft: AWS recommends moving work off this host (rebalance recommendation).
REBALANCE = "rebalance"
#: Soft: the cloud plans maintenance on this host (GCP maintenance-event, Azure Freeze/Reboot/Redeploy).
MAINTENANCE = "maintenance"
KINDS = (TERMINATE, REBALANCE, MAINTENANCE)

SOURCE_AWS = "aws-imds"
SOURCE_GCP = "gcp-metadata"
SOURCE_AZURE = "azure-scheduled-events"
SOURCES = (SOURCE_AWS, SOURCE_GCP, SOURCE_AZURE)

#: How the reason of a GCE maintenance notice (event ``gcp-maintenance:*``) starts.
GCP_MAINTENANCE_REASON = "GCE host maintenance: "


def renewed(source: str | None, reason: str) -> bool:
    """Whether a notice means maintenance still under way while the host's watcher reports it (GCP's: its watcher
    re-sends ``TERMINATE_ON_HOST_MAINTENANCE`` while it lasts), so that hearing it again says it is still pending.

    Not a Spot or preemption notice, nor an Azure event: each watcher reports those once, and the same notice
    from the host's next watcher (the worker that took over watching) is no re-send.
    """
    return source == SOURCE_GCP and reason.startswith(GCP_MAINTENANCE_REASON)


#: A hard notice lapses this long after its deadline (after its arrival when it has none) if the
#: group still reports the host ready: the cloud did not take it, so the job may use it again.
NOTICE_GRACE_S = 120.0
#: A soft notice (rebalance recommendation, maintenance) lapses this long after it was sent.
SOFT_NOTICE_TTL_S = 600.0
#: A hard notice's deadline counts at most this far ahead for its lapse: a garbled time (a Spot notice for
#: the year 9999) would otherwise keep a host off for ever. The longest real notices: an hour's GCE
#: maintenance on a GPU VM, a lifecycle hook's timeout (the driver's host book and the queue's watcher both use it).
MAX_NOTICE_LEAD_S = 3600.0


@dataclass(frozen=True)
class Notice:
    """One notice read from a host's metadata service.

    ``kind`` is :data:`TERMINATE` (hard: the host goes away) or one of the soft
    kinds :data:`REBALANCE` / :data:`MAINTENANCE`. ``deadline`` is when the cloud
    acts, in Unix seconds, or None when the source gives no time. ``reason`` is
    one line for logs. ``event_id`` identifies the notice for de-duplication
    (on Azure it is the scheduled event's ``EventId``).
    """

    source: str
    kind: str
    deadline: float | None
    reason: str
    event_id: str

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown notice source {self.source!r}")
        if self.kind not in KINDS:
            raise ValueError(f"unknown notice kind {self.kind!r}")
        if not self.event_id:
            raise ValueError("a notice needs an event_id")
        if "\n" in self.reason:
            raise ValueError("a notice's reason must be one line")

    @property
    def soft(self) -> bool:
        """True for advice (rebalance, maintenance); False when the host will be taken away."""
        return self.kind != TERMINATE


#: The callback a watcher reports notices through (called on the watcher's thread).
Report = Callable[[Notice], None]


class NoticeWatcher(abc.ABC):
    """Watches one host's metadata service for notices (see the module docstring)."""

    #: The :attr:`Notice.source` of every notice this watcher reports.
    source: str

    @abc.abstractmethod
    def start(self, report: Report) -> None:
        """Start the watcher's daemon thread; ``report`` gets each distinct notice once.

        ``report`` is called on the watcher's thread and should return quickly.
        Calling start twice raises RuntimeError.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the thread. Returns within about one request timeout; idempotent."""

    def resend(self) -> None:
        """Report the notices reported so far again at their next sighting (a restarted driver knows none)."""

    def acknowledge(self, until: Callable[[], bool] | None = None) -> tuple[str, ...]:
        """Tell the cloud the host's workers have left, where the cloud wants to hear it.

        Azure: POSTs ``StartRequests`` for the terminate events reported and not
        yet acknowledged, so the platform may proceed at once instead of waiting
        for ``NotBefore`` (it evicts the VM: every process on it dies). With
        ``until``, it first waits until ``until()`` is true (the host's other
        workers have exited), or until the earliest deadline of those events
        (the platform goes ahead then anyway), or until :meth:`close`. Returns
        the event ids acknowledged; never raises (a failure is logged and
        retried by the next call). Others: nothing to do, no wait. Blocks for
        that wait and at most one request timeout.
        """
        return ()
