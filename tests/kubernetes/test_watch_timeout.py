"""A watch's end is measured against the ``timeoutSeconds`` it asked for, on a clock the test drives.

Review of ed6d949: a watch of ``watch_s`` 2.5 asks the API server for ``timeoutSeconds`` 2 (whole seconds), and a
quiet healthy server ends it at 2 s with no line (its bookmark comes 2 s before the deadline: never, in a 2 s
watch). The end was measured against 0.9 × 2.5 = 2.25 s, so every proper end was an empty one: backed off, three
in a row a WARNING, and find() failed on a healthy cluster (35 times in 25 s).

Review of 96c7b47: a ``watch_s`` under 1 s asks for ``timeoutSeconds`` 1, but the read timeout and the staleness
check were still 2 × ``watch_s`` (0.8 s for 0.4): the client cut every healthy quiet watch before the server ended
it (find() failed 110 times in 12 s against a fake API server).
"""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from cloud_elastic.providers import kubernetes_watch
from cloud_elastic.providers.kubernetes_watch import ResourceWatch

pytestmark = pytest.mark.timeout(30)

WATCHES = 5


#: How much later than its deadline a server's end reaches the client.
LATENCY_S = 0.1


class ReadTimeout(Exception):
    """What urllib3 raises when no byte came within the read timeout."""


class Ended:
    """A watch response whose stream ends with no line once ``held_s`` have passed on the test's clock, unless the
    client's read timeout ``read_s`` is shorter: then the read fails at it, as urllib3's does. ``during()`` is
    called just before the end (or the read timeout)."""

    chunked = True  # as the API server sends a watch

    def __init__(self, clock: SimpleNamespace, held_s: float, read_s: float, during) -> None:
        self.clock, self.held_s, self.read_s, self.during = clock, held_s, read_s, during

    def stream(self, amt=None, decode_content=False):
        if self.read_s < self.held_s:
            self.clock.now += self.read_s
            self.during()
            raise ReadTimeout("Read timed out.")
        self.clock.now += self.held_s
        self.during()
        yield from ()

    def release_conn(self):
        pass

    def close(self):
        pass


def quiet_watches(monkeypatch, watch_s: float, share: float) -> list:
    """What trouble() says before each of WATCHES requests of a pods watch of ``watch_s`` whose server ends each
    one, empty, after ``share`` × the timeoutSeconds it was asked for (a quiet cluster, no bookmark), and just
    before each stream ends."""
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(kubernetes_watch, "time", SimpleNamespace(time=lambda: clock.now, monotonic=lambda: clock.now))
    monkeypatch.setattr(kubernetes_watch, "_BACKOFF_FIRST_S", 0.001)
    seen, done, gate = [], threading.Event(), threading.Event()

    def answer(**request):
        seen.append(watch.trouble())
        if watch.watches >= WATCHES:
            done.set()
            gate.wait(10)
            raise ConnectionRefusedError("the test is over")
        held_s = share * request["timeout_seconds"] + LATENCY_S
        return Ended(clock, held_s, request["_request_timeout"][1], lambda: seen.append(watch.trouble()))

    watch = ResourceWatch("pods", answer, replace=lambda items: False, apply=lambda kind, obj: False,
                          lock=threading.Lock(), on_news=lambda: None, watch_s=watch_s)
    watch.start()
    try:
        assert done.wait(10), "the watch did not renew its requests"
    finally:
        gate.set()
        watch.stop()
    return seen


@pytest.mark.parametrize("watch_s", [0.3, 0.5, 0.9, 1.5, 2.5, 5.9])
def test_a_quiet_watch_the_server_ends_at_the_timeout_asked_is_healthy(monkeypatch, caplog, watch_s):
    caplog.set_level(logging.INFO, logger=kubernetes_watch.__name__)
    assert quiet_watches(monkeypatch, watch_s, share=1.0) == [None] * (2 * WATCHES + 1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_watch_ended_empty_well_before_the_timeout_asked_is_still_an_outage(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=kubernetes_watch.__name__)
    seen = quiet_watches(monkeypatch, 2.5, share=0.5)  # ended at 1 s of the 2 s asked: a proxy
    # each request and each stream's end: healthy until the third empty end, down from then on
    assert seen[:6] == [None] * 6 and all(t is not None and "3 watches in a row" in t[1] for t in seen[6:])
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1, caplog.text
