"""The discovery poller: a provider with a push source gets its next find() at once, not at the interval; a
failing one is asked less often, and logged in a few lines."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Mapping

import pytest

from cloud_elastic.driver.runtime.discovery import MAX_BACKOFF_S, DiscoveryFailure, DiscoveryPoller, FailingStreak
from cloud_elastic.errors import RetryableDiscoveryError
from cloud_elastic.providers.addressmap import AddressMappedDiscovery, parse_address_map
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.providers.multi import MultiSourceDiscovery
from cloud_elastic.providers.sources import SourceSpec

pytestmark = pytest.mark.timeout(20)


class PushProvider(HostDiscovery):
    """Answers one snapshot; keeps the wake callback the poller hands it."""

    name = "push"

    def __init__(self) -> None:
        self.wake: Callable[[], None] | None = None
        self.asked = threading.Event()

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "PushProvider":
        return cls()

    def find(self) -> DiscoveredHosts:
        return DiscoveredHosts(ready={"a": 1})

    def wake_on_news(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.asked.set()


def test_news_from_the_provider_starts_the_next_find_at_once() -> None:
    provider = PushProvider()
    results: queue.SimpleQueue = queue.SimpleQueue()
    poller = DiscoveryPoller(provider, results.put, interval_s=3600)
    poller.start()
    try:
        assert provider.asked.wait(5) and provider.wake is not None
        results.get(timeout=5)  # the first find, at once
        assert results.empty()
        provider.wake()  # e.g. a notice arrived in the queue: an hour early
        assert results.get(timeout=5) == DiscoveredHosts(ready={"a": 1})
    finally:
        poller.close()


def test_close_ends_the_wait_between_finds_at_once() -> None:
    provider = PushProvider()
    results: queue.SimpleQueue = queue.SimpleQueue()
    poller = DiscoveryPoller(provider, results.put, interval_s=3600)
    poller.start()
    results.get(timeout=5)
    poller.close()
    poller._thread.join(5)
    assert not poller._thread.is_alive()


class Throttled(HostDiscovery):
    """Fails ``failures`` times as a throttled cloud API does, then answers."""

    name = "throttled"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "Throttled":
        return cls(0)

    def find(self) -> DiscoveredHosts:
        self.calls += 1
        if self.calls <= self.failures:
            raise RetryableDiscoveryError("ThrottlingException: Rate exceeded")
        return DiscoveredHosts(ready={"a": 1})


class RecordedWaits:
    """Stands in for the poller's wake event: records each wait between finds and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return False

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass


def _poll_until_an_answer(provider: HostDiscovery, **kwargs) -> tuple[list, list[float]]:
    results: list = []
    poller = DiscoveryPoller(provider, results.append, **kwargs)
    poller._wake = RecordedWaits()

    def on_result(result) -> None:
        results.append(result)
        if isinstance(result, DiscoveredHosts):
            poller.close()

    poller._on_result = on_result
    poller._run()  # on this thread: the waits are recorded, not slept
    return results, poller._wake.waits


def test_a_failing_discovery_logs_a_few_lines_backs_off_and_reports_every_failure_to_the_job(caplog) -> None:
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.runtime.discovery")
    results, waits = _poll_until_an_answer(Throttled(120), interval_s=1.0)
    assert [isinstance(r, DiscoveryFailure) for r in results] == [True] * 120 + [False]  # the job sees each one
    assert waits[:7] == [1, 2, 4, 8, 16, 30, 30] and max(waits) == MAX_BACKOFF_S == 30
    assert waits[-1] == 1.0  # back to the interval once it works
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines  # not 120: a reminder comes every 5 minutes at most
    assert lines[0][0] == "WARNING" and "ThrottlingException: Rate exceeded" in lines[0][1]
    assert lines[1][0] == "INFO" and "works again" in lines[1][1] and "(120 call(s))" in lines[1][1]


def test_the_back_off_stays_within_its_bound_and_never_below_the_interval() -> None:
    _, waits = _poll_until_an_answer(Throttled(8), interval_s=0.5, max_backoff_s=3.0)
    assert waits == [0.5, 1, 2, 3, 3, 3, 3, 3, 0.5]
    _, waits = _poll_until_an_answer(Throttled(3), interval_s=2.0, max_backoff_s=0.1)
    assert waits == [2.0] * 4


