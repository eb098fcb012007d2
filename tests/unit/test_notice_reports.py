"""A watcher's notice reaches the driver even if the driver is briefly unreachable or refuses it.

A watcher whose metadata service shows one spot notice on every read (as a real
one does until the host goes), reporting through the worker's real report
callback (:func:`cloud_elastic.worker.context.notice_reporter`) over HTTP to a
real control-plane server.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.notices import TERMINATE, Notice
from cloud_elastic.notices._polling import PollingWatcher
from cloud_elastic.notices.api import SOURCE_GCP
from cloud_elastic.worker.link.client import DriverClient
from cloud_elastic.worker.link.driver_link import notice_reporter

pytestmark = pytest.mark.timeout(30)

SECRET = new_secret()


class OneNotice(PollingWatcher):
    """Sees the same preemption on every read; like GCP's, its deadline is counted from the sighting."""

    source = SOURCE_GCP

    def __init__(self) -> None:
        super().__init__(base_url="http://127.0.0.1:9", poll_interval_s=0.02)
        self.sightings = 0
        self._cond = threading.Condition()

    def _cycle(self) -> tuple[list[Notice], float | None]:
        with self._cond:
            self.sightings += 1
            self._cond.notify_all()
        return [Notice(SOURCE_GCP, TERMINATE, time.time() + 30, "GCE preemption", "gcp-preempted")], None

    def wait_sightings(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.sightings >= count, 10), self.sightings


class Driver:
    """The driver's side: a control-plane server that refuses the first ``refusals`` notices."""

    def __init__(self, refusals: int = 0, port: int = 0) -> None:
        self.refusals = refusals
        self.notices: list[dict] = []  # every notice message received, refused ones included
        self.taken = threading.Event()
        self.server = ControlServer(Codec(SECRET, "job"), self._handle, port=port)

    def _handle(self, kind: str, message: dict) -> dict:
        assert kind == "notice"
        self.notices.append(message)
        if len(self.notices) <= self.refusals:
            return {"ok": False}  # e.g. the worker is not (yet) known to this driver
        self.taken.set()
        return {"ok": True}


def _reporter(port: int):
    return notice_reporter(DriverClient(f"127.0.0.1:{port}", Codec(SECRET, "job"), "w1"), timeout_s=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_report_raises_so_that_the_watcher_tries_again() -> None:
    driver = Driver(refusals=1)
    driver.server.start()
    try:
        report = _reporter(driver.server.port)
        notice = Notice(SOURCE_GCP, TERMINATE, None, "GCE preemption", "gcp-preempted")
        with pytest.raises(ControlPlaneError, match="did not take the terminate notice"):
            report(notice)
        report(notice)
    finally:
        driver.server.close()
    assert len(driver.notices) == 2 and driver.taken.is_set()


def test_a_notice_the_driver_refuses_is_reported_again_at_its_next_sighting_until_taken() -> None:
    driver = Driver(refusals=2)
    driver.server.start()
    watcher = OneNotice()
    try:
        watcher.start(_reporter(driver.server.port))
        assert driver.taken.wait(10)
        after = watcher.sightings
        watcher.wait_sightings(after + 5)  # more sightings: taken once, not reported again
    finally:
        watcher.close()
        driver.server.close()
    assert len(driver.notices) == 3
    assert len({m["deadline"] for m in driver.notices}) == 1  # each time the first sighting's deadline
    assert [n.event_id for n in watcher.reported] == ["gcp-preempted"]


def test_a_notice_seen_while_the_driver_is_unreachable_reaches_it_once_it_is_back() -> None:
    port = _free_port()
    watcher = OneNotice()
    watcher.start(_reporter(port))  # nothing listens there yet: every report is refused by the kernel
    driver = Driver(port=port)
    try:
        watcher.wait_sightings(3)
        assert watcher.reported == ()
        driver.server.start()
        assert driver.taken.wait(10)
        watcher.wait_sightings(watcher.sightings + 5)
    finally:
        watcher.close()
        driver.server.close()
    assert len(driver.notices) == 1
