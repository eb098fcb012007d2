"""A restarted driver adopts its predecessor's running workers (ElasticJob.adopt / end_adoption)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from cloud_elastic.driver.job.exit_status import ExitStatus
from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.driver.job.elastic_job import ElasticJob, Launch, Phase, Policy
from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.protocol import AdoptRequest, PollReply, RankInfo
from cloud_elastic.providers.api import DiscoveredHosts

pytestmark = pytest.mark.timeout(10)


def _job(np: int = 2) -> ElasticJob:
    job = ElasticJob(Policy(np, np, np, checkpointing=True), HostManager(Blacklist((10.0, 300.0), random.Random(0))),
                     job_id="t", resumed=True)
    job.start(0.0)
    job.begin_adoption(last_seq=7)
    return job


def _request(rank: int, size: int = 2, round_: int = 3, commits: int = 40, seen_abort: int = 2) -> AdoptRequest:
    return AdoptRequest(round_, RankInfo(rank, size, 0, 1, rank, size), update_gen=4, seen_update=5,
                        seen_abort=seen_abort, commits=commits, slot=0, pid=100 + rank, commit_seq=commits)


def test_a_complete_round_goes_on_without_a_new_round_or_a_rollback() -> None:
    job = _job()
    assert job.adopt("a[0]#6", Slot("a", 0), 6, _request(0), 1.0) is None
    assert job.adopt("b[0]#7", Slot("b", 0), 7, _request(1), 1.0) is None
    job.end_adoption(2.0, {})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    assert job.phase is Phase.RUNNING and job.round == 3 and job.abort_round == 2
    assert not [a for a in job.take_actions() if isinstance(a, Launch)], "adopted slots were launched again"
    assert not [k for k, _ in job.take_events() if k in ("round_formed", "rollback")]
    # The driver continues from what the workers have seen, so nothing they know goes backwards.
    assert job.heartbeat("a[0]#6", 3.0, 41) == PollReply(3, 5, 2, False)
    assert job.rank_of("b[0]#7") == 1


def test_a_worker_that_had_not_joined_a_round_yet_is_admitted_later_without_aborting_the_round() -> None:
    job = _job(np=3)
    job.adopt("a[0]#6", Slot("a", 0), 6, _request(0), 1.0)
    job.adopt("b[0]#7", Slot("b", 0), 7, _request(1), 1.0)
    # Launched by the dead driver, still on its way to its first rendezvous.
    newcomer = AdoptRequest(0, None, update_gen=0, seen_update=0, seen_abort=0, commits=0, slot=0, pid=300)
    assert job.adopt("c[0]#8", Slot("c", 0), 8, newcomer, 1.0) is None
    job.end_adoption(2.0, {"d[0]#9": "did not re-register within 10s"})  # another one that never started
    job.discovered(DiscoveredHosts({"a": 1, "b": 1, "c": 1}), 2.0)
    assert job.abort_round == 2, "the adopted round is complete: nothing to roll back"
    assert not [k for k, _ in job.take_events() if k == "rollback"]
    # The newcomer arrives at rendezvous: the round is asked to change at its next commit, as for any newcomer.
    job.rendezvous("c[0]#8", 0, "start", 3.0)
    job.tick(3.0)
    assert job.heartbeat("a[0]#6", 3.0, 41).update_gen > 5
    job.rendezvous("a[0]#6", 3, "update", 3.5, commits=42)
    job.rendezvous("b[0]#7", 3, "update", 3.5, commits=42)
    assert [job.assignment(w).round for w in ("a[0]#6", "b[0]#7", "c[0]#8")] == [4, 4, 4]


def test_an_incomplete_round_is_aborted_and_the_survivor_keeps_the_state() -> None:
    job = _job()
    job.adopt("a[0]#6", Slot("a", 0), 6, _request(0), 1.0)
    job.end_adoption(2.0, {"b[0]#7": "did not re-register within 10s"})
    assert job.abort_round == 3, "the survivors' round must be aborted so that they roll back and re-form"
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    launches = [a for a in job.take_actions() if isinstance(a, Launch)]
    assert [a.slot for a in launches] == [Slot("b", 0)]
    assert launches[0].worker_id == "b[0]#8", "a new worker id must never repeat an adopted one"
    job.rendezvous("a[0]#6", 3, "failure", 3.0, commits=40)
    job.registered("b[0]#8", 3.0)
    job.rendezvous("b[0]#8", 0, "start", 3.0)
    a, b = job.assignment("a[0]#6"), job.assignment("b[0]#8")
    assert a.round == b.round == 4 and a.ranks.rank == 0 and a.needs_sync and not a.from_checkpoint


def test_a_late_worker_is_refused_once_the_window_has_closed() -> None:
    job = _job()
    job.adopt("a[0]#6", Slot("a", 0), 6, _request(0), 1.0)
    job.end_adoption(2.0, {})
    assert "closed" in job.adopt("b[0]#7", Slot("b", 0), 7, _request(1), 3.0)
    assert job.adopt("a[0]#6", Slot("a", 0), 6, _request(0), 3.0) is None, "adopting twice is harmless"


def test_an_adopt_request_round_trips_and_a_malformed_one_names_the_field() -> None:
    request = _request(1)
    assert AdoptRequest.from_wire(request.to_wire()) == request
    with pytest.raises(ControlPlaneError, match="'commits'"):
        AdoptRequest.from_wire(dict(request.to_wire(), commits=-1))
    with pytest.raises(ControlPlaneError, match="ranks out of range"):
        AdoptRequest.from_wire(dict(request.to_wire(), ranks=dict(request.to_wire()["ranks"], rank=2)))
    with pytest.raises(ControlPlaneError, match="a round needs ranks"):
        AdoptRequest.from_wire(dict(request.to_wire(), ranks=None))


def test_an_adopted_process_that_ends_is_reported_without_a_made_up_exit_code() -> None:
    import subprocess
    import sys

    from cloud_elastic.driver.restart.record import AdoptedLocalProcess
    from cloud_elastic.driver.launch.api import WorkerSpec
    from cloud_elastic.driver.launch.local import process_start_time

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    spec = WorkerSpec("127.0.0.1[0]#1", "127.0.0.1", 0, ("python",), {}, "s", "/")
    handle = AdoptedLocalProcess(spec, proc.pid, process_start_time(proc.pid))
    assert handle.poll() is None
    handle.terminate(grace_s=5.0)
    proc.wait(5)  # reaped here, as the worker's real parent (the dead driver's init) would
    status = handle.poll()
    assert status is not None and not status.known
    assert "exit code is unknown" in status.describe and "code 1" not in status.describe


def test_the_no_progress_watch_of_an_adopted_round_starts_when_it_is_adopted() -> None:
    """A restarted driver's clock is the machine's monotonic time (hours, on a CI runner): the adopted
    round's watch must count from the adoption, not from zero, or it is "stalled" the moment it is adopted."""
    job = ElasticJob(Policy(2, 2, 2, checkpointing=True, progress_timeout_s=60),
                     HostManager(Blacklist((10.0, 300.0), random.Random(0))), job_id="t", resumed=True)
    up = 23_000.0  # seconds since the machine booted
    job.start(up)
    job.begin_adoption(last_seq=7)
    job.adopt("a[0]#6", Slot("a", 0), 6, _request(0), up + 1)
    job.adopt("b[0]#7", Slot("b", 0), 7, _request(1), up + 1)
    job.end_adoption(up + 2, {})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), up + 2)
    def quiet_second(t: float) -> None:  # heartbeats, but no sign of progress in them
        for w in ("a[0]#6", "b[0]#7"):
            job.heartbeat(w, up + t, 40)
        job.tick(up + t)

    for t in range(3, 60):  # for less than the bound
        quiet_second(t)
    assert not [k for k, _ in job.take_events() if k == "round_stalled"], "an adopted round looked stalled at once"
    assert job.abort_round == 2
    for t in range(60, 70):  # past the bound: the watch does work for the adopted round
        quiet_second(t)
    assert [k for k, _ in job.take_events() if k == "round_stalled"] == ["round_stalled"]