def test_an_hour_of_failures_logs_one_line_then_a_reminder_every_5_minutes_saying_what_the_job_does(caplog) -> None:
    """Review s64 rvK: the kubernetes provider's error said for how many seconds its watch had been down, so each
    call of a 10-minute outage was a new error and logged a WARNING. Errors that differ only in their numbers are
    one error; for an hour of failures, one every 30 s, the log has the first line and a reminder every 5 minutes,
    each saying what the job does meanwhile, then one line when discovery works again."""
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.runtime.discovery")
    streak = FailingStreak(1.0, meanwhile=lambda: "; the job trains on with its current hosts")
    for t in range(0, 3600, 30):
        streak.failed(f"the pods watch has been down for {t + 30} s: HTTP 503 Service Unavailable", float(t))
    streak.succeeded(3600.0)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING"] * 12 + ["INFO"], lines
    assert lines[0][1] == ("host discovery failed: the pods watch has been down for 30 s: HTTP 503 Service "
                           "Unavailable; retrying, less often while it fails (up to every 30s); the job trains on "
                           "with its current hosts")
    assert lines[1][1] == ("host discovery has failed for 300s (11 calls in a row), the latest: the pods watch has "
                           "been down for 330 s: HTTP 503 Service Unavailable; the job trains on with its current hosts")
    assert [int(m.split("failed for ")[1].split("s")[0]) for _, m in lines[1:12]] == list(range(300, 3600, 300))
    assert lines[12][1] == "host discovery works again, after failing for 3600.0s (120 call(s))"


def test_errors_taking_turns_are_each_logged_once(caplog) -> None:
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.runtime.discovery")
    streak = FailingStreak(1.0)
    for n in range(1, 20):
        streak.failed(("Rate exceeded", "AccessDenied", "no answer within 30.0s")[n % 3], float(n))
    assert [r.getMessage() for r in caplog.records] == [
        "host discovery failed: AccessDenied; retrying, less often while it fails (up to every 30s)",
        "host discovery failed: no answer within 30.0s (2 calls in a row)",
        "host discovery failed: Rate exceeded (3 calls in a row)",
    ]


def test_a_new_error_within_a_failing_streak_is_logged_once(caplog) -> None:
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.runtime.discovery")
    streak = FailingStreak(1.0)
    for n in range(1, 10):
        streak.failed("Rate exceeded" if n < 4 else "AccessDenied", float(n))
    assert [r.getMessage() for r in caplog.records] == [
        "host discovery failed: Rate exceeded; retrying, less often while it fails (up to every 30s)",
        "host discovery failed: AccessDenied (4 calls in a row)",
    ]


class Hanging(HostDiscovery):
    """A cloud API that holds its answer (a body trickled a byte at a time) until the test lets it go."""

    name = "hanging"

    def __init__(self) -> None:
        self.calls = 0
        self.go = threading.Event()

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "Hanging":
        return cls()

    def find(self) -> DiscoveredHosts:
        self.calls += 1
        if not self.go.wait(30):
            raise RetryableDiscoveryError("never let go")
        return DiscoveredHosts(ready={"a": 1})


def test_a_call_that_hangs_fails_retryably_at_the_discovery_timeout_and_no_second_one_starts() -> None:
    provider = Hanging()
    poller = DiscoveryPoller(provider, lambda result: None, interval_s=1.0, call_timeout_s=0.3)
    threads = threading.active_count()
    try:
        for _ in range(3):
            result = poller.poll_once()
            assert isinstance(result, DiscoveryFailure) and not result.fatal
            assert result.message == ("the hanging provider gave no answer within 0.3s (--discovery-timeout 0.3s); "
                                      "no other call starts until that one ends")
        assert provider.calls == 1  # the one given up on runs on; none beside it
        assert threading.active_count() <= threads + 1  # one call thread, not one per poll
        provider.go.set()
        assert poller.poll_once() == DiscoveredHosts(ready={"a": 1})  # its late answer
        assert poller.poll_once() == DiscoveredHosts(ready={"a": 1}) and provider.calls == 2
    finally:
        provider.go.set()
        poller.close()
    assert poller.join(5)


def test_while_a_call_hangs_the_running_poller_reports_failures_and_makes_no_other_provider_call() -> None:
    provider = Hanging()
    released: queue.SimpleQueue = queue.SimpleQueue()
    provider.release = lambda host, instance: released.put(provider.go.is_set())  # type: ignore[method-assign]
    results: queue.SimpleQueue = queue.SimpleQueue()
    poller = DiscoveryPoller(provider, results.put, interval_s=0.1, call_timeout_s=0.2)
    poller.start()
    try:
        first = results.get(timeout=5)
        assert isinstance(first, DiscoveryFailure) and "--discovery-timeout" in first.message  # the job counts it
        poller.release("h1", "i-1")
        assert isinstance(results.get(timeout=5), DiscoveryFailure) and released.empty()  # not beside the find()
        provider.go.set()
        assert released.get(timeout=5) is True  # once that find() has ended
    finally:
        provider.go.set()
        poller.close()
    assert poller.join(5)


