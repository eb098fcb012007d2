"""The discovery poller: a provider with a push source gets its next find() at once, not at the interval."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Mapping

import pytest

from cloud_elastic.driver.runtime.discovery import DiscoveryPoller
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery

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