def _finish_adopted(job: ElasticJob, told: dict[str, int | None], t: float = 5.0) -> None:
    """The adopted workers say at exit what code they exit with (``told``: None says nothing), then end, unreaped."""
    for worker_id, code in told.items():
        job.exiting(worker_id, t)
        job.adoption.exiting(worker_id, code, "RuntimeError: the final save failed" if code else None)
        job.exited(worker_id, ExitStatus(1, known=False), t)  # not our child: its real status went elsewhere
    job.tick(t + 1)


@pytest.mark.parametrize("told, success", [({"a[0]#6": 0, "b[0]#7": 0}, True),
                                           ({"a[0]#6": 1, "b[0]#7": 0}, False),
                                           ({"a[0]#6": 0, "b[0]#7": None}, False)])
def test_an_adopted_worker_ending_after_training_ends_the_job_by_the_exit_code_it_said(told, success) -> None:
    """A restarted driver cannot reap what it adopted: a failure after training (a final save that raised) must
    fail the job, and an exit it was told nothing of must not pass for a success either."""
    job = _job()
    job.adopt("a[0]#6", Slot("a", 0), 6, _request(0), 1.0)
    job.adopt("b[0]#7", Slot("b", 0), 7, _request(1), 1.0)
    job.end_adoption(2.0, {})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    assert job.completed("a[0]#6", 3.0)[0] == job.completed("b[0]#7", 3.0)[0] == "done"
    _finish_adopted(job, told)
    assert job.outcome is not None and (job.outcome.success, job.outcome.exit_code) == (success, 0 if success else 1)
    if told["a[0]#6"]:
        assert "exited with code 1 after its training function returned" in job.outcome.reason
    elif not success:
        assert "exit code is unknown" in job.outcome.reason


