"""Two drivers started at once on a fresh checkpoint store: the job record is created only where there is
none, so one of them runs the job and the other stops, naming it, before it launches anything."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import _registry

from cloud_elastic.checkpoint import CheckpointStore, DurableJobRecord, read_job_record, write_job_record
from cloud_elastic.checkpoint.backend import LocalBackend
from cloud_elastic.config import JobConfig
from cloud_elastic.driver.restart.predecessor import plan_start
from cloud_elastic.errors import ConfigError
from tests.unit.test_start_plan import live_driver

pytestmark = pytest.mark.timeout(60)


class _Meeting(LocalBackend):
    """Storage where each driver's first look for ``job.json`` returns only once both have looked: both see a
    fresh store, as two drivers started at the same moment do."""

    def __init__(self, root: str, barrier: threading.Barrier) -> None:
        super().__init__(root)
        self._barrier, self._met = barrier, False

    def read(self, path, limit=None):
        try:
            return super().read(path, limit)
        finally:
            if path == "job.json" and not self._met:
                self._met = True
                self._barrier.wait(timeout=20)


def test_two_drivers_racing_on_a_fresh_store_one_runs_the_job_and_the_other_stops_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    config = JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2, checkpoint_dir=ckpt)
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def start(job_id: str) -> None:
        store = CheckpointStore(ckpt, backend=_Meeting(ckpt, barrier))
        try:
            outcomes[job_id] = plan_start(config, store, job_id=job_id)
        except ConfigError as exc:
            outcomes[job_id] = exc

    threads = [threading.Thread(target=start, args=(job_id,)) for job_id in ("aaaa1111", "bbbb2222")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    errors = {k: v for k, v in outcomes.items() if isinstance(v, ConfigError)}
    plans = {k: v for k, v in outcomes.items() if not isinstance(v, ConfigError)}
    assert len(plans) == 1 and len(errors) == 1, outcomes
    (winner, plan), = plans.items()
    assert plan.job_id == winner and read_job_record(CheckpointStore(ckpt)).job_id == winner
    message = str(next(iter(errors.values())))
    assert message == (f"another driver (pid {os.getpid()} on {socket.gethostname()}) started job {winner} on "
                       f"{ckpt} at the same moment; not running it twice: stop that driver first or use another "
                       "--checkpoint-dir")


def test_the_job_record_is_created_only_where_there_is_none(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    first = DurableJobRecord("first111", ("python", "train.py"), time.time())
    assert write_job_record(store, first, only_if_absent=True)
    assert not write_job_record(store, DurableJobRecord("second22", ("python", "x.py"), time.time()),
                                only_if_absent=True)
    assert read_job_record(store).job_id == "first111"
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]  # no temporary file left behind


def start_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, checkpoint_dir: str) -> tuple[int, bool]:
    """``cloud-elastic run ... --checkpoint-dir checkpoint_dir`` in this process: its exit code, and whether it
    launched its worker."""
    import signal

    from cloud_elastic import cli

    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the test process keeps its own handlers
    monkeypatch.setattr(cli, "_setup_logging", lambda verbose: None)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ran = tmp_path / "ran"
    code = cli.main(["run", "-np", "1", "-H", "localhost:1", "--checkpoint-dir", checkpoint_dir,
                     sys.executable, "-c", f"open({str(ran)!r}, 'w')"])
    return code, ran.exists()


def test_the_driver_that_loses_the_race_exits_2_with_one_line_and_launches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    read = LocalBackend.read

    def read_while_another_driver_starts(self, path, limit=None):
        try:
            return read(self, path, limit)
        except FileNotFoundError:
            if path == "job.json":  # the other driver claims the fresh store between our look and our write
                Path(self.root).mkdir(parents=True, exist_ok=True)
                Path(self.url(path)).write_text(json.dumps({
                    "format": "cloud-elastic-checkpoint", "format_version": 1, "job_id": "other123",
                    "command": ["python", "train.py"], "created": 1.0,
                    "extra": {"driver": {"host": "driver-vm-2", "pid": 4242}}}))
            raise

    monkeypatch.setattr(LocalBackend, "read", read_while_another_driver_starts)
    assert start_driver(monkeypatch, tmp_path, str(tmp_path / "c")) == (2, False)
    assert capsys.readouterr().err.splitlines() == [
        f"cloud-elastic: error: another driver (pid 4242 on driver-vm-2) started job other123 on {tmp_path / 'c'} "
        "at the same moment; not running it twice: stop that driver first or use another --checkpoint-dir"]


def test_storage_without_a_conditional_create_checks_first_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(f"memory://ce-{uuid.uuid4().hex}/ckpt")  # fsspec's memory filesystem: no atomic create
    with caplog.at_level(logging.WARNING, logger="cloud_elastic.checkpoint"):
        assert write_job_record(store, DurableJobRecord("first111", ("python", "a.py"), 1.0), only_if_absent=True)
        assert not write_job_record(store, DurableJobRecord("second22", ("python", "b.py"), 2.0),
                                    only_if_absent=True)
    assert read_job_record(store).job_id == "first111"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and all("offers no create-if-absent" in w and "\n" not in w for w in warnings)


def _claimed_by(ckpt: str, host: str, pid: int) -> None:
    """The job record a driver that won the claim a moment ago wrote, before its first sign of life."""
    write_job_record(CheckpointStore(ckpt), DurableJobRecord("first111", ("python", "train.py"), time.time(), extra={
        "driver_grace_s": 30.0, "driver": {"host": host, "pid": pid}}))


def test_a_driver_started_just_after_the_claim_on_this_machine_is_refused_and_not_after_that_driver_died(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    config = JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2, checkpoint_dir=ckpt)
    with live_driver() as pid:
        _claimed_by(ckpt, socket.gethostname(), pid)
        with pytest.raises(ConfigError, match=f"job first111 is already running here \\(driver pid {pid}\\)"):
            plan_start(config, CheckpointStore(ckpt), job_id="second22")
    # Died before its first sign of life: it launched nothing, so nothing is waited for.
    plan = plan_start(config, CheckpointStore(ckpt), job_id="second22")
    assert plan.job_id == "first111" and plan.wait_until is None


def test_a_driver_started_just_after_the_claim_elsewhere_waits_before_it_launches_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ckpt = str(tmp_path / "ckpt")
    config = JobConfig(command=("python", "train.py"), num_proc=2, min_np=1, max_np=2, checkpoint_dir=ckpt)
    _claimed_by(ckpt, "driver-vm-2", 4242)
    plan = plan_start(config, CheckpointStore(ckpt), job_id="second22")
    # Then, as for any driver elsewhere: a sign of life refreshed during the wait ends this start.
    assert plan.job_id == "first111" and plan.wait_until is not None and plan.wait_until > time.time() + 30
    assert plan.waiting_for.startswith("the previous driver (pid 4242 on driver-vm-2) was last alive")
    assert plan.waiting_for.endswith(f"ago by {ckpt}/job.json, and this machine has no record of it")



class _S3Before2024_12(MemoryFileSystem):
    """A real filesystem answering s3:// as s3fs and fsspec before 2024.12.0 did: no mode "xb"."""

    protocol, root_marker = ("s3", "s3a"), ""
    store: dict = {}
    pseudo_dirs = [""]

    @classmethod
    def _strip_protocol(cls, path):
        return str(path).removeprefix("s3://").strip("/")

    def _open(self, path, mode="rb", **kwargs):
        if mode not in {"rb", "wb", "ab"}:
            raise NotImplementedError("File mode not supported")  # fsspec's AbstractBufferedFile, 2024.10.0
        return super()._open(path, mode, **kwargs)


