"""Workers whose SSH connection dropped while they ran, with their driver alive: stopped through a fresh one.

The remote wrapper reads end of file on its stdin as its driver gone (``ssh_remote``'s watchdog): the worker trains
on for ``--driver-grace``, so that a restarted driver can adopt it. A connection killed on the host's side (its
sshd restarted, the session's process killed, a NAT entry expired) reads the same, though this driver lives and has
given the worker up (an SSH failure, "connection lost"): a review saw such a plain command run 75 s past its job's
end, and an old worker run beside its replacement on the same slot (on a GPU host, it holds the slot's memory).
So the launcher reaches the wrapper again (``SSHLauncher.attach``, as a restarted driver does) and orders ``KILL``
once the new connection has reached the wrapper, within :data:`CONNECT_WAIT_S` (a connection that fails on its
way, ssh's ConnectTimeout passed on a loaded machine, is tried again meanwhile); ``close()`` waits for those under
way, up to :data:`CLOSE_WAIT_S`. A wrapper already gone answers so, and nothing more happens. Best effort: a host
that cannot be reached again keeps the wrapper's own bound (the grace).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable

from cloud_elastic.errors import LaunchError

__all__ = ["Orphans", "left_running", "CONNECT_WAIT_S", "CLOSE_WAIT_S"]

logger = logging.getLogger(__name__)

#: How long a fresh connection gets to reach the wrapper before its KILL order is given up.
CONNECT_WAIT_S = 30.0
#: How long the launcher's close waits for the KILL orders under way: as long as their connections may take, since
#: the close then hangs up every session it still has, one still connecting included (its KILL is never written,
#: and the worker runs on for the grace). A connection that fails ends its wait sooner (ssh's ConnectTimeout).
CLOSE_WAIT_S = CONNECT_WAIT_S
#: The pause before a failed connection to stop an orphan is tried again.
RETRY_S = 1.0


def left_running(proc: Any) -> bool:
    """``proc`` (an ``SSHWorkerProcess``) ended on a lost connection, after its wrapper said the worker ran, and not
    on an order of this driver's: its wrapper keeps the worker for the driver's grace."""
    status = proc.poll()
    return bool(status is not None and status.transport_error and "connection lost" in status.transport_error
                and proc._started and not proc._stopping)


class Orphans:
    """The KILL orders sent through fresh connections (see the module docstring); ``attach`` is the launcher's."""

    def __init__(self, attach: Callable[..., Any]) -> None:
        self._attach = attach
        self._threads: list[threading.Thread] = []
        #: Held while :meth:`stop` reaches workers again, so that :meth:`wait` sees every order it starts: the
        #: keepalive thread found a dropped connection while the launcher closed, its new connection not yet among
        #: the orders, and the close hung that connection up before its KILL (the worker ran on for the grace).
        self._stopping = threading.RLock()  # stop() reaches attach(), whose _track() may call stop() again

    def stop(self, ended: Iterable[Any]) -> None:
        """Of the workers whose ssh ended, reach those :func:`left_running` again and KILL them; never blocks on
        the orders themselves."""
        with self._stopping:
            self._stop(ended)

    def _stop(self, ended: Iterable[Any]) -> None:
        for proc in ended:
            if not left_running(proc):
                continue
            nonce = str(proc.handle()["nonce"])
            try:
                again = self._attach(proc.spec, nonce, lambda line: None)
            except LaunchError as exc:
                logger.warning("worker %s on %s: its connection dropped and it cannot be reached again to stop it "
                               "(%s): its host stops it after the driver's grace", proc.spec.worker_id,
                               proc.spec.host, exc)
                continue
            logger.info("worker %s on %s: its connection dropped while it ran; stopping it through a new one",
                        proc.spec.worker_id, proc.spec.host)
            def reattach(spec: Any = proc.spec, nonce: str = nonce) -> Any:
                return self._attach(spec, nonce, lambda line: None)

            thread = threading.Thread(target=_kill_once_connected, args=(again, reattach), daemon=True,
                                      name=f"ssh-orphan-{proc.spec.worker_id}")
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def wait(self, bound_s: float = CLOSE_WAIT_S) -> None:
        """Wait for the orders under way (those a :meth:`stop` running now starts too), up to ``bound_s`` in all."""
        end = time.monotonic() + bound_s
        if self._stopping.acquire(timeout=bound_s):
            self._stopping.release()
        for thread in list(self._threads):
            thread.join(timeout=max(0.0, end - time.monotonic()))


def _kill_once_connected(again: Any, reattach: Callable[[], Any]) -> None:
    # Once the new connection reached the wrapper (its STARTED line: ``_started``), not once the local ssh runs: a
    # KILL written before that waits in ssh's stdin while the connection sets up, and ``kill`` ends the client after
    # the launcher's ``kill_wait_s`` (1 s), before the order arrived; on a loaded machine a connection took over
    # 15 s, and the worker ran on for the grace. A connection that failed before reaching the wrapper (ssh's own
    # error: its ConnectTimeout passed on a loaded machine, a refused connection while the host's sshd restarts) is
    # tried again until CONNECT_WAIT_S: one failed try left the worker to its grace. A wrapper that answered that
    # its worker is gone ended the connection without a transport error: nothing more to do.
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        while not again._started and again.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        status = again.poll()
        if again._started or status is None or not status.transport_error or time.monotonic() + RETRY_S >= deadline:
            break
        logger.info("worker %s on %s: the connection to stop it failed (%s); trying again", again.spec.worker_id,
                    again.spec.host, status.transport_error)
        time.sleep(RETRY_S)
        try:
            again = reattach()
        except LaunchError:  # the launcher closed meanwhile: the wrapper's grace bounds the worker
            return
    again.kill()  # before its ssh runs, this cancels the set-up instead: nothing reached, nothing to stop
    while again.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