def test_workers_adopted_after_their_training_returned_finish_without_training_again() -> None:
    """The predecessor died during the work after training (a final save): the workers come back completed, and the
    job waits for their exit instead of taking them for members that ended without completing (which relaunched
    workers from the checkpoint, ran the training function and the final save again)."""
    job = _job()
    job.adopt("a[0]#6", Slot("a", 0), 6, replace(_request(0), completed=True), 1.0)
    job.adopt("b[0]#7", Slot("b", 0), 7, replace(_request(1), completed=True), 1.0)
    job.end_adoption(2.0, {})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    job.adoption.finish(2.0)  # the window closes once discovery has answered
    assert job.phase is Phase.FINISHING and job.abort_round == 2
    assert [job.workers[w].state.value for w in ("a[0]#6", "b[0]#7")] == ["completed", "completed"]
    assert not [a for a in job.take_actions() if isinstance(a, Launch)], "workers were launched to train again"
    for t in (3.0, 20.0, 40.0):  # the final save takes its time while they heartbeat
        for w in ("a[0]#6", "b[0]#7"):
            job.heartbeat(w, t, 40)
        job.tick(t)
    assert job.outcome is None
    _finish_adopted(job, {"a[0]#6": 0, "b[0]#7": 0}, 41.0)
    assert job.outcome is not None and job.outcome.success, job.outcome
    assert "after 0 reset(s)" in job.outcome.reason


@pytest.mark.parametrize("reports, says", [({}, "rank 1 left no exit code (killed, or its report could not be read)"),
                                           ({1: ("b[0]#7", 3)}, "rank 1 (b[0]#7) exited with code 3 after its"),
                                           ({1: ("b[0]#7", 0)}, None),
                                           ({0: ("b[0]#7", 0)}, "rank 1 left no exit code")])
def test_a_member_that_exited_after_the_training_completed_is_judged_by_its_exit_report(reports, says) -> None:
    """Only rank 0 saves after training: rank 1 exited at once, and the driver died during rank 0's save. Rank 1's
    exit report (read by the window) says how it ended: code 0 is a success (it failed 'did not come back'), a
    non-zero code or no report at all fails the job, naming the rank; nothing trains again either way."""
    job = _job()
    job.adopt("a[0]#6", Slot("a", 0), 6, replace(_request(0), completed=True), 1.0)
    job.end_adoption(2.0, {"b[0]#7": "did not re-register within 10s"})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    job.adoption.finish(2.0, reports)
    assert job.phase is Phase.FINISHING and job.abort_round == 2
    # Discovery found the missing member's slot empty before the window closed: nothing is launched into it (a
    # worker was, and stopped at once: 'the job completed before it joined').
    assert not [a for a in job.take_actions() if isinstance(a, Launch)]
    _finish_adopted(job, {"a[0]#6": 0})
    assert job.outcome is not None and job.outcome.success is (says is None), job.outcome
    if says:
        assert says in job.outcome.reason and "before the driver restart" in job.outcome.reason


