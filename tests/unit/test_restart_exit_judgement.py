"""A restarted driver judges the members of a finished round that did not come back: which source of their exit code
wins (the code a driver recorded from the process's real exit status is final; a worker-written report only fills a
rank with no recorded code), and that the judgement survives a second restart (review rv9 of 267b006 + a453236)."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest

from cloud_elastic.driver.job.elastic_job import ElasticJob, Phase, Policy
from cloud_elastic.driver.job.exit_status import ExitStatus
from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.driver.restart import window as window_module
from cloud_elastic.driver.restart.record import SuccessorRecord, read_record, recorded_exits
from cloud_elastic.driver.restart.window import AdoptionWindow
from cloud_elastic.protocol import AdoptRequest, RankInfo
from cloud_elastic.providers.api import DiscoveredHosts
from cloud_elastic.records import exit_report_path, job_dir

pytestmark = pytest.mark.timeout(10)

A, B = "a[0]#6", "b[0]#7"  # rank 0 (it saves after training) and rank 1 (it exits at once)


@pytest.fixture
def directory(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = job_dir("t")
    path.mkdir(parents=True, mode=0o700)
    (path / "secret").write_text("s3cret")
    return path


def _job() -> ElasticJob:
    job = ElasticJob(Policy(2, 2, 2, checkpointing=True), HostManager(Blacklist((10.0, 300.0), random.Random(0))),
                     job_id="t", resumed=True)
    job.start(0.0)
    job.begin_adoption(last_seq=7)
    return job


def _request(rank: int, completed: bool = False) -> AdoptRequest:
    return AdoptRequest(3, RankInfo(rank, 2, 0, 1, rank, 2), update_gen=4, seen_update=5, seen_abort=2, commits=40,
                        slot=0, pid=100 + rank, commit_seq=40, completed=completed)


def _keep(job: ElasticJob, running: tuple[str, ...] = (A,)) -> None:
    """The driver keeps its adoption record (``Driver._keep_adoption_record``): ``running`` workers and its exits."""
    SuccessorRecord("t", "/ckpt", 60.0).update(
        advertised="h", bind="h", control_port=1, store_port=2, seq=7,
        workers=[(w, w[0], 0, 6, lambda w=w: {"kind": "ssh", "nonce": w[0] * 2}) for w in running],
        exited=job.adoption.exits())


def _driver_with_rank_1_exited(status: ExitStatus | None, told: int | None = None) -> ElasticJob:
    """Driver A: both ranks completed; rank 1 said it exits with ``told`` and its process ended with ``status``
    (None: it still runs)."""
    job = _job()
    for rank, worker_id in enumerate((A, B)):
        job.adopt(worker_id, Slot(worker_id[0], 0), 6 + rank, _request(rank), 1.0)
    job.end_adoption(2.0, {})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    assert job.completed(A, 3.0)[0] == job.completed(B, 3.0)[0] == "done"
    if status is None:
        return job
    job.exiting(B, 4.0)
    job.adoption.exiting(B, told, None)
    job.exited(B, status, 4.0)
    return job


def _restarted(directory: Path, fetched: dict[int, tuple[str, int | None]] | None = None,
               monkeypatch: pytest.MonkeyPatch | None = None) -> ElasticJob:
    """A restarted driver: rank 0 comes back after its training function returned, rank 1 does not; the window
    closes with the record in ``directory`` (and ``fetched``: the reports fetched from SSH hosts)."""
    record = read_record(directory)
    assert record is not None
    job = _job()
    job.adopt(A, Slot("a", 0), 6, _request(0, completed=True), 1.0)
    job.end_adoption(2.0, {B: "did not re-register within 10s"})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    window = AdoptionWindow(record, job, threading.Condition(), rules=lambda kind, msg: {}, clock=lambda: 2.0,
                            started_at=0.0, heartbeat_timeout_s=1.0, rendezvous_hold_s=1.0)
    if fetched is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(window_module, "fetch_exit_reports", lambda *a, **k: fetched)
        window.fetch_exit_reports(record.workers, lambda host: None, lambda w: None, 1.0)  # type: ignore[arg-type]
    window.close()
    assert job.phase is Phase.FINISHING
    return job


def _end(job: ElasticJob) -> None:
    """Rank 0 (adopted, not our child) ends its work after training and says it exits 0."""
    job.exiting(A, 5.0)
    job.adoption.exiting(A, 0, None)
    job.exited(A, ExitStatus(1, known=False), 5.0)
    job.tick(6.0)


def _report(worker_id: str, code: int | None) -> None:
    path = exit_report_path("t", worker_id)
    assert path is not None
    path.write_text(json.dumps({"v": 1, "round": 3, "rank": 1, "code": code, "error": None}))


@pytest.mark.parametrize("source", ["local", "fetched"])
def test_a_crash_the_driver_recorded_is_not_hidden_by_the_report_the_worker_wrote_before_it(
        source, directory, monkeypatch) -> None:
    """rv9 L1: rank 1's exit hook said 'exiting 0' and left its report with code 0, then its process died of SIGABRT
    in teardown. The live driver recorded -6; the restarted one let the worker's 0 replace it and reported success."""
    _keep(_driver_with_rank_1_exited(ExitStatus(-6), told=0))
    if source == "local":
        _report(B, 0)
    job = _restarted(directory, {1: (B, 0)} if source == "fetched" else None, monkeypatch)
    _end(job)
    assert job.outcome is not None and not job.outcome.success, job.outcome
    assert f"rank 1 ({B}) was killed by SIGABRT after its training function returned" in job.outcome.reason