def _too_old(url: str) -> str:
    versions = importlib.metadata.version("s3fs"), importlib.metadata.version("fsspec")
    return (f"{url}: s3fs {versions[0]} with fsspec {versions[1]} cannot create an object only where none is "
            "(open mode 'xb': File mode not supported), which cloud-elastic needs to start a job on it; upgrade: "
            "pip install 's3fs>=2024.12.0' 'fsspec>=2024.12.0'")


@pytest.fixture
def old_s3(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh s3:// URL served by :class:`_S3Before2024_12`."""
    if importlib.util.find_spec("s3fs") is None:  # `run` checks the URL's package is there first
        pytest.skip("s3fs is not installed")
    monkeypatch.setitem(_registry, "s3", _S3Before2024_12)
    monkeypatch.setattr(_S3Before2024_12, "store", {})
    return f"s3://bucket-{uuid.uuid4().hex[:8]}/ckpt"


def test_a_cloud_storage_package_too_old_for_a_create_if_absent_stops_the_run_naming_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, old_s3: str) -> None:
    # Exit code 2: a configuration to fix, not storage that cannot be read (1). Nothing launched, nothing written.
    assert start_driver(monkeypatch, tmp_path, old_s3) == (2, False)
    assert capsys.readouterr().err.splitlines() == [f"cloud-elastic: error: {_too_old(old_s3)}"]
    assert not _S3Before2024_12.store


def test_a_restarted_drivers_claim_on_a_package_too_old_names_what_to_install(old_s3: str) -> None:
    from cloud_elastic.checkpoint.alive import DriverAlive
    from cloud_elastic.checkpoint.claims import claim

    with pytest.raises(ConfigError) as refused:
        claim(CheckpointStore(old_s3), 2, DriverAlive("first111", 1.0, 30.0, "driver-vm", 4242))
    assert str(refused.value) == _too_old(old_s3)
