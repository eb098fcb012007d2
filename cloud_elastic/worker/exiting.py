"""How a worker lets go of its job: told to leave for good, and as its process exits.

:class:`ExitingMixin` (the worker's context, as :mod:`.link.driver_link` and :mod:`.rounds.groups` are) holds

* :meth:`~ExitingMixin.leave`: the worker is told to exit; it releases its process group now (its peers have
  moved on) and acknowledges the notices it watched once its host is vacated;
* :meth:`~ExitingMixin._at_exit`, the exit hook: every process group let go of, every formation cancelled and
  waited for, and every reclaim, before the interpreter finalizes (a daemon thread inside torch's C++ then aborts
  the process), then the driver told the worker is exiting; should one still run in torch, the process ends
  there with its exit status (:meth:`~ExitingMixin._end_before_finalizing`) rather than finalize under it;
* :meth:`~ExitingMixin._report_script_end`: a script that never entered ``hvd.elastic.run`` (a fixed-size script)
  tells the driver it ended, with the exception it ended with (:meth:`~ExitingMixin._note_uncaught`).

A mixin, not a piece of its own: it lets go of what the context holds (its group, its reaper, its notice watcher).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from cloud_elastic.protocol import CompletedReport
from cloud_elastic.worker.link.client import DriverClient

__all__ = ["ExitingMixin"]

log = logging.getLogger(__name__)

#: How long the exit hook waits for cancelled formations to end: one given up in a store wait ends within a
#: slice; one blocked in Gloo's connection to a peer that vanished does not end before Gloo's own timeout.
FORMATION_EXIT_WAIT_S = 2.0


class ExitingMixin:
    """The worker context's way out: :meth:`leave` and the exit hook (see module docstring)."""

    def leave(self, timeout_s: float = 5.0) -> None:
        """This worker leaves the job for good (told to exit).

        Releases its process group now (its peers have moved on to a new group): left to
        the interpreter's shutdown, destroying a Gloo group blocked the exit until the
        driver killed the worker. Then acknowledges the notices it watched, once the
        driver says every other worker of its host has exited (Azure evicts the VM at
        the acknowledgement, and rank 0 may still be writing the last checkpoint), or
        at their deadline. Its heartbeats go on until the process ends.
        """
        self._close_next("the worker leaves")
        group, self._group = self._group, None
        if group is not None:
            done = self._reaper.reclaimed + self._reaper.leaked
            self._reaper.retire(group)
            del group
            deadline = time.monotonic() + timeout_s
            while self._reaper.reclaimed + self._reaper.leaked == done and time.monotonic() < deadline:
                time.sleep(0.02)
        if self._notice_watcher is not None:
            try:
                self._notice_watcher.acknowledge(until=lambda: self.host_vacated)
            finally:
                self._notice_watcher.close()
                self._notice_watcher = None

    def _at_exit(self, timeout_s: float = 10.0) -> None:
        """As the process exits, before the interpreter finalizes: let go of every process group now.

        A daemon thread still inside a group's destructor (a release 1 s after a
        round switch, a reclaim after a failure) or a group's formation when the
        interpreter finalizes is ended by the interpreter in the middle of torch's
        C++ code: ``terminate called without an active exception`` and SIGABRT,
        after a job that had succeeded. So the current group is let go on this thread (a Gloo group abandoned
        first: nothing uses it again, and its destructor then cannot wait on a
        peer), pending releases run here, and reclaims are waited for within
        ``timeout_s``. A formation (a plan's, in the background) is cancelled, and
        no other starts (the heartbeats go on through the exit hooks, and may
        bring an offer): it ends within :data:`FORMATION_EXIT_WAIT_S`, unless it
        is blocked in Gloo's connection to a peer that vanished, which nothing
        ends before Gloo's own timeout; the process then does not finalize
        (:meth:`_end_before_finalizing`). Heartbeats go on through this and the
        other exit hooks; the interpreter's teardown after the hooks stops them,
        so this hook's last act tells the driver the worker is exiting
        (:meth:`say_exiting`): a slow teardown then ends the job with the
        worker's exit status, not as a silent worker (see docs/architecture.md,
        "At exit").
        """
        deadline = time.monotonic() + timeout_s
        self._report_script_end()
        self._close_next("the worker exits")
        group, self._group = self._group, None
        if group is not None:
            if group.backend == "gloo" or group.abandoned:
                self._reaper.retire(group)
            else:
                self._reaper.release(group, after_s=timeout_s)  # run at once by drain below
            del group
        drained = self._reaper.drain(max(0.0, deadline - time.monotonic()))
        forming = self._formations_after(min(deadline, time.monotonic() + FORMATION_EXIT_WAIT_S))
        code = None if drained and not forming else self._exit_report().code
        if forming and code is None:  # the process will finalize: give the formation all the time there is
            forming = self._formations_after(deadline)
        if drained and not forming:
            self.say_exiting()
            return
        self.say_exiting()
        self._end_before_finalizing(f"{len(forming)} process group formation(s)" if forming
                                    else "a process group's destruction", code)

    def _formations_after(self, deadline: float) -> list[Any]:
        """Wait until ``deadline`` for every thread forming a group to end; those still running."""
        while True:
            forming = [t for t in self._formations if t.is_alive()]  # re-read: the list is replaced, not changed
            if not forming or time.monotonic() >= deadline:
                return forming
            forming[0].join(max(0.0, deadline - time.monotonic()))

    def _end_before_finalizing(self, what: str, code: int | None) -> None:
        """A thread is still inside torch's C++ (``what``): end the process now with ``code``, the exit status
        the interpreter would have given it, instead of finalizing under that thread (SIGABRT as it takes the
        GIL back). Streams and log handlers are flushed first; the exit hooks registered before this one (at
        ``hvd.init()``), which the interpreter would run after it, do not run.

        ``code`` must be certain: under the local fork server it is (the script's ``SystemExit`` code, 1 after
        an exception, 0 when it returned: ``link.driver_link._exit_report``). Without it (a plain interpreter,
        a script that seemed to end cleanly: a top-level ``SystemExit(3)`` looks the same) the process
        finalizes as before rather than guess, and never turns a failure into 0.
        """
        if code is None:
            log.warning("worker %s: %s still running in torch at exit; the exit status is not known here, so the "
                        "interpreter finalizes (it may abort)", self.worker_id, what)
            return
        log.warning("worker %s: %s still running in torch at exit; exiting with status %d without finalizing the "
                    "interpreter (it would abort)", self.worker_id, what, code)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # closed or replaced by the script
                pass
        logging.shutdown()
        os._exit(code)

    def _report_script_end(self) -> None:
        """At exit, a script that never entered ``hvd.elastic.run`` tells the driver it ended (a fixed-size
        script: the driver then judges the job by every worker's exit status; see ``driver.fixed``).

        Sent before the exit status exists, with the exception the script ended with, if any
        (seen by ``sys.excepthook`` before the exit hooks run). Not sent by a
        worker that never joined a round or was sent away. One try, a few seconds at most.
        """
        if (self._codec is None or self.elastic_entered or self.info is None or self.dismissed
                or self.sent_away is not None or self.driver_lost):
            return
        raised = self._uncaught or getattr(sys, "last_value", None)
        error = f"{type(raised).__name__}: {raised}"[:300] if raised is not None else None
        report = CompletedReport(self.info.round, self.ledger.live_commit_seq, self.progress.steps, error,
                                 elastic=False).to_wire()
        try:
            DriverClient(self.settings.driver_address, self._codec, self.worker_id).call(
                "completed", report, timeout_s=min(5.0, self.heartbeat_timeout_s))
        except Exception as exc:  # the driver may be gone: it then judges the exit status alone
            log.debug("worker %s: could not tell the driver its script ended: %s", self.worker_id, exc)

    def _note_uncaught(self) -> None:
        """Keep the exception that ends the script, for :meth:`_report_script_end`: ``sys.excepthook`` sees it
        both under the interpreter and under the local launcher's fork server (which calls the hook itself)."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
            self._uncaught = value
            previous(kind, value, tb)

        sys.excepthook = hook