def test_an_adopt_request_says_whether_the_training_function_returned() -> None:
    request = replace(_request(1), completed=True)
    assert AdoptRequest.from_wire(request.to_wire()) == request
    assert not AdoptRequest.from_wire({k: v for k, v in request.to_wire().items() if k != "completed"}).completed
    with pytest.raises(ControlPlaneError, match="'completed'"):
        AdoptRequest.from_wire(dict(request.to_wire(), completed="yes"))


@pytest.mark.parametrize("code, says", [(0, None), (3, "rank 1 (b[0]#7) exited with code 3 after its training")])
def test_a_member_that_exited_while_the_driver_was_up_is_judged_by_the_code_the_driver_recorded(
        code, says, tmp_path, monkeypatch) -> None:
    """The common order: rank 1 (it saves nothing) exits after training while the driver is still up, and the driver
    dies during rank 0's final save. The adoption record lists running workers only, so the restarted driver asked
    nobody about rank 1 and failed a finished job ('rank 1 left no exit code'); the dead driver had seen its exit and
    keeps it in the record, which the restarted one reads."""
    import threading

    from cloud_elastic.driver.restart.record import SuccessorRecord, read_record
    from cloud_elastic.driver.restart.window import AdoptionWindow
    from cloud_elastic.records import job_dir

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    directory = job_dir("t")
    directory.mkdir(parents=True, mode=0o700)
    (directory / "secret").write_text("s3cret")
    first = _job()
    for rank, worker_id in enumerate(("a[0]#6", "b[0]#7")):
        first.adopt(worker_id, Slot(worker_id[0], 0), 6 + rank, _request(rank), 1.0)
    first.end_adoption(2.0, {})
    first.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    assert first.completed("a[0]#6", 3.0)[0] == first.completed("b[0]#7", 3.0)[0] == "done"
    first.exiting("b[0]#7", 4.0)
    first.exited("b[0]#7", ExitStatus(code), 4.0)
    SuccessorRecord("t", "/ckpt", 60.0).update(advertised="h", bind="h", control_port=1, store_port=2, seq=7,
                                               workers=[("a[0]#6", "a", 0, 6, lambda: {"kind": "ssh", "nonce": "aa"})],
                                               exited=first.adoption.exits())
    record = read_record(directory)
    assert record is not None and [w.worker_id for w in record.workers] == ["a[0]#6"]

    job = _job()  # the restarted driver: rank 0 comes back, rank 1 does not (no report anywhere but the record)
    job.adopt("a[0]#6", Slot("a", 0), 6, replace(_request(0), completed=True), 1.0)
    job.end_adoption(2.0, {"b[0]#7": "did not re-register within 10s"})
    job.discovered(DiscoveredHosts({"a": 1, "b": 1}), 2.0)
    cond = threading.Condition()
    AdoptionWindow(record, job, cond, rules=lambda kind, msg: {}, clock=lambda: 2.0, started_at=0.0,
                   heartbeat_timeout_s=1.0, rendezvous_hold_s=1.0).close()
    _finish_adopted(job, {"a[0]#6": 0})
    assert job.outcome is not None and job.outcome.success is (says is None), job.outcome
    if says:
        assert says in job.outcome.reason, job.outcome


def test_a_recorded_exit_that_is_not_an_exit_report_counts_for_nothing(tmp_path, caplog) -> None:
    from cloud_elastic.driver.restart.record import AdoptionRecord, recorded_exits

    good = {"v": 1, "round": 3, "rank": 1, "code": 0, "error": None, "id": "b[0]#7"}
    record = AdoptionRecord("t", "/c", "h", "h", 1, 2, 60.0, 7, (), "s", exited=(
        good, dict(good, rank=2, round=2), dict(good, rank=3, code="0"), dict(good, rank=4, id=None), "junk"))
    assert recorded_exits(record, 3) == {1: ("b[0]#7", 0)}
    assert len([r for r in caplog.records if "cannot use an exit the previous driver recorded" in r.getMessage()]) == 3
