"""The driver's lock around its job, and the long-polls held under it.

Workers long-poll the driver: a heartbeat (``poll``) is held until the round,
the update generation or the abort round changes, and a ``rendezvous`` request
until the worker has an answer (an assignment or an exit order). In a large
group thousands of each are held at once, and the job changes many times a
second (the loop alone ticks 20 times a second): waking every held request at
every change would cost far more than the answers.

:class:`JobCondition` is the driver's one condition variable (its loop and
discovery thread wait on it and notify it). Held requests do not wait on it:
they are :class:`~cloud_elastic.driver.net.control_server.Held` replies, kept by
the control-plane server with no thread, and ``notify_all()`` (or :meth:`wake`)
answers only those whose answer changed:

* the heartbeats, only when ``(round, update_gen, abort_round, done)`` changed
  (all of them then: every worker must hear of a new round or an abort);
* a rendezvous request, only when that worker stopped waiting
  (:meth:`~cloud_elastic.driver.job.elastic_job.ElasticJob.take_rendezvous_news`), or on a change of round or
  phase (which may concern any of them).

A held request is still answered at its own deadline, so a change this misses
costs a worker one poll interval, never a hang.

A check may itself change the job and call ``notify_all()`` (a restarted
driver's held ``completed`` report is handled by its check once adoption ends).
That call does not recurse into :meth:`wake`: it asks the running wake for one
more pass, and a held request is taken off its list while its own check runs,
so no check is ever asked again from inside itself (which would recurse without
end).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from cloud_elastic.driver.net.control_server import Held

__all__ = ["JobCondition", "Check"]

#: ``check(final) -> reply``: the reply if it is ready (always when ``final``: the deadline came), else None.
Check = Callable[[bool], Optional[dict[str, Any]]]

#: Passes one :meth:`JobCondition.wake` makes at most when checks keep notifying; what is left is answered
#: at the next notify or its own deadline.
MAX_WAKE_PASSES = 16


class JobCondition(threading.Condition):
    """``threading.Condition`` over an RLock, holding control-plane long-polls until their news.

    Call :meth:`watch` with the job once. :meth:`hold_poll`,
    :meth:`hold_rendezvous`, :meth:`wake` and :meth:`held` expect the lock to
    be held, like ``wait``; a check runs under the lock too.
    """

    def __init__(self) -> None:
        super().__init__(threading.RLock())
        self._job: Any = None
        self._poll_key: tuple[Any, ...] | None = None
        self._polls: dict[Held, Check] = {}
        self._rendezvous: dict[str, dict[Held, Check]] = {}
        self._rendezvous_key: tuple[Any, ...] | None = None
        self._others: dict[Held, Check] = {}
        self._waking = False
        self._wake_again = False

    def watch(self, job: Any) -> None:
        """Answer held requests on the changes of ``job`` (an :class:`~cloud_elastic.driver.job.elastic_job.ElasticJob`)."""
        self._job = job
        self._poll_key = self._poll_state()
        self._rendezvous_key = (job.round, job.phase, self._plans_version())

    def notify_all(self) -> None:
        """Wake the threads waiting on this condition, and answer the held requests whose answer changed."""
        super().notify_all()
        self.wake()

    notifyAll = notify_all  # noqa: N815 (threading's alias)

    def wake(self) -> None:
        """Answer only the held requests whose answer changed (the driver's loop is not woken).

        Called again from inside a check (which changed the job), it only asks this wake for
        another pass (see the module docstring).
        """
        if self._job is None:
            return
        if self._waking:
            self._wake_again = True
            return
        self._waking = True
        try:
            for _ in range(MAX_WAKE_PASSES):
                self._wake_again = False
                self._wake_once()
                if not self._wake_again:
                    break
        finally:
            self._waking = False
            self._wake_again = False

    def _wake_once(self) -> None:
        job = self._job
        for held, check in list(self._others.items()):  # few, and rare (see hold)
            self._try(self._others, held, check)
        key = self._poll_state()
        if key != self._poll_key:
            self._poll_key = key
            for held, check in list(self._polls.items()):
                self._try(self._polls, held, check)
        news = job.take_rendezvous_news()
        if not self._rendezvous:
            return
        key = (job.round, job.phase, self._plans_version())  # a plan answers its newcomers at once
        if key != self._rendezvous_key:
            self._rendezvous_key = key
            news = list(self._rendezvous)  # a new round or phase may concern every waiting worker
        for worker_id in news:
            holds = self._rendezvous.get(worker_id)
            for held, check in list(holds.items()) if holds else ():
                self._try(holds, held, check)
            if holds is not None and not holds:
                del self._rendezvous[worker_id]

    def hold_poll(self, check: Check, timeout_s: float) -> Held:
        """A heartbeat held until the heartbeat state changes and ``check`` answers, or ``timeout_s``."""
        held = Held(timeout_s, lambda: self._final(self._polls, held, check))
        self._polls[held] = check
        return held

    def hold_rendezvous(self, worker_id: str, check: Check, timeout_s: float) -> Held:
        """A rendezvous request held until ``worker_id``'s answer may have changed and ``check``
        answers, or ``timeout_s``."""
        holds = self._rendezvous.setdefault(worker_id, {})

        def final() -> dict[str, Any]:
            reply = self._final(holds, held, check)
            if not holds and self._rendezvous.get(worker_id) is holds:
                del self._rendezvous[worker_id]
            return reply

        held = Held(timeout_s, final)
        holds[held] = check
        return held

    def hold(self, check: Check, timeout_s: float) -> Held:
        """A request held until ``check`` answers, asked again at every ``notify_all()``: for rare
        waits on driver state other than the job's (the server has one thread: nothing may block it)."""
        held = Held(timeout_s, lambda: self._final(self._others, held, check))
        self._others[held] = check
        return held

    def held(self) -> tuple[int, set[str]]:
        """(heartbeats held, workers whose rendezvous requests are held) right now."""
        return len(self._polls), {w for w, holds in self._rendezvous.items() if holds}

    def drop(self, held: Held) -> None:
        """Forget ``held`` unanswered: a hold made by a check, never given to the server to answer."""
        self._others.pop(held, None)

    def _try(self, holds: dict[Held, Check], held: Held, check: Check) -> None:
        if holds.pop(held, None) is None:
            return  # answered meanwhile (by a check that ran before it in this pass)
        reply = check(False)
        if reply is None:
            holds[held] = check
        else:
            held.finish(reply)

    def _final(self, holds: dict[Held, Check], held: Held, check: Check) -> dict[str, Any]:
        with self:
            holds.pop(held, None)
            reply = check(True)
        if reply is None:
            raise RuntimeError("a long-poll check gave no reply at its deadline")
        return reply

    def _poll_state(self) -> tuple[Any, ...]:
        job = self._job
        return (job.round, job.update_gen, job.abort_round, job.outcome is not None, self._plans_version())

    def _plans_version(self) -> int:
        """Changes whenever the planned next round's offers change (see ``driver.job.next_round``)."""
        plans = getattr(getattr(self._job, "rounds", None), "next", None)
        return getattr(plans, "version", 0)
