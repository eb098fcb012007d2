"""The driver's lock around its job, and the long-polls that wait under it.

Workers long-poll the driver: a heartbeat (``poll``) is held until the round,
the update generation or the abort round changes, and a ``rendezvous`` request
until the worker has an answer (an assignment or an exit order). With one
condition variable for everything, every change anywhere woke every held
request (8,000 of each in a large group, 20 times a second from the loop's
tick alone) only for most of them to go back to sleep.

:class:`JobCondition` is that one condition variable (the driver's loop and
discovery thread keep waiting on it and notifying it as before), and it also
keeps a condition per kind of wait on the same lock. ``notify_all()`` wakes:

* the heartbeats, only when ``(round, update_gen, abort_round, done)`` changed
  (all of them then: every worker must hear of a new round or an abort);
* a rendezvous request, only when that worker stopped waiting
  (:meth:`~.job.ElasticJob.take_rendezvous_news`), or on a change of round or
  phase (which may concern any of them).

A held request still returns at its own deadline, so a change this misses
costs a worker one poll interval, never a hang.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["JobCondition"]


class JobCondition(threading.Condition):
    """``threading.Condition`` over an RLock, with targeted wake-ups for control-plane long-polls.

    Call :meth:`watch` with the job once; every method below expects the lock
    to be held, like ``wait``.
    """

    def __init__(self) -> None:
        super().__init__(threading.RLock())
        self._job: Any = None
        self._polls = threading.Condition(self._lock)
        self._poll_key: tuple[Any, ...] | None = None
        self._polls_held = 0
        self._rendezvous: dict[str, _Waiting] = {}
        self._rendezvous_key: tuple[Any, ...] | None = None

    def watch(self, job: Any) -> None:
        """Wake waiters on the changes of ``job`` (an :class:`~.job.ElasticJob`)."""
        self._job = job
        self._poll_key = self._poll_state()
        self._rendezvous_key = (job.round, job.phase)

    def notify_all(self) -> None:
        """Wake the threads waiting on this condition, and the long-polls whose answer changed."""
        super().notify_all()
        self.wake()

    notifyAll = notify_all  # noqa: N815 (threading's alias)

    def wake(self) -> None:
        """Wake only the long-polls whose answer changed (not the driver's loop)."""
        job = self._job
        if job is None:
            return
        key = self._poll_state()
        if key != self._poll_key:
            self._poll_key = key
            self._polls.notify_all()
        news = job.take_rendezvous_news()
        if not self._rendezvous:
            return
        key = (job.round, job.phase)
        if key != self._rendezvous_key:
            self._rendezvous_key = key
            news = self._rendezvous  # a new round or phase may concern every waiting worker
        for worker_id in news:
            entry = self._rendezvous.get(worker_id)
            if entry is not None:
                entry.cond.notify_all()

    def held(self) -> tuple[int, set[str]]:
        """(heartbeats held, workers whose rendezvous requests are held) right now."""
        return self._polls_held, set(self._rendezvous)

    def wait_poll(self, timeout: float) -> None:
        """Wait (lock released meanwhile) until the heartbeat state changes, or ``timeout``."""
        self._polls_held += 1
        try:
            self._polls.wait(timeout)
        finally:
            self._polls_held -= 1

    def wait_rendezvous(self, worker_id: str, timeout: float) -> None:
        """Wait (lock released meanwhile) until ``worker_id``'s rendezvous answer may have changed,
        or ``timeout``. The caller rechecks the answer and waits again as needed."""
        entry = self._rendezvous.get(worker_id)
        if entry is None:
            entry = self._rendezvous[worker_id] = _Waiting(threading.Condition(self._lock))
        entry.count += 1
        try:
            entry.cond.wait(timeout)
        finally:
            entry.count -= 1
            # Another request of the same worker (a retry after a broken connection) may still wait.
            if entry.count == 0:
                self._rendezvous.pop(worker_id, None)

    def _poll_state(self) -> tuple[Any, ...]:
        job = self._job
        return (job.round, job.update_gen, job.abort_round, job.outcome is not None)


@dataclass
class _Waiting:
    """The rendezvous requests of one worker held now (normally one)."""

    cond: threading.Condition
    count: int = 0
