"""The discovery poller: calls the provider on its own thread, never under a driver lock.

Horovod deadlocked (#3014) when discovery ran under a lock the rest of the
driver needed; here the provider is called with no lock held and its result
is handed over through a callback, which is the only place the driver lock
is taken.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Union

from cloud_elastic.errors import DiscoveryError, FatalDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery

__all__ = ["DiscoveryPoller", "DiscoveryFailure"]

log = logging.getLogger(__name__)


class DiscoveryFailure:
    """A failed discovery call: one-line ``message``; ``fatal`` if retrying cannot help."""

    def __init__(self, message: str, fatal: bool) -> None:
        self.message = message
        self.fatal = fatal


Result = Union[DiscoveredHosts, DiscoveryFailure]


class DiscoveryPoller:
    """Calls ``discovery.find()`` every ``interval_s`` and reports each result.

    The provider's write paths (:meth:`HostDiscovery.release`,
    :meth:`HostDiscovery.set_capacity`) run on the same thread, so a provider
    never sees two calls at once and the driver's loop never waits on a cloud
    API. A provider with a push source wakes the poller
    (:meth:`HostDiscovery.wake_on_news`, :meth:`wake`): the next find() then
    starts at once instead of at the end of the interval.
    """

    def __init__(self, discovery: HostDiscovery, on_result: Callable[[Result], None], *, interval_s: float) -> None:
        self._discovery = discovery
        self._on_result = on_result
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by close() too, so that a wait ends at once
        self._thread: threading.Thread | None = None
        self._releases: queue.SimpleQueue[tuple[str, str | None]] = queue.SimpleQueue()
        self._capacity: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        #: Seconds the last provider call took (for the discovery latency metric).
        self.last_latency_s = 0.0

    def release(self, host: str, instance: str | None) -> None:
        """Queue ``discovery.release(host, instance)`` for the poller thread; returns at once."""
        self._releases.put((host, instance))

    def set_capacity(self, source: str, hosts: int) -> None:
        """Queue ``discovery.set_capacity(hosts, source=source)`` for the poller thread and wake it; returns at once."""
        self._capacity.put((source, hosts))
        self._wake.set()

    def wake(self) -> None:
        """Start the next find() now rather than at the end of the interval; any thread, never blocks."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="discovery", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout_s: float) -> bool:
        """After :meth:`close`: wait up to ``timeout_s`` for the thread's provider call to end; whether it did
        (only then may another thread call the provider)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def poll_once(self) -> Result:
        """One provider call, its errors translated into a DiscoveryFailure."""
        started = time.monotonic()
        try:
            return self._discovery.find()
        except FatalDiscoveryError as exc:
            return DiscoveryFailure(str(exc), fatal=True)
        except DiscoveryError as exc:
            return DiscoveryFailure(str(exc), fatal=False)
        except Exception as exc:  # a provider bug must not kill the poller; retried like a transient error
            log.exception("discovery provider %s raised an unexpected error", type(self._discovery).__name__)
            return DiscoveryFailure(f"{type(exc).__name__}: {exc}", fatal=False)
        finally:
            self.last_latency_s = time.monotonic() - started

    def _release_queued(self) -> None:
        while True:
            try:
                host, instance = self._releases.get_nowait()
            except queue.Empty:
                return
            try:
                self._discovery.release(host, instance)
                log.info("released drained host %s%s to the cloud", host, f" ({instance})" if instance else "")
            except Exception as exc:  # the instance then waits out the cloud's own timeout; the job goes on
                log.warning("could not release drained host %s: %s", host, exc)

    def _set_capacity_queued(self) -> None:
        while True:
            try:
                source, hosts = self._capacity.get_nowait()
            except queue.Empty:
                return
            try:  # a multi-source provider logs and retries its own failures (see providers.multi)
                self._discovery.set_capacity(hosts, source=source)
            except Exception as exc:  # the job goes on; the group keeps the capacity it had
                log.warning("could not set the desired capacity of host source %r to %d: %s", source, hosts, exc)

    def _ask_for_wakeups(self) -> None:
        try:
            self._discovery.wake_on_news(self.wake)
        except Exception:  # the provider is then polled at the interval only; the job goes on
            log.exception("discovery provider %s could not set up its news receiver", type(self._discovery).__name__)

    def _run(self) -> None:
        self._ask_for_wakeups()
        while not self._stop.is_set():
            self._wake.clear()  # news arriving from here on wakes the wait below
            self._release_queued()
            self._set_capacity_queued()
            result = self.poll_once()
            if isinstance(result, DiscoveryFailure):
                log.warning("host discovery failed: %s", result.message)
            else:
                log.debug("discovered %d ready host(s), %d draining", len(result.ready), len(result.draining))
            if self._stop.is_set():
                return
            self._on_result(result)
            self._release_queued()
            self._wake.wait(self._interval_s)
