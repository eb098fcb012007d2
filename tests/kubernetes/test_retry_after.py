"""A throttled API server (429 or 503 with ``Retry-After``, as API Priority and Fairness answers), through the real
``kubernetes`` client, over HTTP, against the fake API server (``tests/emulator/fake_kubernetes.py``).

Review s64 rvK (finding 2): the client's default urllib3 ``Retry(3)`` slept each ``Retry-After`` inside the request,
where the provider could not see it: a watch answered 429 was reported as "no word from the API server ... (a
stalled connection?)", ``close()`` waited 10 s and left both watch threads asleep for as long as the server asked
(an hour), and a first list answered 429 was "gave no answer" at the driver. Now the client retries nothing, and
the provider waits what the server asks, at most 30 s, saying why.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from cloud_elastic.errors import RetryableDiscoveryError
from tests.emulator.fake_kubernetes import _status, kubernetes, kubernetes_options, kubernetes_server  # noqa: F401
from tests.emulator.fixtures import hermetic_cloud_env, provider  # noqa: F401
from tests.emulator.test_kubernetes import watched  # noqa: F401
from tests.kubernetes.test_watch_outages import _find_until

pytestmark = pytest.mark.timeout(60)

_THROTTLED = _status(429, "TooManyRequests", "Too many requests, please try again later.")


def test_a_watch_answered_429_with_retry_after_is_named_waited_within_bounds_and_stopped_at_once(kubernetes,
                                                                                                  watched):
    ns = "ns-throttled-watch"
    kubernetes.add_pod("p0", "10.75.0.1", namespace=ns, node="throttled-n")
    watches = re.escape(f"/namespaces/{ns}/pods?watch")
    kubernetes.fail(watches, 1000, 429, _THROTTLED, {"Retry-After": "3600"})
    w = watched(ns, watch_s="1", stale_after_s="1")
    error = _find_until(w.discovery, lambda r: isinstance(r, RetryableDiscoveryError), "discovery failing", 20)
    assert "HTTP 429 Too Many Requests (Retry-After 3600 s)" in str(error), error
    assert "stalled" not in str(error)
    asked_at = time.monotonic()
    while time.monotonic() - asked_at < 3:  # the back-off alone would ask again at 0.5, 1.5, 3.5 s
        with pytest.raises(RetryableDiscoveryError):
            w.discovery.find()
        time.sleep(0.1)
    assert kubernetes.count(watches) == 1  # not asked again before the 30 s cap
    threads = [t for t in threading.enumerate() if t.name.startswith("k8s-watch")]
    started = time.monotonic()
    w.close()
    assert time.monotonic() - started < 5, "close() waited on a watch asleep in urllib3"
    assert not [t.name for t in threads if t.is_alive()]


def test_a_first_list_answered_429_says_so_and_is_not_asked_again_before_its_retry_after(kubernetes):
    ns = "ns-throttled-list"
    kubernetes.add_pod("p0", "10.75.1.1", namespace=ns, node="throttled-n")
    lists = re.escape(f"/namespaces/{ns}/pods") + "$"
    kubernetes.fail(lists, 1, 429, _THROTTLED, {"Retry-After": "2"})
    discovery = provider("kubernetes", kubernetes_options(kubernetes, ns))
    try:
        started = time.monotonic()
        with pytest.raises(RetryableDiscoveryError) as first:
            discovery.find()
        assert str(first.value).endswith("listing pods: HTTP 429 Too many requests, please try again later. "
                                         "(throttled: the API server asks to retry after 2 s; asked again in 2 s)")
        assert kubernetes.count(lists) == 1  # one request: no retry inside the client
        with pytest.raises(RetryableDiscoveryError) as again:
            discovery.find()  # within the 2 s asked: the server is not asked
        assert str(again.value) == str(first.value) and kubernetes.count(lists) == 1
        snapshot = _find_until(discovery, lambda r: not isinstance(r, Exception), "the list answered", 20)
        assert time.monotonic() - started >= 2.0 and dict(snapshot.ready) == {"10.75.1.1": 1}
        assert kubernetes.count(lists) == 2
    finally:
        discovery.close()
