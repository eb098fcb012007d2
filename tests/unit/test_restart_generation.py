"""Two drivers restarted at once on a job whose job.json exists: each claims the next driver generation
beside the checkpoints (drivers/<generation>.json, created only where there is none), so one of them runs
the job and the other stops, naming it, before it launches anything."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, write_job_record
from cloud_elastic.checkpoint.alive import DriverAlive, write_driver_alive
from cloud_elastic.checkpoint.backend import LocalBackend
from cloud_elastic.checkpoint.claims import KEEP
from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart.predecessor import CLAIM_LIVE_S, plan_start, wait_for_predecessor
from cloud_elastic.errors import ConfigError
from tests.unit.test_start_claim import start_driver
from tests.unit.test_start_plan import live_driver

pytestmark = pytest.mark.timeout(60)

JOB = "job11111"


def _config(ckpt: str) -> JobConfig:
    return JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2, checkpoint_dir=ckpt)


def _ended_job(ckpt: str, *, stopped: bool) -> None:
    """The store of a job whose driver on another machine ended an hour ago: cleanly, or crashed."""
    store = CheckpointStore(ckpt)
    write_job_record(store, DurableJobRecord(JOB, ("python", "train.py"), time.time() - 7200, extra={
        "driver_grace_s": 30.0, "driver": {"host": "driver-vm-1", "pid": 1111}}))
    write_driver_alive(store, DriverAlive(JOB, time.time() - 3600, 30.0, "driver-vm-1", 1111, stopped=stopped))


def _claimed(ckpt: str, generation: int, host: str, pid: int, ago: float = 0.0) -> None:
    """The claim a driver that won ``generation`` ``ago`` seconds ago wrote, before its first sign of life."""
    entry = DriverAlive(JOB, time.time() - ago, 30.0, host, pid)
    path = Path(ckpt) / "drivers" / f"{generation}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": "cloud-elastic-checkpoint", "generation": generation, **entry.__dict__,
                                "raised": {}}))


def _claim_of(ckpt: str, generation: int) -> dict:
    return json.loads((Path(ckpt) / "drivers" / f"{generation}.json").read_text())


class _Meeting(LocalBackend):
    """Storage where each driver's first look at the claims returns only once both have looked: both see the
    same newest claim, as two drivers restarted at the same moment do."""

    def __init__(self, root: str, barrier: threading.Barrier) -> None:
        super().__init__(root)
        self._barrier, self._met = barrier, False

    def children(self, path):
        try:
            return super().children(path)
        finally:
            if path == "drivers" and not self._met:
                self._met = True
                self._barrier.wait(timeout=20)


@pytest.mark.parametrize("stopped", [True, False], ids=["ended-cleanly", "crashed-long-ago"])
def test_two_drivers_restarted_at_once_one_runs_the_job_and_the_other_stops_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: bool) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _ended_job(ckpt, stopped=stopped)
    barrier = threading.Barrier(2)

    def start(name: str) -> object:
        try:
            return plan_start(_config(ckpt), CheckpointStore(ckpt, backend=_Meeting(ckpt, barrier)), job_id=name)
        except ConfigError as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(start, ("first", "second"), timeout=30))
    plans = [v for v in outcomes if not isinstance(v, ConfigError)]
    errors = [str(v) for v in outcomes if isinstance(v, ConfigError)]
    assert len(plans) == 1 and len(errors) == 1, outcomes
    assert plans[0].job_id == JOB
    assert errors == [f"another driver (pid {os.getpid()} on {socket.gethostname()}) restarted job {JOB} (driver "
                      f"generation 1) on {ckpt} at the same moment; not running it twice: stop that driver first or "
                      "use another --checkpoint-dir"]
    assert _claim_of(ckpt, 1)["pid"] == os.getpid() and sorted(os.listdir(Path(ckpt) / "drivers")) == ["1.json"]


def test_a_restart_after_the_winner_died_and_its_grace_passed_claims_the_next_generation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _ended_job(ckpt, stopped=False)
    _claimed(ckpt, 1, "driver-vm-2", 4242, ago=3000)  # it ran, crashed 100 s after its last sign of life
    write_driver_alive(CheckpointStore(ckpt), DriverAlive(JOB, time.time() - 100, 30.0, "driver-vm-2", 4242))
    plan = plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert plan.job_id == JOB and plan.wait_until is not None and plan.wait_until < time.time()
    assert "(pid 4242 on driver-vm-2) was last alive 100s ago by" in plan.waiting_for
    claim = _claim_of(ckpt, 2)
    assert (claim["generation"], claim["host"], claim["pid"], claim["job_id"]) == (
        2, socket.gethostname(), os.getpid(), JOB)


def test_a_driver_restarted_just_after_another_claimed_elsewhere_waits_on_that_claim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _ended_job(ckpt, stopped=True)
    _claimed(ckpt, 1, "driver-vm-2", 4242)  # driver-alive.json is still its predecessor's
    plan = plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    # As for any driver elsewhere: a sign of life written during the wait ends this start.
    assert plan.wait_until is not None and plan.wait_until > time.time() + 30
    assert plan.waiting_for.startswith("the previous driver (pid 4242 on driver-vm-2) was last alive")
    assert plan.waiting_for.endswith(f"ago by {ckpt}/drivers/1.json, and this machine has no record of it")


def _short_wait(seconds: float) -> bool:
    time.sleep(min(seconds, 0.1))
    return False


def _waited(plan, ckpt: str) -> list[tuple[str, int]]:
    """The stops of ``plan``'s wait for its predecessor, cut to a moment (the rules after it are what count)."""
    stops: list[tuple[str, int]] = []
    wait_for_predecessor(replace(plan, wait_until=time.time() + 0.3), CheckpointStore(ckpt), _short_wait,
                         lambda reason, code: stops.append((reason, code)), resumed=False)
    return stops