class ReleasingProvider(PushProvider):
    """A cloud that holds leaving instances for the job (an AWS lifecycle hook): it lets them go."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[tuple[str, str | None]] = []

    def release(self, host: str, instance: str | None) -> None:
        self.released.append((host, instance))


@pytest.mark.parametrize("provider_class", [PushProvider, ReleasingProvider])
def test_released_to_the_cloud_is_said_only_by_a_provider_that_releases(provider_class, caplog) -> None:
    # A -H list or a discovery script holds no instance: "released ... to the cloud" misled (review s63 rvU 8).
    provider = provider_class()
    poller = DiscoveryPoller(provider, lambda result: None, interval_s=3600)
    with caplog.at_level(logging.INFO, logger="cloud_elastic.driver.runtime.discovery"):
        poller.release("10.0.0.5", "i-1")
        poller._release_queued()  # what the poller's thread does between finds
    said = [r.getMessage() for r in caplog.records if "released drained host" in r.getMessage()]
    if provider_class is ReleasingProvider:
        assert provider.released == [("10.0.0.5", "i-1")]
        assert said == ["released drained host 10.0.0.5 (i-1) to the cloud"]
    else:
        assert said == []


class Listing(PushProvider):
    """A -H list or a discovery script listing one host: it holds nothing to let go."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host

    def find(self) -> DiscoveredHosts:
        return DiscoveredHosts(ready={self.host: 1})


class Holding(Listing):
    """A cloud group of one host that holds it for the job while it leaves (an AWS lifecycle hook)."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.released: list[tuple[str, str | None]] = []

    release = ReleasingProvider.release


def _released_said(poller: DiscoveryPoller, hosts: list[tuple[str, str | None]], caplog) -> list[str]:
    poller.poll_once()  # which source lists which host
    with caplog.at_level(logging.INFO, logger="cloud_elastic"):
        for host, instance in hosts:
            poller.release(host, instance)
        poller._release_queued()
    return [r.getMessage() for r in caplog.records if "released drained host" in r.getMessage()]


def test_of_several_sources_only_one_that_releases_says_released_to_the_cloud(caplog) -> None:
    """fixL: a script source beside a cloud group logged "released ... to the cloud" for its own hosts: the
    several-source provider overrides release, which the poller took for the source's."""
    script, group = Listing("10.0.0.5"), Holding("10.0.0.6")
    multi = MultiSourceDiscovery([(SourceSpec("script", "script"), script), (SourceSpec("asg", "aws"), group)])
    poller = DiscoveryPoller(multi, lambda result: None, interval_s=3600)
    said = _released_said(poller, [("10.0.0.5", None), ("10.0.0.6", "i-6")], caplog)
    assert said == ["released drained host 10.0.0.6 (i-6) to the cloud"]
    assert group.released == [("10.0.0.6", "i-6")]
    multi.close()


@pytest.mark.parametrize("inner_class", [Listing, Holding])
def test_an_address_map_says_released_only_over_a_source_that_releases(inner_class, caplog) -> None:
    # The map overrides release to pass it on, which the poller took for a release of its own.
    inner = inner_class("10.0.1.5")
    mapped = AddressMappedDiscovery(inner, parse_address_map(["10.0.1.0/24=127.0.1.0/24"]))
    said = _released_said(DiscoveryPoller(mapped, lambda result: None, interval_s=3600), [("127.0.1.5", "i-5")],
                          caplog)
    if inner_class is Holding:
        assert (said, inner.released) == (["released drained host 127.0.1.5 (i-5) to the cloud"], [("10.0.1.5", "i-5")])
    else:
        assert said == []


class OlderPlugin(Holding):
    """A plugin written before ``HostDiscovery.releases``, with an attribute of its own by that name."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.releases = ["its own bookkeeping"]  # type: ignore[assignment, method-assign]


@pytest.mark.parametrize("alone", [True, False])
def test_a_plugin_with_its_own_releases_attribute_is_still_released(alone, caplog) -> None:
    """Review rvL: alone, its release ran but was logged as "could not release ... 'list' object is not callable";
    among several sources it was never called, and the instance waited out its cloud's own timeout."""
    plugin = OlderPlugin("10.0.0.7")
    discovery = plugin if alone else MultiSourceDiscovery([(SourceSpec("script", "script"), Listing("10.0.0.5")),
                                                           (SourceSpec("mine", "plugin"), plugin)])
    said = _released_said(DiscoveryPoller(discovery, lambda result: None, interval_s=3600), [("10.0.0.7", "i-7")],
                          caplog)
    assert plugin.released == [("10.0.0.7", "i-7")]
    assert said == ["released drained host 10.0.0.7 (i-7) to the cloud"]
    assert not [r for r in caplog.records if "could not release" in r.getMessage()]
    if not alone:
        discovery.close()


