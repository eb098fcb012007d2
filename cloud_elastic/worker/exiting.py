"""How a worker lets go of its job: told to leave for good, and as its process exits.

:class:`ExitingMixin` (the worker's context, as :mod:`.link.driver_link` and :mod:`.rounds.groups` are) holds

* :meth:`~ExitingMixin.leave`: the worker is told to exit; it releases its process group now (its peers have
  moved on) and acknowledges the notices it watched once its host is vacated;
* :meth:`~ExitingMixin._at_exit`, the exit hook: every process group let go of, every formation cancelled and
  waited for, and every reclaim, before the interpreter finalizes (a daemon thread inside torch's C++ then aborts
  the process), then the driver told the worker is exiting; should one still run in torch after
  :data:`EXIT_WAIT_S`, the process ends with its exit status after the script's other exit hooks
  (:meth:`~ExitingMixin._end_before_finalizing`, :func:`_end_if_still_in_torch`) rather than finalize under it;
* :meth:`~ExitingMixin._report_script_end`: a script that never entered ``hvd.elastic.run`` (a fixed-size script)
  tells the driver it ended, with the exception it ended with (:meth:`~ExitingMixin._note_uncaught`).

A mixin, not a piece of its own: it lets go of what the context holds (its group, its reaper, its notice watcher).
"""

from __future__ import annotations

import atexit
import gc
import io
import logging
import os
import socket
import sys
import time
from typing import Any

from cloud_elastic.protocol import CompletedReport
from cloud_elastic.protocol_reports import error_line
from cloud_elastic.worker.link.client import DriverClient

__all__ = ["ExitingMixin"]

log = logging.getLogger(__name__)

#: How long the exit hook waits for releases, destructions and cancelled formations to end: a formation given up
#: in a store wait ends within a slice, one blocked in Gloo's connection to a peer that vanished does not end
#: before Gloo's own timeout (see :meth:`ExitingMixin._end_before_finalizing`).
EXIT_WAIT_S = 10.0

#: Most open files flushed before ``os._exit`` (:func:`_flush_files`): one walk of the collector's objects.
MAX_FLUSHED_FILES = 10_000

#: ``(context, what, exit code)``: set by the exit hook when a thread still runs in torch as its time is up.
_ending: tuple[Any, str, int] | None = None


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
            group.settle_abort(timeout_s)  # the heartbeat thread's abort of it, in torch's C++ (rounds.on_device)
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

    def _at_exit(self, timeout_s: float | None = None) -> None:
        """As the process exits, before the interpreter finalizes: let go of every process group now.

        A daemon thread still inside a group's destructor (a release 1 s after a
        round switch, a reclaim after a failure) or a group's formation when the
        interpreter finalizes is ended by the interpreter in the middle of torch's
        C++ code: ``terminate called without an active exception`` and SIGABRT,
        after a job that had succeeded. So the current group is let go on this thread (a Gloo group abandoned
        first: nothing uses it again, and its destructor then cannot wait on a
        peer), pending releases run here, a formation (a plan's, in the background)
        is cancelled, and no other starts (the heartbeats go on through the exit
        hooks, and may bring an offer); reclaims and formations are waited for,
        all within ``timeout_s`` (:data:`EXIT_WAIT_S`). A formation blocked in Gloo's connection to a
        peer that vanished is not ended by anything before Gloo's own timeout: see
        :meth:`_end_before_finalizing`. Heartbeats go on through this and the
        other exit hooks; the interpreter's teardown after the hooks stops them,
        so this hook's last act tells the driver the worker is exiting
        (:meth:`say_exiting`): a slow teardown then ends the job with the
        worker's exit status, not as a silent worker (see docs/architecture.md,
        "At exit").
        """
        timeout_s = EXIT_WAIT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        self._report_script_end()
        self._close_next("the worker exits")
        group, self._group = self._group, None
        if group is not None:
            group.settle_abort(deadline - time.monotonic())  # the heartbeat thread's, in torch's C++ (rounds.on_device)
            if group.backend == "gloo" or group.abandoned:
                self._reaper.retire(group)
            else:
                self._reaper.release(group, after_s=timeout_s)  # run at once by drain below
            del group
        # Formations first: one that ends now (cancelled, failed, or formed after it was dropped) retires its group
        # to the reaper, whose destruction runs in torch's C++; drained before them, that destruction outlived
        # the hook and the interpreter finalized under it (SIGABRT after rank 0 had finished, review s58 rvN F2).
        forming = self._formations_after(deadline)
        drained = self._reaper.drain(max(0.0, deadline - time.monotonic()))
        self.say_exiting()
        if drained and not forming:
            return
        self._end_before_finalizing(f"{len(forming)} process group formation(s)" if forming
                                    else "a process group's destruction", self._exit_report().code)

    def _formations_after(self, deadline: float) -> list[Any]:
        """Wait until ``deadline`` for every thread forming a group to end; those still running."""
        while True:
            forming = [t for t in self._formations if t.is_alive()]  # re-read: the list is replaced, not changed
            if not forming or time.monotonic() >= deadline:
                return forming
            forming[0].join(max(0.0, deadline - time.monotonic()))

    def _in_torch(self) -> bool:
        """Whether a formation or a group's destruction still runs (in torch's C++, the GIL let go)."""
        return any(t.is_alive() for t in self._formations) or self._reaper.busy()

    def _end_before_finalizing(self, what: str, code: int | None) -> None:
        """A thread is still inside torch's C++ (``what``) when the exit hook's time is up: the interpreter
        must not finalize under it (SIGABRT as it takes the GIL back).

        With ``code`` certain, the process ends with it, the exit status the interpreter would have given it
        (``os._exit``), as the last exit hook: the other exit hooks run first, and the process then finalizes
        after all if the thread ended meanwhile (:func:`_end_if_still_in_torch`). ``code`` is certain for a local
        worker whose command is the driver's Python running a script, forked or not (the script's ``SystemExit``
        code, 1 after an exception, 0 when it returned: ``link.driver_link._exit_report``;
        ``driver.launch.local_main``). Without it (a plain interpreter, as over SSH, and a script that seemed to
        end cleanly: a top-level ``SystemExit(3)`` looks the same) the process finalizes as before rather than
        guess, and never turns a failure into 0.
        """
        global _ending
        if code is None:
            log.warning("worker %s: %s still running in torch at exit; the exit status is not known here, so the "
                        "interpreter finalizes (it may abort)", self.worker_id, what)
            return
        log.warning("worker %s: %s still running in torch at exit; the other exit hooks run, then, if it still "
                    "runs, the process exits with status %d without finalizing the interpreter", self.worker_id,
                    what, code)
        _ending = (self, what, code)

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
        error = error_line(f"{type(raised).__name__}: {raised}") if raised is not None else None
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


