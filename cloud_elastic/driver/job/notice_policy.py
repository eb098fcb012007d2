"""Who watches a host's metadata notices, and what a reported notice does: pure rules, no I/O.

* :func:`watched_cloud`: which cloud's metadata workers watch: ``--notice-watcher``, or with
  ``auto`` the provider's own cloud when it has a notice endpoint (aws, gcp, azure);
* :func:`notice_watcher`: one watcher per host, the first live worker there; when it goes,
  the next worker of that host to ask takes over;
* :func:`host_vacated`: a host's watcher that leaves acknowledges the host's notices (Azure then evicts
  the VM at once) only once every other worker of the host has exited: rank 0 may still be writing the
  last checkpoint on its way out;
* :func:`notice_action`: a notice for a worker's host drains the host, softly for a
  ``rebalance`` or ``maintenance`` notice (no new workers; a drain under
  ``--drain-on-rebalance``, which the job decides) and for real for ``terminate``. A SIGTERM
  the worker itself got (``own``) drains its host too, and the worker stays until the drain
  sends it away, unless the TERM was the driver's own: at the job's end, or to a worker the
  driver no longer wants (any state but connected, waiting, running or draining: the driver
  moves a worker out of these before it stops it).

The control plane (:mod:`cloud_elastic.driver.runtime.control_plane`) applies these to the job
and answers the worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.notices.api import TERMINATE

__all__ = ["NoticeAction", "STAYS_ON_SIGTERM", "WatcherChoice", "host_vacated", "notice_action", "notice_watcher",
           "watched_cloud"]

#: The clouds whose metadata a worker can watch for notices.
WATCHED_CLOUDS = ("aws", "gcp", "azure")
#: A worker that gets SIGTERM in these states stays until its host's drain sends it away (at its next commit,
#: or at once from rendezvous or on its way there: a SIGTERM before its first round); in any other, the TERM
#: is the driver's own.
STAYS_ON_SIGTERM = (WorkerState.CONNECTED, WorkerState.WAITING, WorkerState.RUNNING, WorkerState.DRAINING)


def watched_cloud(setting: str, provider: str) -> str | None:
    """Which metadata notice watcher workers run: ``--notice-watcher``, or with ``auto`` the provider's cloud."""
    if setting == "auto":
        return provider if provider in WATCHED_CLOUDS else None
    return None if setting == "none" else setting


@dataclass(frozen=True)
class WatcherChoice:
    """What a worker is told to watch (``cloud``, None for nothing), and whether it now is its host's
    watcher in place of one that is gone (``takes_over``: the caller records it)."""

    cloud: str | None
    takes_over: bool = False


def notice_watcher(cloud: str | None, worker: WorkerRecord | None, current: WorkerRecord | None) -> WatcherChoice:
    """Whether ``worker`` watches its host's notices, ``current`` being the host's recorded watcher (if any).

    No cloud to watch, or a worker unknown or no longer alive: nothing. A host whose watcher is
    unknown or gone gets ``worker`` as its new one.
    """
    if cloud is None or worker is None or not worker.alive:
        return WatcherChoice(None)
    if current is None or not current.alive:
        return WatcherChoice(cloud, takes_over=True)
    return WatcherChoice(cloud if current is worker else None)


def host_vacated(watcher: WorkerRecord, workers: Iterable[WorkerRecord]) -> bool:
    """Whether every worker of ``watcher``'s host but ``watcher`` itself has exited (or was given up)."""
    host = watcher.slot.host
    return not any(w.alive and w is not watcher and w.slot.host == host for w in workers)


@dataclass(frozen=True)
class NoticeAction:
    """What a reported notice does: ``drain`` the worker's host (``soft``: a recommendation, not a
    termination), and for a worker's own SIGTERM whether it ``stay``\\ s until the drain sends it away."""

    drain: bool
    soft: bool = False
    stay: bool = False


def notice_action(kind: str, *, own: bool, state: WorkerState, job_over: bool) -> NoticeAction:
    """The action for a notice of ``kind`` reported by a live worker in ``state`` (``own``: its own SIGTERM).

    ``job_over``: the job has its outcome (it is stopping every worker).
    """
    if own and (job_over or state not in STAYS_ON_SIGTERM):
        return NoticeAction(drain=False, stay=False)
    return NoticeAction(drain=True, soft=kind != TERMINATE, stay=own)
