"""A dead predecessor whose clock ran ahead does not make its successor wait out the skew.

The review's skew.sh: ``driver-alive.json`` of a dead driver on another machine whose clock ran 1 h ahead; the
restart said "last alive -3595s ago ... waiting 3672s". A dead driver was not alive after now, so its sign of life
counts as now at the latest: the wait is its workers' grace and a last checkpoint. A driver that is in fact alive
refreshes its entry during that wait, and is still found then (the restart stops, naming it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, write_job_record
from cloud_elastic.checkpoint.alive import DriverAlive, write_driver_alive
from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart.predecessor import plan_start, wait_for_predecessor

pytestmark = pytest.mark.timeout(60)

JOB = "job22222"
AHEAD_S = 3600.0
GRACE_S = 30.0


def _skewed_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[JobConfig, CheckpointStore]:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    store = CheckpointStore(ckpt)
    write_job_record(store, DurableJobRecord(JOB, ("python", "train.py"), time.time() - 600, extra={
        "driver_grace_s": GRACE_S, "driver": {"host": "othervm", "pid": 4242}}))
    store.save(10, {"step": 10}, {"job_id": JOB})
    write_driver_alive(store, DriverAlive(JOB, time.time() + AHEAD_S, GRACE_S, "othervm", 4242))
    config = JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2, checkpoint_dir=ckpt,
                       driver_grace_s=GRACE_S)
    return config, store


def test_a_dead_predecessor_whose_clock_ran_an_hour_ahead_is_waited_out_for_its_grace_not_the_hour(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, store = _skewed_job(tmp_path, monkeypatch)
    before = time.time()
    plan = plan_start(config, store, job_id="second2")
    assert plan.job_id == JOB and plan.resumed and plan.wait_until is not None
    # At most its last refresh (taken as now), its grace and the time a last checkpoint takes: not the hour.
    assert plan.wait_until - before < GRACE_S + 60, plan.wait_until - before
    assert "alive -" not in plan.waiting_for and "s ahead of this machine's clock" in plan.waiting_for


def test_a_live_predecessor_whose_clock_runs_ahead_is_still_found_by_its_refresh_during_the_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, store = _skewed_job(tmp_path, monkeypatch)
    plan = plan_start(config, store, job_id="second2")
    stops: list[tuple[str, int]] = []

    def wait(seconds: float) -> bool:  # the skewed driver refreshes its entry meanwhile; time passes
        write_driver_alive(store, DriverAlive(JOB, time.time() + AHEAD_S + 5, GRACE_S, "othervm", 4242))
        monkeypatch.setattr(time, "time", lambda: plan.wait_until + 1.0)
        return False

    wait_for_predecessor(plan, store, wait, lambda reason, code: stops.append((reason, code)), resumed=plan.resumed)
    assert stops and stops[0][1] == 2 and f"job {JOB} is already running" in stops[0][0], stops