@pytest.mark.parametrize("recorded, report, success", [
    (None, 0, True),  # the driver could not learn it (transport): the worker's report fills it in
    (None, None, False),  # unknown everywhere: never 0
    ("said 0", -6, False),  # an adopting driver had only the worker's word: its host's report (the wrapper's) wins
    ("said 0", None, True),  # ... but a report that knows no code hides none
])
def test_a_report_fills_only_a_rank_whose_recorded_code_is_not_the_real_exit_status(
        recorded, report, success, directory, monkeypatch) -> None:
    if recorded is None:
        status, told = ExitStatus(255, "SSH failure on b (not a worker failure): connection lost"), None
    else:
        status, told = ExitStatus(1, known=False), 0  # adopted: not its child
    _keep(_driver_with_rank_1_exited(status, told))
    job = _restarted(directory, {1: (B, report)}, monkeypatch)
    _end(job)
    assert job.outcome is not None and job.outcome.success is success, job.outcome


@pytest.mark.parametrize("first, fetched, success, says", [
    ((ExitStatus(0), 0), None, True, None),  # A saw rank 1 exit 0 (s2's order: rank 1 exits before A dies)
    ((ExitStatus(-6), 0), None, False, f"rank 1 ({B}) was killed by SIGABRT"),  # A's crash stays final
    (None, (B, 0), True, None),  # rank 1 was running when A died: B fetched its report from its host
    (None, (B, 3), False, f"rank 1 ({B}) exited with code 3"),
    (None, (B, None), False, "rank 1 left no exit code"),
])
def test_a_second_restart_judges_a_rank_that_did_not_come_back_as_the_first_did(
        first, fetched, success, says, directory, monkeypatch) -> None:
    """rv9 S2: driver B judged rank 1 from A's record (or from the report it fetched over ssh) but its own adopt.json
    kept only the exits it saw itself; driver C, restarted after B died too, asked nobody about rank 1 and failed a
    finished job ('rank 1 left no exit code'). B now carries its judgement."""
    if first is not None:
        _keep(_driver_with_rank_1_exited(*first))
    else:  # A died while both ranks ran their work after training: both in its record
        _keep(_driver_with_rank_1_exited(None), running=(A, B))
    b = _restarted(directory, {1: fetched} if fetched else None, monkeypatch)
    _keep(b)  # B dies during rank 0's final save, before rank 0 exits
    for path in directory.glob(".exit-*.json"):
        path.unlink()  # nothing on this machine says anything of rank 1 (an SSH rank): only B's record
    c = _restarted(directory, {}, monkeypatch)
    _end(c)
    assert c.outcome is not None and c.outcome.success is success, c.outcome
    if says:
        assert says in c.outcome.reason, c.outcome


def test_the_record_keeps_as_many_exits_as_a_successor_reads_and_a_rank_beyond_is_unknown(directory) -> None:
    """The reader keeps the first 4096 exits of a record; the writer wrote them all (a record of any size). It now
    writes as many as are read: a rank beyond them has an unknown exit code (it fails a finished job), never 0."""
    exited = [{"v": 1, "round": 3, "rank": rank, "code": 0, "error": None, "id": f"h[{rank}]#{rank}"}
              for rank in range(5000)]
    SuccessorRecord("t", "/ckpt", 60.0).update(advertised="h", bind="h", control_port=1, store_port=2, seq=7,
                                               workers=[], exited=exited)
    assert len(json.loads((directory / "adopt.json").read_text())["exited"]) == 4096
    record = read_record(directory)
    assert record is not None
    found = recorded_exits(record, 3)
    assert found[4095] == ("h[4095]#4095", 0) and 4096 not in found


def test_an_exit_recorded_with_the_workers_word_says_so_and_an_older_record_counts_as_the_real_status() -> None:
    """The flag that tells the worker's word from the process's status: absent (a record of an older driver) the
    recorded code is final."""
    from cloud_elastic.driver.restart.record import AdoptionRecord

    entry = {"v": 1, "round": 3, "rank": 1, "code": 0, "error": None, "id": B}
    record = AdoptionRecord("t", "/c", "h", "h", 1, 2, 60.0, 7, (), "s",
                            exited=(entry, dict(entry, rank=2, said=True), dict(entry, rank=3, said="yes")))
    assert recorded_exits(record, 3) == {1: (B, 0), 2: (B, 0)}
    assert recorded_exits(record, 3, final=True) == {1: (B, 0)}