def _end_if_still_in_torch() -> None:
    """The last exit hook (registered as this module is imported, before the script's own under the local fork
    server, which imports the worker library before it runs the script): when the exit hook left a thread inside
    torch's C++ (:meth:`ExitingMixin._end_before_finalizing`) and it still runs after every other exit hook, the
    process ends with its certain exit status instead of finalizing under it.

    Not ``atexit._run_exitfuncs()`` from the exit hook: it runs every hook still registered, those that already
    ran (registered after ``hvd.init()``) a second time. Open files and log handlers are flushed first: the
    interpreter's finalization, which would have, does not happen."""
    ending = _ending
    if ending is None:
        return
    ctx, what, code = ending
    if not ctx._in_torch():
        log.info("worker %s: %s ended during the exit hooks; the interpreter finalizes", ctx.worker_id, what)
        return
    log.warning("worker %s: %s still running in torch after the exit hooks; exiting with status %d without "
                "finalizing the interpreter (it would abort)", ctx.worker_id, what, code)
    _flush_files()
    logging.shutdown()
    os._exit(code)


def _flush_files() -> None:
    """Flush ``sys.stdout``, ``sys.stderr`` and every open writable file object (at most
    :data:`MAX_FLUSHED_FILES`, text before binary: a text file's flush fills its buffer), as finalization would
    have: a script's metrics file left open keeps what it wrote. Never one over a socket (a peer that does not
    read would block the exit)."""
    files: list[Any] = [f for f in (sys.stdout, sys.stderr) if f is not None]
    seen = {id(f) for f in files}
    for obj in gc.get_objects():
        if isinstance(obj, (io.TextIOBase, io.BufferedIOBase)) and id(obj) not in seen:
            files.append(obj)
            seen.add(id(obj))
            if len(files) >= MAX_FLUSHED_FILES:
                break
    files.sort(key=lambda f: not isinstance(f, io.TextIOBase))
    for f in files:
        try:
            if f.closed or not f.writable() or _over_socket(f):
                continue
            f.flush()
        except Exception:  # closed, detached, replaced by an object of the script's, a full disk: the others still
            pass  # get theirs


def _over_socket(f: Any) -> bool:
    """Whether ``f`` writes to a socket (``socket.makefile``), through its text and buffer layers."""
    for _ in range(4):
        f = getattr(f, "buffer", None) or getattr(f, "raw", None)
        if f is None:
            return False
        if isinstance(f, socket.SocketIO):
            return True
    return False

atexit.register(_end_if_still_in_torch)
