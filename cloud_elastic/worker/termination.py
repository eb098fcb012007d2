"""SIGTERM inside ``hvd.elastic.run`` or before the first round: a request to leave, not a death mid-step.

Kubernetes ends a pod with SIGTERM, then SIGKILL once its grace period is over;
so do a node drain, a spot reclaim that the node's graceful shutdown handles, and
``systemctl stop``. The driver usually learns of the pod's deletion itself (the
kubernetes provider drains the host), but where its watch missed it (the API was
unreachable, RBAC) the SIGTERM inside the pod is the only word that the host is
going. A worker that died of it would die mid-step, and its peers would roll back.

So, while a worker is inside ``elastic.run``, and from its registration until it has
joined its first round (``hvd.init``, :func:`leave_at_commit_on_sigterm` both times):

* the **first** SIGTERM puts SIGTERM's default action back at once, so that a
  second one ends the worker at once, and hands the signal to a thread of its own
  (the training thread does not wait for it), which reports it to the driver as
  a notice for this worker's host, by the control-plane message a host's notice
  watcher sends (source ``sigterm``, kind ``terminate``), with the deadline
  ``CLOUD_ELASTIC_TERM_GRACE_S`` ahead (default 30 s, the kubelet's default grace:
  set it to the pod's ``terminationGracePeriodSeconds``);
* the driver answers whether it keeps the worker until it leaves: yes for a worker
  in a round, waiting for one or on its way there, in a job that goes on. The host
  then drains as for a spot notice: the worker leaves at its next commit (at once
  from rendezvous: before its first round, ``hvd.init`` exits 0), and neither it
  nor its peers count a failure, blacklist or roll back;
* the driver answers no when the SIGTERM is its own (it stops workers it no longer
  wants, or all of them at the end of the job, with TERM then KILL), and a worker
  that cannot reach its driver gets no answer: the worker then dies of the signal
  (it is raised again with the default action), exactly as it did before this
  module existed.

Left alone: a script that handles SIGTERM itself (its handler stays, ours is not
installed), ``elastic.run`` outside the main thread (Python's signal handlers run
there only), a worker run without a driver, and every process the worker forks
(a forked child gets SIGTERM's default action back as it starts: it dies of SIGTERM as by default). Before
the worker registers, between its first round and ``elastic.run`` (for a worker that joins a
running job, or any worker of a job with ``--spares``: from ``init()`` to its first call that needs the
round, and then to ``elastic.run``), after
``elastic.run`` returned, and in a fixed-size script once it has joined its round,
SIGTERM keeps its default action. Once one SIGTERM was reported, no handler is
installed again in the process: the next SIGTERM ends it at once.

Limits: Python runs a signal's handler on the main thread between bytecodes, so a
SIGTERM that arrives inside one long native call is acted on when that call
returns (the collectives wait in 0.1 s slices). A second SIGTERM needs no Python:
its action is the default one again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

__all__ = ["REASON", "SOURCE", "TermHandler", "leave_at_commit_on_sigterm"]

log = logging.getLogger(__name__)

#: A handler of this process took a SIGTERM: none is installed again, so that the next one ends the process.
_taken = False
#: The handler installed in this process, if any: a forked child gets SIGTERM's default action back at once.
_current: "TermHandler | None" = None


def _default_in_child() -> None:
    """``os.fork``'s child hook: a child that inherited our handler gets SIGTERM's default action back.

    In the kernel, before the child runs any Python: left to Python's handler, a SIGTERM that reached the
    child between its last check for signals and a blocking call (``time.sleep``, a read) waited for that
    call to return (60 s in a test under load) before the handler could end it.
    """
    handler = _current
    if handler is not None and signal.getsignal(signal.SIGTERM) == handler._on_term:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the main thread (a C fork Python did not set up): the handler's own check stays
            pass


os.register_at_fork(after_in_child=_default_in_child)

#: The notice's source, as the driver logs and records it (the ``notice`` event's ``source``).
SOURCE = "sigterm"
#: The notice's reason (with the worker's id added), as the driver logs it.
REASON = "SIGTERM to worker {worker} (a pod deletion or node drain)"


class TermHandler:
    """SIGTERM's handler while a worker is in ``elastic.run`` (see module docstring).

    ``ask(deadline)`` reports the SIGTERM to the driver with a deadline in Unix
    seconds and returns True when the driver keeps the worker until it leaves at
    its next commit; any exception, or False, makes the worker die of the signal.
    It runs on the handler's own thread, never in the signal handler itself.

    Constructing it changes nothing; :meth:`install` takes SIGTERM (main thread,
    default action only), :meth:`uninstall` gives it back.
    """

    def __init__(self, ask: Callable[[float], bool], grace_s: float, *, label: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        self._ask = ask
        self._grace_s = grace_s
        self._label = label
        self._clock = clock
        self._pid = os.getpid()
        self._signalled = threading.Event()
        self._closed = False
        self._deadline = 0.0
        self._installed = False
        self._thread: threading.Thread | None = None
        #: What the driver answered (True: leave at the next commit); None until it has.
        self.stays: bool | None = None

    def install(self) -> bool:
        """Take SIGTERM; False (nothing changed) off the main thread or where the script handles it itself."""
        if threading.current_thread() is not threading.main_thread() or _taken:
            return False
        current = signal.getsignal(signal.SIGTERM)
        if current is not signal.SIG_DFL:
            log.info("worker %s: the script handles SIGTERM itself: a SIGTERM is not turned into a leave at the "
                     "next commit", self._label)
            return False
        # Started here, not in the handler: a handler runs between any two bytecodes of the main thread,
        # which may then hold a lock that starting a thread needs.
        self._thread = threading.Thread(target=self._wait, name="cloud-elastic-sigterm", daemon=True)
        self._thread.start()
        global _current
        _current = self
        signal.signal(signal.SIGTERM, self._on_term)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Give SIGTERM its default action back (if it is still ours) and end the handler's thread."""
        if self._installed and signal.getsignal(signal.SIGTERM) == self._on_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._installed = False
        if not self._signalled.is_set():
            self._closed = True
            self._signalled.set()

    def _on_term(self, signum: int, frame: Any) -> None:
        # No locks here but the event's own, no logging, no I/O: this interrupts the main thread anywhere.
        global _taken
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM: the default action, at once
        if os.getpid() != self._pid or self._signalled.is_set():
            _die()  # a forked child that inherited the handler, or a stale call: the default action
        _taken = True
        self._deadline = self._clock() + self._grace_s
        self._signalled.set()

    def _wait(self) -> None:
        # Not this thread: the kernel gives a process's signal to any thread that does not block it, and Python
        # runs the handler on the main thread only when that thread next runs Python; one blocked in a read
        # would then leave the SIGTERM unanswered (the driver's notice of it late by as long).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        self._signalled.wait()
        if self._closed:
            return
        try:
            self.stays = bool(self._ask(self._deadline))
        except Exception as exc:  # noqa: BLE001 - no answer is an answer: die as by default
            log.warning("worker %s: could not report its SIGTERM to the driver: %s", self._label, exc)
            self.stays = False
        if not self.stays:
            _die()
        print(f"cloud-elastic: worker {self._label}: SIGTERM: leaving at the next commit "
              f"(deadline in {self._deadline - self._clock():.0f}s; a second SIGTERM ends it at once)",
              file=sys.stderr, flush=True)


def _die() -> None:
    """End this process by SIGTERM with its default action, as if no handler had been installed (status -15)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream must not keep the process alive
            pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the signal is delivered meanwhile; past this, something else took SIGTERM
    os._exit(128 + signal.SIGTERM)


@contextlib.contextmanager
def leave_at_commit_on_sigterm(ctx: Any) -> Iterator[TermHandler | None]:
    """While inside: SIGTERM asks the driver to let this worker leave at its next commit, or at once from
    rendezvous (module docstring).

    ``ctx`` is the worker's context; nothing is installed for a worker without a driver.
    """
    if ctx.standalone:
        yield None
        return
    handler = TermHandler(ctx.report_sigterm, ctx.settings.term_grace_s, label=ctx.worker_id)
    if not handler.install():
        yield None
        return
    try:
        yield handler
    finally:
        handler.uninstall()
