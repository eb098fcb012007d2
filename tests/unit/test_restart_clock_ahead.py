"""A dead predecessor whose clock ran ahead does not make its successor wait out the skew.

The review's skew.sh: ``driver-alive.json`` of a dead driver on another machine whose clock ran 1 h ahead; the
restart said "last alive -3595s ago ... waiting 3672s". A dead driver was not alive after now, so its sign of life
counts as now at the latest: the wait is its workers' grace and a last checkpoint. A driver that is in fact alive
refreshes its entry during that wait, and is still found then (the restart stops, naming it).

The review's skew_claim.sh: the same dead driver had itself been a restart, so it had claimed driver generation 1
(``drivers/1.json``) with its clock, an hour ahead too. After the now-short wait its claim looked renewed "within
the last 20 s" and the restart ended, exit 2, "another driver ... restarted it first ... and still waits or runs"
(and so did every retry). A claim dated ahead of this clock counts as live only if it is renewed during the wait.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, write_job_record
from cloud_elastic.checkpoint.alive import DriverAlive, write_driver_alive
from cloud_elastic.checkpoint.claims import claim, renew
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


def _wait_past_the_plan(plan, monkeypatch: pytest.MonkeyPatch, meanwhile=lambda: None):
    def wait(seconds: float) -> bool:  # what the other driver does meanwhile; time passes
        meanwhile()
        monkeypatch.setattr(time, "time", lambda: plan.wait_until + 1.0)
        return False
    return wait


def test_a_dead_predecessor_that_was_a_restart_and_whose_clock_ran_ahead_does_not_stop_its_successor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, store = _skewed_job(tmp_path, monkeypatch)
    assert claim(store, 1, DriverAlive(JOB, time.time() + AHEAD_S, GRACE_S, "othervm", 4242)) is None
    plan = plan_start(config, store, job_id="second2")
    assert plan.generation == 2 and plan.wait_until is not None and plan.wait_until - time.time() < GRACE_S + 60
    stops: list[tuple[str, int]] = []
    outcome = wait_for_predecessor(plan, store, _wait_past_the_plan(plan, monkeypatch),
                                   lambda reason, code: stops.append((reason, code)), resumed=plan.resumed)
    assert stops == [] and outcome.resumed and outcome.predecessor_gone


def test_an_older_driver_whose_clock_runs_ahead_and_renews_its_claim_during_the_wait_is_still_yielded_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, store = _skewed_job(tmp_path, monkeypatch)
    assert claim(store, 1, DriverAlive(JOB, time.time() + AHEAD_S, GRACE_S, "othervm", 4242)) is None
    plan = plan_start(config, store, job_id="second2")
    stops: list[tuple[str, int]] = []

    def renewed() -> None:  # it waits too, renewing its claim with its clock
        renew(store, 1, DriverAlive(JOB, time.time() + AHEAD_S + 5, GRACE_S, "othervm", 4242))

    wait_for_predecessor(plan, store, _wait_past_the_plan(plan, monkeypatch, renewed),
                         lambda reason, code: stops.append((reason, code)), resumed=plan.resumed)
    assert stops[:1] == [(f"job {JOB}: another driver (pid 4242 on othervm) restarted it first (driver generation 1; "
                          "this one is 2) and still waits or runs; not running it twice", 2)], stops
