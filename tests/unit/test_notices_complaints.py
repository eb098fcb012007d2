"""Rate-limited complaints: each kind of trouble is logged once, then at most every few minutes."""

from __future__ import annotations

import logging

from cloud_elastic.notices._polling import Complaints


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_kind_of_trouble_is_logged_once_then_with_a_count(caplog):
    caplog.set_level(logging.WARNING, logger="cloud_elastic.notices")
    clock = Clock()
    complain = Complaints(every_s=300, clock=clock)
    for _ in range(5):
        complain("spot: HTTP 500", "spot answered HTTP 500")
        clock.now += 10
    complain("spot: bad JSON", "spot: not JSON")
    assert [r.getMessage() for r in caplog.records] == ["spot answered HTTP 500; ignored", "spot: not JSON; ignored"]
    clock.now += 300
    complain("spot: HTTP 500", "spot answered HTTP 500")
    assert caplog.records[-1].getMessage() == "spot answered HTTP 500; ignored (4 more like it since)"
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_kinds_made_up_by_the_service_do_not_grow_the_book(caplog):
    # An Azure answer names its own event types, and each unknown one is a kind of complaint.
    from cloud_elastic.notices._polling import MAX_KINDS

    caplog.set_level(logging.WARNING, logger="cloud_elastic.notices")
    clock = Clock()
    complain = Complaints(every_s=300, clock=clock)
    complain("azure: bad JSON", "scheduledevents: not JSON")
    for n in range(10 * MAX_KINDS):
        complain(f"azure: type T{n}", f"unknown EventType 'T{n}'")
        complain(f"azure: type T{n}", f"unknown EventType 'T{n}'")  # suppressed
        complain("azure: bad JSON", "scheduledevents: not JSON")  # a kind in use stays remembered
    assert len(complain._last) <= MAX_KINDS and len(complain._suppressed) <= MAX_KINDS
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("scheduledevents: not JSON; ignored") == 1
    assert len(messages) == 1 + 10 * MAX_KINDS
