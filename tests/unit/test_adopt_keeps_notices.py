"""A notice the dead driver took is not lost when a restarted driver adopts the worker.

A driver that accepted a notice (a host watcher's, or a worker's SIGTERM it let the worker stay
for) and was killed before the host drained leaves nothing of it behind: the notice was reported,
so the worker's watcher never reported it again, and the restarted driver put the host back to
work until the cloud took it mid-step. The worker is where the notice lives on: its watcher
reports what it had reported again after re-registering (the metadata service still shows it),
and its adopt request carries the deadline of a SIGTERM it stays for.

Worker side: a real watcher, the worker's real report callback and adopt call, over HTTP to a
real control-plane server. Driver side: a real job, its control plane and the adoption window.
"""

from __future__ import annotations

import random
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.control import Codec, new_secret
from cloud_elastic.driver.job.elastic_job import ElasticJob, Policy
from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.driver.net.control_server import ControlServer
from cloud_elastic.driver.restart.record import AdoptedWorker, AdoptionRecord
from cloud_elastic.driver.restart.window import AdoptionWindow
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.control_plane import ControlPlane
from cloud_elastic.notices import TERMINATE, Notice
from cloud_elastic.notices._polling import PollingWatcher
from cloud_elastic.notices.api import SOURCE_AWS
from cloud_elastic.protocol import AdoptRequest, RankInfo
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.worker.link.client import DriverClient
from cloud_elastic.worker.link.driver_link import DriverLinkMixin, notice_reporter

pytestmark = pytest.mark.timeout(30)

SECRET = new_secret()
WORKER = "b[0]#2"


class SpotNotice(PollingWatcher):
    """An instance metadata service that shows one spot interruption on every read, as AWS's does."""

    source = SOURCE_AWS

    def __init__(self) -> None:
        super().__init__(base_url="http://127.0.0.1:9", poll_interval_s=0.02)
        self.deadline = time.time() + 35

    def _cycle(self) -> tuple[list[Notice], float | None]:
        return [Notice(SOURCE_AWS, TERMINATE, self.deadline, "EC2 Spot interruption", "spot-1")], None


class Driver:
    """A driver's control plane that takes every notice and adoption, and records them in order."""

    def __init__(self, port: int = 0) -> None:
        self.messages: list[tuple[str, dict]] = []
        self._cond = threading.Condition()
        self.server = ControlServer(Codec(SECRET, "job"), self._handle, port=port)

    def _handle(self, kind: str, message: dict) -> dict:
        with self._cond:
            self.messages.append((kind, message))
            self._cond.notify_all()
        return {"ok": True, "stay": True} if message.get("own") else {"ok": True}

    def wait_for(self, kind: str, count: int) -> list[dict]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.of(kind)) >= count, 10)
            return self.of(kind)

    def of(self, kind: str) -> list[dict]:
        return [m for k, m in self.messages if k == kind]


class Link(DriverLinkMixin):
    """The worker's driver link as its context has it, outside any round (adopted as a newcomer)."""

    def __init__(self, port: int) -> None:
        self.settings = SimpleNamespace(driver_address=f"127.0.0.1:{port}", slot=0)
        self._codec = Codec(SECRET, "job")
        self.worker_id = WORKER
        self.heartbeat_timeout_s = 5.0
        self._adopt_lock = threading.Lock()
        self.info = None
        self._attempted_round = False
        self._seen_update = self._seen_abort = self.commits = self.commit_seq = 0
        self._store_stale = False
        self.driver_lost = False
        self._notice_watcher: Any = None

    def client(self) -> DriverClient:
        return DriverClient(self.settings.driver_address, self._codec, self.worker_id)


def test_a_notice_the_dead_driver_took_reaches_the_driver_that_adopts_the_worker() -> None:
    driver = Driver()
    driver.server.start()
    link = Link(driver.server.port)
    link._notice_watcher = watcher = SpotNotice()
    try:
        watcher.start(notice_reporter(link.client(), timeout_s=5))
        assert len(driver.wait_for("notice", 1)) == 1
        # The driver that took it is killed; the one restarted on its port asks the worker to re-register.
        link._reregister(link.client())
        notices = driver.wait_for("notice", 2)
    finally:
        watcher.close()
        driver.server.close()
    kinds = [k for k, _ in driver.messages]
    assert len(notices) == 2, f"the restarted driver never heard of the notice: {kinds}"
    assert kinds.index("adopt") < [i for i, k in enumerate(kinds) if k == "notice"][1]
    assert notices[1]["deadline"] == notices[0]["deadline"] == watcher.deadline  # as first seen
    assert [n.event_id for n in watcher.reported] == ["spot-1"]


def test_a_sigterm_the_dead_driver_let_the_worker_stay_for_is_in_its_adopt_request() -> None:
    driver = Driver()
    driver.server.start()
    link = Link(driver.server.port)
    deadline = time.time() + 30
    try:
        assert link.report_sigterm(deadline) is True
        link._reregister(link.client())
    finally:
        driver.server.close()
    adopt, = driver.of("adopt")
    assert AdoptRequest.from_wire(adopt).sigterm_deadline == deadline


def restarted_job(clock: Any) -> tuple[ElasticJob, JobCondition, ControlPlane]:
    """A restarted driver's job of two slots, its lock and its control plane, as the driver builds them."""
    job = ElasticJob(Policy(2, 1, 2, checkpointing=True), HostManager(Blacklist((10.0, 300.0), random.Random(0))),
                     job_id="t", resumed=True)
    job.start(0.0)
    cond = JobCondition()
    cond.watch(job)
    plane = ControlPlane(job, cond, JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2),
                         sinks=SimpleNamespace(sink=None, metrics=None), clock=clock,
                         stop=lambda reason, code: None, record_events=lambda: None)
    return job, cond, plane


def test_a_restarted_driver_drains_the_host_of_a_sigterm_its_predecessor_took_once_the_window_closes() -> None:
    job, cond, plane = restarted_job(lambda: 1.0)
    workers = tuple(AdoptedWorker(wid, host, 0, seq, {}) for wid, host, seq in (("a[0]#1", "a", 1), (WORKER, "b", 2)))
    record = AdoptionRecord("t", "", "127.0.0.1", "127.0.0.1", 1, 2, 60.0, 2, workers, SECRET)
    window = AdoptionWindow(record, job, cond, rules=plane.by_rules, clock=lambda: 1.0, started_at=0.0,
                            heartbeat_timeout_s=5.0, rendezvous_hold_s=10.0)
    window.open()
    deadline = time.time() + 20
    for rank, (wid, sigterm) in enumerate((("a[0]#1", 0.0), (WORKER, deadline))):
        request = AdoptRequest(1, RankInfo(rank, 2, 0, 1, rank, 2), 1, 1, 0, 5, 0, 100 + rank, 5, sigterm)
        with cond:  # as the control plane calls it
            assert window.intercept("adopt", wid, dict(request.to_wire(), worker=wid)) == {"ok": True}
    closed = window.wait(lambda: False)
    assert not closed.missing
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 1.0)
    assert "b" not in job.hosts.draining, "drained before the window closed"
    window.close()
    notices = [fields for kind, fields in job.take_events() if kind == "notice"]
    assert [(n["host"], n["source"], n["action"], n["deadline"]) for n in notices] == [("b", "sigterm", "drain",
                                                                                          deadline)]
    assert "b" in job.hosts.draining and "a" not in job.hosts.draining