def _predecessor_alive_elsewhere(ckpt: str) -> None:
    _ended_job(ckpt, stopped=False)
    write_driver_alive(CheckpointStore(ckpt), DriverAlive(JOB, time.time() - 5, 30.0, "driver-vm-1", 1111))


def test_of_two_drivers_waiting_out_a_predecessor_the_one_that_claimed_first_runs_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither writes a sign of life while it waits; each renews its claim. A driver restarted after this one
    # (generation 2) does not stop this one: it yields (below), so supervisors restarting both never make them
    # take turns for good.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _predecessor_alive_elsewhere(ckpt)
    plan = plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert plan.generation == 1 and plan.wait_until is not None and plan.wait_until > time.time()
    claimed_at = _claim_of(ckpt, 1)["alive"]
    _claimed(ckpt, 2, "driver-vm-3", 5151)  # started elsewhere while this one waits
    assert _waited(plan, ckpt) == []
    assert _claim_of(ckpt, 1)["alive"] > claimed_at  # renewed while it waited


def test_a_driver_that_claimed_after_another_still_waiting_yields_to_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _predecessor_alive_elsewhere(ckpt)
    _claimed(ckpt, 1, "driver-vm-2", 4242)  # restarted a moment before this one, and waiting too
    plan = plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert plan.generation == 2
    _claimed(ckpt, 1, "driver-vm-2", 4242)  # its renewal, as this one's wait ends
    assert _waited(plan, ckpt) == [(
        f"job {JOB}: another driver (pid 4242 on driver-vm-2) restarted it first (driver generation 1; this one is "
        "2) and still waits or runs; not running it twice", 2)]


def test_an_older_claim_no_longer_renewed_does_not_hold_a_driver_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _predecessor_alive_elsewhere(ckpt)
    _claimed(ckpt, 1, "driver-vm-2", 4242, ago=CLAIM_LIVE_S + 1)  # it died while it waited
    plan = plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert plan.generation == 2 and _waited(plan, ckpt) == []


def test_a_driver_restarted_just_after_another_claimed_here_is_refused_until_that_one_died(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _ended_job(ckpt, stopped=True)
    with live_driver() as pid:
        _claimed(ckpt, 1, socket.gethostname(), pid)
        with pytest.raises(ConfigError, match=f"^job {JOB} is already running here \\(driver pid {pid}\\)"):
            plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert not (Path(ckpt) / "drivers" / "2.json").exists()  # a refused start claims nothing
    # Died before its first sign of life: it launched nothing, so nothing is waited for.
    plan = plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert plan.job_id == JOB and plan.wait_until is None and _claim_of(ckpt, 2)["pid"] == os.getpid()


def test_only_the_newest_claims_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _ended_job(ckpt, stopped=True)
    for _ in range(KEEP + 4):
        plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert sorted(int(n.split(".")[0]) for n in os.listdir(Path(ckpt) / "drivers")) == list(range(5, KEEP + 5))


def test_an_unreadable_newest_claim_still_takes_its_generation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    _ended_job(ckpt, stopped=True)
    (Path(ckpt) / "drivers").mkdir()
    (Path(ckpt) / "drivers" / "3.json").write_bytes(b"{" * (5 << 20))  # over the records' bound: never parsed
    with caplog.at_level(logging.WARNING):
        plan_start(_config(ckpt), CheckpointStore(ckpt), job_id="second22")
    assert _claim_of(ckpt, 4)["pid"] == os.getpid()
    assert any(f"{ckpt}/drivers/3.json is unreadable" in r.getMessage() for r in caplog.records)


def test_the_driver_that_loses_a_restart_exits_2_with_one_line_and_launches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = str(tmp_path / "c")
    _ended_job(ckpt, stopped=True)
    create = LocalBackend.create

    def create_after_another_driver(self, path, produce):
        if path.startswith("drivers/"):  # the other driver claims the generation between our look and our create
            _claimed(ckpt, int(path.split("/")[1].split(".")[0]), "driver-vm-2", 4242)
        return create(self, path, produce)

    monkeypatch.setattr(LocalBackend, "create", create_after_another_driver)
    assert start_driver(monkeypatch, tmp_path, ckpt) == (2, False)
    assert capsys.readouterr().err.splitlines() == [
        f"cloud-elastic: error: another driver (pid 4242 on driver-vm-2) restarted job {JOB} (driver generation 1) "
        f"on {ckpt} at the same moment; not running it twice: stop that driver first or use another "
        "--checkpoint-dir"]
