"""The host groups ``--manage-capacity`` raised, at the ends of a driver's life (``driver/runtime/raised.py``),
with a real Driver and checkpoint store, and a discovery provider of this test's own.

The job's core decides when a group goes back to 0 (tests/unit/test_job_sourcing.py); these check the runtime:
a driver that waits out a crashed predecessor's workers lowers none of the groups that predecessor raised (its
workers may still train there, or a live driver elsewhere still runs the job), and keeps saying they are
raised; a job that raised nothing does not wait for a slow discovery call to end before it exits.
"""

from __future__ import annotations

import threading
import time

import pytest

from cloud_elastic.checkpoint.alive import DriverAlive, read_driver_alive, write_driver_alive
from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart.predecessor import open_store, plan_start
from cloud_elastic.driver.runtime.driver import Driver
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery
from cloud_elastic.providers.sources import SourceSpec

pytestmark = pytest.mark.timeout(60)


class Groups(HostDiscovery):
    """Two sources, a spot one and an on-demand fallback, with no host yet; capacity changes are recorded."""

    name = "groups"
    specs = (SourceSpec("spot", "groups"), SourceSpec("od", "groups", fallback=True))

    @classmethod
    def from_options(cls, *args, **kwargs) -> "Groups":
        return cls()

    def __init__(self, slow_s: float = 0.0) -> None:
        self.calls: list[tuple[str | None, int]] = []
        self.finds = 0
        self.slow_s = slow_s

    def find(self) -> DiscoveredHosts:
        self.finds += 1
        if self.finds > 1:
            time.sleep(self.slow_s)
        return DiscoveredHosts(ready={}, draining={})

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        self.calls.append((source, hosts))


def test_a_driver_stopped_while_it_waits_out_its_predecessor_lowers_none_of_its_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1,
                       checkpoint_dir=str(tmp_path / "ckpt"), manage_capacity=True, driver_grace_s=60.0)
    store = open_store(config)
    plan_start(config, store, job_id="j1")
    # The driver on another machine was alive a second ago, with the on-demand group raised.
    write_driver_alive(store, DriverAlive("j1", time.time() - 1, 60.0, "other-vm", 4242, raised=(("od", 2),)))
    groups = Groups()
    driver = Driver(config, groups, job_id="j2")
    threading.Timer(2.0, lambda: driver.stop("interrupted", 130)).start()  # Ctrl-C while it waits
    assert driver.run().exit_code == 130
    assert groups.calls == []  # the old workers may still train on it
    entry = read_driver_alive(store)
    assert entry.pid != 4242 and entry.raised == (("od", 2),)  # the next driver takes it over


def test_a_job_that_raised_nothing_does_not_wait_for_a_slow_discovery_call_to_exit(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    config = JobConfig(command=("python", "train.py"), num_proc=1, min_np=1, max_np=1, start_timeout_s=300)
    groups = Groups(slow_s=45.0)  # a discovery call under way as the job ends (no --manage-capacity: none raised)
    driver = Driver(config, groups, job_id="j3")
    threading.Timer(2.0, lambda: driver.stop("interrupted", 130)).start()
    started = time.monotonic()
    assert driver.run().exit_code == 130
    assert time.monotonic() - started < 30  # not held by the 45 s call: nothing is raised to set back
    assert groups.calls == []

