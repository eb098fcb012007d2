"""A watch's end is measured against the ``timeoutSeconds`` it asked for, on a clock the test drives.

Review of ed6d949: a watch of ``watch_s`` 2.5 asks the API server for ``timeoutSeconds`` 2 (whole seconds), and a
quiet healthy server ends it at 2 s with no line (its bookmark comes 2 s before the deadline: never, in a 2 s
watch). The end was measured against 0.9 × 2.5 = 2.25 s, so every proper end was an empty one: backed off, three
in a row a WARNING, and find() failed on a healthy cluster (35 times in 25 s).
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


class Ended:
    """A watch response whose stream ends with no line once ``held_s`` have passed on the test's clock."""

    def __init__(self, clock: SimpleNamespace, held_s: float) -> None:
        self.clock, self.held_s = clock, held_s

    def stream(self, amt=None, decode_content=False):
        self.clock.now += self.held_s
        yield from ()

    def release_conn(self):
        pass

    def close(self):
        pass


def quiet_watches(monkeypatch, watch_s: float, share: float) -> list:
    """What trouble() says before each of WATCHES requests of a pods watch of ``watch_s`` whose server ends each
    one, empty, after ``share`` × the timeoutSeconds it was asked for (a quiet cluster, no bookmark)."""
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(kubernetes_watch, "time", SimpleNamespace(time=lambda: clock.now, monotonic=lambda: clock.now))
    monkeypatch.setattr(kubernetes_watch, "_BACKOFF_FIRST_S", 0.001)
    seen, done, gate = [], threading.Event(), threading.Event()

    def answer(**request):
        seen.append(watch.trouble())
        if len(seen) > WATCHES:
            done.set()
            gate.wait(10)
            raise ConnectionRefusedError("the test is over")
        return Ended(clock, share * request["timeout_seconds"])

    watch = ResourceWatch("pods", answer, replace=lambda items: False, apply=lambda kind, obj: False,
                          lock=threading.Lock(), on_news=lambda: None, watch_s=watch_s)
    watch.start()
    try:
        assert done.wait(10), "the watch did not renew its requests"
    finally:
        gate.set()
        watch.stop()
    return seen


@pytest.mark.parametrize("watch_s", [1.5, 2.5, 5.9])
def test_a_quiet_watch_the_server_ends_at_the_timeout_asked_is_healthy(monkeypatch, caplog, watch_s):
    caplog.set_level(logging.INFO, logger=kubernetes_watch.__name__)
    assert quiet_watches(monkeypatch, watch_s, share=1.0) == [None] * (WATCHES + 1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_watch_ended_empty_well_before_the_timeout_asked_is_still_an_outage(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=kubernetes_watch.__name__)
    seen = quiet_watches(monkeypatch, 2.5, share=0.5)  # ended at 1 s of the 2 s asked: a proxy
    assert seen[:3] == [None] * 3 and all(t is not None and "3 watches in a row" in t[1] for t in seen[3:])
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1, caplog.text
