"""The discovery poller: calls the provider on its own thread, never under a driver lock.

Horovod deadlocked (#3014) when discovery ran under a lock the rest of the
driver needed; here the provider is called with no lock held and its result
is handed over through a callback, which (with ``meanwhile``, the job's words for
the log lines of a failing streak) is the only place the driver lock is taken.

No call is waited for longer than ``--discovery-timeout``: an SDK's own timeouts bound each socket read, not a
request (a server trickling its answer a byte at a time holds one for ever), so find() runs on a thread of its
own, which the poller stops waiting for. The call then counts as a retryable failure (what the job makes of
one: :mod:`cloud_elastic.driver.job.discovery_edge`). A provider that bounds its calls itself is waited for as
long as it says, if longer (:func:`~cloud_elastic.providers.multi.call_limit_s`): a script given ``-o timeout_s``
above ``--discovery-timeout``, and a multi-source provider, which waits for each source up to its own limit.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import sys
import threading
import time
from typing import Callable, TextIO, Union

from cloud_elastic.errors import DiscoveryError, FatalDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, cancel_find, lets_go
from cloud_elastic.providers.multi import Caller, call_limit_s

__all__ = ["discover", "DiscoveryPoller", "DiscoveryFailure", "FailingStreak", "DISCOVERY_TIMEOUT_S", "MAX_BACKOFF_S",
           "REMIND_EVERY_S"]

log = logging.getLogger(__name__)

#: While discovery fails, the wait between calls doubles from ``--discovery-interval`` up to this: a cloud API
#: that throttles us (``ThrottlingException: Rate exceeded``) is not asked again every second.
MAX_BACKOFF_S = 30.0
#: The longest one find() is waited for (``--discovery-timeout``'s default).
DISCOVERY_TIMEOUT_S = 30.0
#: While discovery fails, a reminder at most this often says for how long (see :class:`FailingStreak`).
REMIND_EVERY_S = 300.0
#: The different errors one failing streak logs as they come; the reminders say the latest after that.
_ERRORS_SAID = 8
_NUMBER = re.compile(r"\d+")
#: How often a first discovery call in progress looks whether the job is stopping (see ``poll_once``).
_STOPPING_CHECK_S = 0.1


class DiscoveryFailure:
    """A failed discovery call: one-line ``message``; ``fatal`` if retrying cannot help."""

    def __init__(self, message: str, fatal: bool, *, timed_out: bool = False) -> None:
        self.message = message
        self.fatal = fatal
        #: No answer within the limit: the call runs on (see :meth:`DiscoveryPoller.poll_once`).
        self.timed_out = timed_out


Result = Union[DiscoveredHosts, DiscoveryFailure]


class FailingStreak:
    """The log lines and the back-off of a run of failed discovery calls.

    One WARNING when calls start failing and one the first time each other error comes (errors that differ only
    in their numbers, a count of seconds or a request id, are one error; at most :data:`_ERRORS_SAID` of them a
    streak), a reminder at most every ``remind_every_s`` (5 minutes) saying for how long and how many calls it
    has failed, with the latest error, and one INFO line when a call works again, saying for how long and how
    many calls it failed: a cloud API failing for an hour logs a handful of lines, not one a second.
    ``meanwhile()`` says what the job does while discovery fails (it trains on with its current hosts); it is
    added to the first line and to each reminder. :meth:`failed` returns the wait before the next call:
    ``interval_s`` doubled per failure, at most ``max_wait_s`` (never below ``interval_s``).
    """

    def __init__(self, interval_s: float, max_wait_s: float = MAX_BACKOFF_S, *,
                 meanwhile: Callable[[], str] = lambda: "", remind_every_s: float = REMIND_EVERY_S) -> None:
        self._interval_s = interval_s
        self._max_wait_s = max(interval_s, max_wait_s)
        self._meanwhile = meanwhile
        self._remind_every_s = remind_every_s
        self.count = 0
        self._since = 0.0
        self._reminded = 0.0
        self._said: set[str] = set()  # the errors logged this streak, their numbers masked

    def failed(self, message: str, now: float) -> float:
        self.count += 1
        shape = _NUMBER.sub("#", message)
        if self.count == 1:
            self._since = self._reminded = now
            self._said = {shape}
            log.warning("host discovery failed: %s; retrying, less often while it fails (up to every %gs)%s",
                        message, self._max_wait_s, self._meanwhile())
        elif shape not in self._said and len(self._said) < _ERRORS_SAID:
            self._said.add(shape)
            log.warning("host discovery failed: %s (%d calls in a row)", message, self.count)
        elif now - self._reminded >= self._remind_every_s:
            self._reminded = now
            log.warning("host discovery has failed for %.0fs (%d calls in a row), the latest: %s%s",
                        now - self._since, self.count, message, self._meanwhile())
        return min(self._max_wait_s, self._interval_s * 2.0 ** min(self.count - 1, 64))

    def succeeded(self, now: float) -> float:
        if self.count:
            log.info("host discovery works again, after failing for %.1fs (%d call(s))", now - self._since,
                     self.count)
            self.count = 0
        return self._interval_s


class DiscoveryPoller:
    """Calls ``discovery.find()`` every ``interval_s`` and reports each result.

    While calls fail, each failure is still reported to the job but they are logged and spaced as
    :class:`FailingStreak` says (``meanwhile``: what the job does meanwhile, for its lines), at most
    ``max_backoff_s`` apart.

    The provider's write paths (:meth:`HostDiscovery.release`,
    :meth:`HostDiscovery.set_capacity`) run on the same thread, so a provider
    never sees two calls at once and the driver's loop never waits on a cloud
    API. A provider with a push source wakes the poller
    (:meth:`HostDiscovery.wake_on_news`, :meth:`wake`): the next find() then
    starts at once instead of at the end of the interval.

    Each find() is waited for at most ``call_timeout_s`` (``--discovery-timeout``), or the provider's own
    limit if longer; see the module docstring.
    """

    def __init__(self, discovery: HostDiscovery, on_result: Callable[[Result], None], *, interval_s: float,
                 max_backoff_s: float = MAX_BACKOFF_S, call_timeout_s: float = DISCOVERY_TIMEOUT_S,
                 meanwhile: Callable[[], str] = lambda: "") -> None:
        self._discovery = discovery
        self._call_timeout_s = call_timeout_s
        #: How long one call is waited for: ``--discovery-timeout``, or the provider's own limit if longer.
        self.limit_s = call_limit_s(discovery, call_timeout_s)
        self._caller: Caller[Result] = Caller(self._call)
        self._on_result = on_result
        self._interval_s = interval_s
        self._streak = FailingStreak(interval_s, max_backoff_s, meanwhile=meanwhile)
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
        self._caller.close()

    def join(self, timeout_s: float) -> bool:
        """After :meth:`close`: wait up to ``timeout_s`` for the provider call under way to end; whether it did
        (only then may another thread call the provider)."""
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return False
        return self._caller.join(max(0.0, deadline - time.monotonic()))

    def poll_once(self, stopping: Callable[[], bool] | None = None, *, timeout_s: float | None = None) -> Result:
        """One provider call, its errors translated into a DiscoveryFailure.

        The call runs on the poller's call thread and is waited for ``timeout_s`` at most (default: the
        provider's limit, see the class docstring); past it, a retryable DiscoveryFailure says so, and the call runs on: the next
        poll_once starts no other but waits for it (see :class:`~cloud_elastic.providers.multi.Caller`).

        With ``stopping`` (the driver's first call, made on its main thread, where Ctrl-C is handled): once
        ``stopping()`` is true the call is abandoned within :data:`_STOPPING_CHECK_S`, cancelled where the
        provider can (:meth:`DiscoveryScript.cancel_find <cloud_elastic.providers.script.DiscoveryScript.cancel_find>`
        kills the script): a slow first call never holds a stopping job up to the call's own timeout.
        """
        limit = self.limit_s if timeout_s is None else max(0.0, min(timeout_s, self.limit_s))
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            result = self._caller.answer(min(left, _STOPPING_CHECK_S) if stopping is not None else left)
            if result is not None:
                return result
            if stopping is not None and stopping():
                cancel_find(self._discovery)
                return DiscoveryFailure("the job is stopping", fatal=False)
            if time.monotonic() >= deadline:
                return DiscoveryFailure(
                    f"the {self._discovery.name or type(self._discovery).__name__} provider gave no answer within "
                    f"{limit:.1f}s (--discovery-timeout {self._call_timeout_s:g}s); no other call starts until "
                    "that one ends", fatal=False, timed_out=True)

    def _call(self) -> Result:
        started = time.monotonic()
        try:
            return self._discovery.find()
        except FatalDiscoveryError as exc:
            return DiscoveryFailure(str(exc), fatal=True)
        except DiscoveryError as exc:
            return DiscoveryFailure(str(exc), fatal=False)
        except Exception as exc:  # a provider bug must not kill the poller; retried like a transient error
            # Its traceback once per failing streak: the streak's own lines count the repeats.
            log.log(logging.DEBUG if self._streak.count else logging.ERROR,
                    "discovery provider %s raised an unexpected error", type(self._discovery).__name__, exc_info=True)
            return DiscoveryFailure(f"{type(exc).__name__}: {exc}", fatal=False)
        finally:
            self.last_latency_s = time.monotonic() - started

    def _release_queued(self) -> None:
        while not self._caller.busy:  # a find() given up on still runs: the provider takes one call at a time
            try:
                host, instance = self._releases.get_nowait()
            except queue.Empty:
                return
            try:
                self._discovery.release(host, instance)
                if lets_go(self._discovery, host):  # -H, a script: they hold nothing (a source of several too)
                    log.info("released drained host %s%s to the cloud", host, f" ({instance})" if instance else "")
            except Exception as exc:  # the instance then waits out the cloud's own timeout; the job goes on
                log.warning("could not release drained host %s: %s", host, exc)

    def _set_capacity_queued(self) -> None:
        while not self._caller.busy:
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

    def failed(self, message: str, now: float) -> float:
        """A failure of a call made through :meth:`poll_once` (the driver's first calls): logged and spaced as the
        poller's own are (see :class:`FailingStreak`); the wait before the next call."""
        return self._streak.failed(message, now)

    def _run(self) -> None:
        self._ask_for_wakeups()
        while not self._stop.is_set():
            self._wake.clear()  # news arriving from here on wakes the wait below
            self._release_queued()
            self._set_capacity_queued()
            try:
                result = self.poll_once()
            except Exception as exc:  # a fault of the poller's own must not end discovery for the rest of the job
                log.log(logging.DEBUG if self._streak.count else logging.ERROR, "the discovery poller failed",
                        exc_info=True)
                result = DiscoveryFailure(f"the discovery poller failed: {type(exc).__name__}: {exc}", fatal=False)
            if self._stop.is_set():
                return  # a call the stop cut short (a script killed) is no failure to log after the job's end
            if isinstance(result, DiscoveryFailure):
                wait_s = self._streak.failed(result.message, time.monotonic())
            else:
                wait_s = self._streak.succeeded(time.monotonic())
                log.debug("discovered %d ready host(s), %d draining", len(result.ready), len(result.draining))
            self._on_result(result)
            self._release_queued()
            self._wake.wait(wait_s)


def discover(discovery: HostDiscovery, *, as_json: bool, out: TextIO, err: TextIO | None = None,
             timeout_s: float | None = None) -> int:
    """``cloud-elastic discover``: run one discovery and print it as a table or JSON; close the provider.

    Returns 0 on success and 1 when discovery fails or gives no answer within ``timeout_s`` (default: the
    driver's, 30 s), after printing the one-line reason
    (``cloud-elastic discover: error: ...``) to ``err`` (standard error by default).
    """
    # The driver's poller, so that the call is bounded and its errors told exactly as the driver's first poll.
    from cloud_elastic.providers.inspect import snapshot_json, write_table

    poller = DiscoveryPoller(discovery, lambda _result: None, interval_s=1.0,
                             **({} if timeout_s is None else {"call_timeout_s": timeout_s}))
    try:
        snapshot = poller.poll_once()
    finally:
        poller.close()
        discovery.close()
    if isinstance(snapshot, DiscoveryFailure):
        print(f"cloud-elastic discover: error: {snapshot.message}", file=err or sys.stderr)
        return 1
    if as_json:
        json.dump(snapshot_json(discovery.name, snapshot), out, indent=2)
        out.write("\n")
    else:
        write_table(snapshot, out)
    return 0