class Stalling(Holding):
    """A holding source whose find() waits while ``go`` is clear: a call the job gives up on keeps it busy."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.go = threading.Event()
        self.go.set()

    def find(self) -> DiscoveredHosts:
        self.go.wait(15)
        return super().find()


def test_a_release_put_off_behind_a_stalled_call_is_said_released_once_when_made(caplog) -> None:
    """fixL left alone: a several-source release put off (its source busy with a find() given up on) was said
    "released ... to the cloud" by the poller at once, before anything was let go, and again when made."""
    group = Stalling("10.0.0.6")
    multi = MultiSourceDiscovery([(SourceSpec("script", "script"), Listing("10.0.0.5")), (SourceSpec("asg", "aws"), group)])
    poller = DiscoveryPoller(multi, lambda result: None, interval_s=3600, call_timeout_s=0.3)
    poller.poll_once()
    group.go.clear()
    poller.poll_once()  # the group's find() given up on: it is busy until go
    with caplog.at_level(logging.INFO, logger="cloud_elastic"):
        poller.release("10.0.0.6", "i-6")
        poller._release_queued()
        said_at_once = [r.getMessage() for r in caplog.records if "released drained host" in r.getMessage()]
        assert (said_at_once, group.released) == ([], [])  # put off: nothing let go yet, nothing said
        group.go.set()
        deadline = time.monotonic() + 10
        while not group.released and time.monotonic() < deadline:
            poller.poll_once()  # the first find() after that call ended makes the put-off release
        multi.close()
    said = [r.getMessage() for r in caplog.records if "released drained host" in r.getMessage()]
    assert (said, group.released) == (["released drained host 10.0.0.6 (i-6) to the cloud"], [("10.0.0.6", "i-6")])


class HugeLimitProvider(PushProvider):
    """A plugin that says its call may take 1e12 s: the driver's wait for it overflowed (OverflowError in the
    discovery thread, which died, and the job ran on without discovery)."""

    def find_limit_s(self, timeout_s: float) -> float:
        return 1e12


def test_a_plugins_huge_call_limit_is_held_to_a_year_and_its_hosts_come():
    poller = DiscoveryPoller(HugeLimitProvider(), lambda result: None, interval_s=3600)
    try:
        assert poller.limit_s == 365 * 86400.0
        assert poller.poll_once() == DiscoveredHosts(ready={"a": 1})
    finally:
        poller.close()


def test_a_fault_of_the_pollers_own_is_a_failed_poll_and_discovery_goes_on(monkeypatch, caplog):
    provider = PushProvider()
    results: queue.SimpleQueue = queue.SimpleQueue()
    poller = DiscoveryPoller(provider, results.put, interval_s=0.05)
    real, faults = poller.poll_once, [OverflowError("timestamp out of range for platform time_t")]
    monkeypatch.setattr(poller, "poll_once", lambda: (_ for _ in ()).throw(faults.pop()) if faults else real())
    with caplog.at_level(logging.ERROR, "cloud_elastic.driver.runtime.discovery"):
        poller.start()
        try:
            first = results.get(timeout=5)
            assert isinstance(first, DiscoveryFailure) and not first.fatal
            assert first.message == "the discovery poller failed: OverflowError: timestamp out of range for platform time_t"
            assert results.get(timeout=5) == DiscoveredHosts(ready={"a": 1})  # the thread lives on
        finally:
            poller.close()
    assert [r.message for r in caplog.records] == ["the discovery poller failed"]


def test_a_providers_bug_in_the_first_calls_prints_its_traceback_once_a_streak(caplog) -> None:
    """The driver's first calls go through poll_once and report their failures with failed(): a provider raising
    something unexpected (a plugin's OverflowError on 1e400 slots) printed its traceback every call before."""
    class Buggy(HostDiscovery):
        name = "buggy"

        @classmethod
        def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "Buggy":
            return cls()

        def find(self) -> DiscoveredHosts:
            return DiscoveredHosts(ready={"a": int(float("1e400"))})

    caplog.set_level(logging.DEBUG, logger="cloud_elastic")
    poller = DiscoveryPoller(Buggy(), lambda r: None, interval_s=1.0)
    try:
        for _ in range(3):
            result = poller.poll_once()
            assert isinstance(result, DiscoveryFailure) and "OverflowError" in result.message
            poller.failed(result.message, time.monotonic())
    finally:
        poller.close()
    tracebacks = [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
