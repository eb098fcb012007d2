"""The driver's sign of life beside the checkpoints: written atomically, read back, refreshed, and closed."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointError, CheckpointStore
from cloud_elastic.checkpoint.alive import (
    ALIVE_RECORD,
    AliveRefresher,
    DriverAlive,
    read_driver_alive,
    write_driver_alive,
)
from cloud_elastic.cost import CostSoFar

pytestmark = pytest.mark.timeout(20)


def _until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_an_entry_reads_back_beside_the_job_record_and_holds_nothing_secret(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    assert read_driver_alive(store) is None
    entry = DriverAlive("job1", 1795444453.5, 60.0, "driver-vm", 4242)
    write_driver_alive(store, entry)
    assert read_driver_alive(store) == entry
    assert sorted(os.listdir(tmp_path)) == [ALIVE_RECORD]  # no temporary file left behind
    assert "secret" not in (tmp_path / ALIVE_RECORD).read_text()
    assert store.list() == []  # not mistaken for a checkpoint


def test_an_unreadable_entry_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / ALIVE_RECORD).write_text("{not json")
    with pytest.raises(CheckpointError, match=f"{ALIVE_RECORD} is unreadable"):
        read_driver_alive(CheckpointStore(str(tmp_path)))


def test_the_refresher_keeps_the_entry_fresh_and_says_stopped_only_when_told(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    now = [100.0]
    refresher = AliveRefresher(store, "job1", 30.0, interval_s=0.02, clock=lambda: now[0]).start()
    first = _until(lambda: read_driver_alive(store))
    assert (first.job_id, first.alive, first.grace_s, first.host, first.pid, first.stopped) == (
        "job1", 100.0, 30.0, socket.gethostname(), os.getpid(), False)
    assert first.is_this_process()
    now[0] = 107.0
    _until(lambda: read_driver_alive(store).alive == 107.0)  # refreshed by the thread, nobody asked
    assert first.raised == ()
    refresher.set_raised({"gpu-od": 2})  # --manage-capacity raised a group: the next refresh says so
    _until(lambda: read_driver_alive(store).raised == (("gpu-od", 2),))
    refresher.set_raised({})  # set back to 0 as the job ended: the last entry says so, not stopped though
    refresher.close(stopped=False)
    assert read_driver_alive(store).stopped is False  # the last refresh stays: a restart waits from it
    assert read_driver_alive(store).raised == ()

    again = AliveRefresher(store, "job1", 30.0, interval_s=0.02, clock=lambda: now[0]).start()
    now[0] = 120.0
    again.close(stopped=True)
    last = read_driver_alive(store)
    assert last.stopped and last.alive == 120.0


def test_the_refresher_writes_the_cost_so_far_it_is_handed_and_its_last_figures_at_close(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    refresher = AliveRefresher(store, "job1", 30.0, interval_s=60.0, clock=lambda: 100.0)
    refresher.set_cost(CostSoFar(1.0, 2.0))  # the snapshot the driver hands it at each tick
    refresher.start()
    assert _until(lambda: read_driver_alive(store)).cost == CostSoFar(1.0, 2.0)  # the first refresh
    later = CostSoFar(1.5, 3.0, by_source=(("od", 1.5),))
    refresher.set_cost(later)  # the next refresh is a minute away: the close writes it
    refresher.close(stopped=False)
    assert read_driver_alive(store).cost == later and not read_driver_alive(store).stopped


def test_an_entry_with_this_host_and_pid_but_another_instance_is_not_this_process(tmp_path: Path) -> None:
    """A driver restarted as the same pid on the same host (a container's PID 1) must not take its dead
    predecessor's entry for its own; an entry of an older version, which names no instance, still is."""
    from dataclasses import replace

    store = CheckpointStore(str(tmp_path))
    mine = DriverAlive("job1", 100.0, 30.0, socket.gethostname(), os.getpid())
    write_driver_alive(store, mine)
    assert read_driver_alive(store).is_this_process()
    write_driver_alive(store, replace(mine, instance="0123456789abcdef"))
    assert not read_driver_alive(store).is_this_process()
    write_driver_alive(store, replace(mine, instance=""))
    assert read_driver_alive(store).is_this_process()


def test_a_group_whose_zero_the_cloud_took_leaves_the_sign_of_life_at_once(tmp_path: Path) -> None:
    """Not at the next refresh: a driver killed in between would hand the group on as the job's, and its successor
    would set it to 0 after an operator had raised it during the successor's wait (review s56 rv11 F2)."""
    store = CheckpointStore(str(tmp_path))
    refresher = AliveRefresher(store, "job1", 30.0, interval_s=60.0, clock=lambda: 100.0).start()
    try:
        def raised():
            entry = read_driver_alive(store)
            return None if entry is None else entry.raised

        refresher.set_raised({"gpu-od": 1})
        _until(lambda: raised() == (("gpu-od", 1),))
        refresher.set_raised({})  # the cloud took the job's 0
        _until(lambda: raised() == (), timeout=5.0)
    finally:
        refresher.close(stopped=True)
