"""A script without ``hvd.elastic.run`` runs as a fixed-size job (issue 44, finding 11; driver.fixed).

Its workers say so as their scripts end (``completed`` with ``elastic`` false, from the exit hook,
before the exit status): the job then succeeds when every worker exits 0, and a failure fails it
with its reason, or restarts it whole with ``--restarts N``. Scripted on the job's fake clock.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import ExitOrder, Finish, WorkerState
from cloud_elastic.driver.launch.api import ExitStatus
from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, CRASH, KILLED, T0, Sim, assert_round, failed, started

pytestmark = pytest.mark.timeout(10)


def script_ends(sim: Sim, slot: str, status: ExitStatus = CLEAN, error: str | None = None) -> None:
    """The worker on ``slot`` reaches the end of its script (its exit hook reports it), then its process ends."""
    assert sim.job.completed(sim.id(slot), sim.now, steps=20, error=error, elastic=False) == ("done", "")
    sim._collect()
    sim.exit(slot, status)


def kinds(sim: Sim) -> list[str]:
    return [kind for kind, _ in sim.events]


def test_a_plain_horovod_script_whose_workers_all_exit_0_succeeds() -> None:
    sim = started(2, {"a": 2})
    script_ends(sim, "a[1]")
    assert sim.outcome is None  # rank 0 still runs
    script_ends(sim, "a[0]")
    assert sim.outcome == Finish(True, "training completed on 2 worker(s), every one exiting 0 (a fixed-size job: "
                                       "no worker entered hvd.elastic.run)", 0)
    assert "worker_failed" not in kinds(sim) and not sim.blocked("a[0]") and not sim.blocked("a[1]")
    assert sim.slots_launched() == ["a[0]", "a[1]"]


def test_a_worker_that_fails_fails_the_job_at_once_with_its_reason_and_nothing_is_blacklisted() -> None:
    sim = started(3, {"a": 3})
    script_ends(sim, "a[1]", CRASH, error="RuntimeError: CUDA out of memory")
    failed(sim, "worker a[1]#2 (rank 1) exited with code 1: RuntimeError: CUDA out of memory",
           "a fixed-size job: no worker entered hvd.elastic.run")
    assert "all workers failed" not in sim.outcome.reason
    assert not any(sim.blocked(s) for s in ("a[0]", "a[1]", "a[2]"))
    failures = [f for kind, f in sim.events if kind == "worker_failed"]
    assert len(failures) == 1 and failures[0]["exit_code"] == 1 and failures[0]["blacklisted_s"] is None
    # The others are told the job is over (the runtime stops them on Finish).
    assert {sim.job.workers[sim.id(s)].state for s in ("a[0]", "a[2]")} == {WorkerState.EXITING}


def test_a_worker_killed_before_any_report_is_the_reason_once_the_others_fail_after_it() -> None:
    sim = started(2, {"a": 2})
    sim.exit("a[1]", KILLED)  # no exit hook ran: the job does not know yet that the script is not elastic
    assert sim.outcome is None
    # a[0]'s allreduce fails after the abort; the script has no elastic.run to catch it.
    script_ends(sim, "a[0]", CRASH, error="HorovodInternalError: a peer failed")
    failed(sim, "worker a[1]#2 (rank 1) killed by signal 9")
    assert "HorovodInternalError" not in sim.outcome.reason


@pytest.mark.parametrize("dies", ["before the first report", "after it"])
def test_a_spare_that_dies_while_it_waits_is_replaced_and_does_not_fail_the_fixed_size_job(dies) -> None:
    sim = Sim(2, spares=1, min_np=1)
    sim.discover({"a": 1, "b": 1, "c": 1})
    assert_round(sim.join("a[0]", "b[0]"), 1, needs_sync=True)
    sim.join("c[0]")  # the spare waits outside the round
    sim.advance(1)
    if dies == "after it":
        script_ends(sim, "b[0]")
    sim.exit("c[0]", KILLED)  # its spot instance is reclaimed, say
    assert sim.blocked("c[0]") and sim.outcome is None
    if dies == "before the first report":
        script_ends(sim, "b[0]")
    script_ends(sim, "a[0]")
    assert sim.outcome == Finish(True, "training completed on 2 worker(s), every one exiting 0 (a fixed-size job: "
                                       "no worker entered hvd.elastic.run)", 0)


def test_the_worker_that_reported_its_error_first_is_the_reason_though_a_peer_s_exit_is_seen_before_its_own(
) -> None:
    """The failing script reports its error, then its process closes its sockets as it exits; its peer's
    allreduce fails at that, and the peer's exit can be reaped first. The reason is still the root cause."""
    sim = started(2, {"a": 2})
    assert sim.job.completed(sim.id("a[1]"), sim.now, steps=4, error="RuntimeError: the script failed at step 4",
                             elastic=False) == ("done", "")
    script_ends(sim, "a[0]", CRASH, error="CollectiveError: gradient allreduce failed: Connection closed by peer")
    assert sim.outcome is None  # a[1], which reported first, is still exiting
    sim.exit("a[1]", CRASH)
    failed(sim, "worker a[1]#2 (rank 1) exited with code 1: RuntimeError: the script failed at step 4",
           "a fixed-size job: no worker entered hvd.elastic.run")


def test_a_root_cause_that_never_exits_does_not_hold_the_job_up() -> None:
    sim = started(2, {"a": 2})
    assert sim.job.completed(sim.id("a[1]"), sim.now, steps=4, error="RuntimeError: boom", elastic=False) == \
        ("done", "")
    script_ends(sim, "a[0]", CRASH, error="CollectiveError: a peer failed")
    sim.advance(3.0)  # a[1] hangs in its exit: after ROOT_CAUSE_WAIT_S the job ends, its reported error the reason
    failed(sim, "worker a[1]#2 (rank 1) ended its script with RuntimeError: boom (its process had not exited 2s later)")
    assert "CollectiveError" not in sim.outcome.reason


SURVIVOR = "CollectiveError: gradient allreduce failed: Read error [127.0.0.1]:59523: Connection reset by peer."


@pytest.mark.parametrize("reaped_first", ["the killed worker", "its peer"])
def test_a_peer_s_collective_error_is_never_the_reason_when_a_worker_was_killed(reaped_first: str) -> None:
    """Review (f5_plain_reason.sh, 3 runs of 3): rank 1 killed by SIGABRT, and the job failed naming rank 0's
    CollectiveError, its view of the lost peer, whichever exit the driver reaped first."""
    sim = started(2, {"a": 2})
    sim.advance(1)
    if reaped_first == "the killed worker":  # f5's order: rank 0's report, rank 1's exit, then rank 0's exit
        assert sim.job.completed(sim.id("a[0]"), sim.now, steps=6, error=SURVIVOR, elastic=False) == ("done", "")
        sim.exit("a[1]", ExitStatus(-6))  # no exit hook ran: no report
        sim.exit("a[0]", CRASH)
    else:
        script_ends(sim, "a[0]", CRASH, error=SURVIVOR)
        assert sim.outcome is None  # the worker its collective lost may be exiting still
        sim.advance(0.5)
        sim.exit("a[1]", ExitStatus(-6))
    failed(sim, "worker a[1]#2 (rank 1) killed by signal 6")
    assert "CollectiveError" not in sim.outcome.reason


def test_a_collective_error_is_the_reason_when_no_other_member_fails_within_the_wait() -> None:
    sim = started(2, {"a": 2})
    script_ends(sim, "a[0]", CRASH, error=SURVIVOR)
    sim.silent.add(sim.id("a[1]"))  # stopped, say: it neither reports nor exits
    sim.advance(2.5)
    failed(sim, "worker a[0]#1 (rank 0) exited with code 1: CollectiveError")


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_rank_back_at_rendezvous_after_its_peer_exited_0_is_the_attempt_s_failure_not_a_success(restarts) -> None:
    """A script with no collective: rank 0 ends and exits 0 before rank 1's group formed, so rank 1's formation
    fails and it comes back to rendezvous. Nothing re-forms in a fixed-size job: rank 1 never finishes its
    script, so the job must not succeed on rank 0's exit alone."""
    sim = started(2, {"a": 2}, restarts=restarts)
    script_ends(sim, "a[0]")
    sim.join("a[1]", reason="failure")
    sim.advance(1)
    if not restarts:
        failed(sim, "worker a[1]#2 (rank 1) came back to rendezvous from round 1 (reason failure)",
               "forms no new round for it", "a fixed-size job")
        assert isinstance(sim.reply("a[1]"), ExitOrder)
        return
    assert sim.outcome is None  # the attempt failed: every worker is stopped, then the job starts again
    assert [s.worker_id for s in sim.stops] == [sim.id("a[1]")]
    sim.exit("a[1]", ExitStatus(-15))
    sim.advance(0.5)
    assert sim.slots_launched() == ["a[0]", "a[1]", "a[0]", "a[1]"]


def restarted(restarts: int = 1) -> Sim:
    """A fixed-size job whose first attempt failed (rank 1 raised): attempt 2's round 2 has formed."""
    sim = started(2, {"a": 2}, restarts=restarts)
    script_ends(sim, "a[1]", CRASH, error="ValueError: bad batch")
    sim.exit("a[0]", ExitStatus(-15))
    sim.advance(0.5)
    assert_round(sim.join("a[0]", "a[1]"), 2, needs_sync=True)
    return sim


def test_a_restarted_attempt_re_forms_a_group_that_did_not_form_as_the_first_attempt_does() -> None:
    """Before any script of the attempt ended, its ranks back at rendezvous (a transient Gloo failure) re-form:
    the restart made for the first attempt's failure is not spent on the second's formation."""
    sim = restarted()
    assert_round(sim.join("a[0]", "a[1]", reason="failure"), 3, needs_sync=True)
    script_ends(sim, "a[0]")
    script_ends(sim, "a[1]")
    assert sim.outcome.success and "after 1 restart(s)" in sim.outcome.reason, sim.outcome


def test_a_rank_killed_while_a_restarted_attempt_s_group_forms_is_the_reason_not_its_peer_back_at_rendezvous(
) -> None:
    sim = restarted()
    sim.join("a[0]", reason="failure")  # its group did not form: rank 1 is gone
    sim.advance(0.5)
    assert sim.outcome is None
    sim.exit("a[1]", KILLED)
    sim.advance(3)
    failed(sim, "worker a[1]#4 (rank 1) killed by signal 9", "no restart left (--restarts 1)")


def test_nothing_is_launched_or_re_formed_while_a_fixed_size_round_runs() -> None:
    sim = started(2, {"a": 2}, max_np=3)
    assert sim.job.completed(sim.id("a[1]"), sim.now, elastic=False) == ("done", "")
    sim.discover({"a": 2, "b": 1})
    sim.advance(30)
    assert sim.slots_launched() == ["a[0]", "a[1]"] and sim.job.update_gen == 0
    sim.exit("a[1]", CLEAN)
    sim.advance(30)
    assert sim.slots_launched() == ["a[0]", "a[1]"] and sim.job.round == 1 and sim.outcome is None
    script_ends(sim, "a[0]")
    assert sim.outcome.success


def test_with_restarts_a_failure_stops_every_worker_then_starts_the_job_again() -> None:
    sim = started(2, {"a": 2}, restarts=1)
    first = sim.id("a[0]")
    script_ends(sim, "a[1]", CRASH, error="ValueError: bad batch")
    assert sim.outcome is None
    assert [s.worker_id for s in sim.stops] == [first]  # the survivor is stopped: it cannot go on alone
    sim.advance(1)
    assert sim.slots_launched() == ["a[0]", "a[1]"]  # nothing starts before every worker is gone
    sim.exit("a[0]", ExitStatus(-15))
    sim.advance(0.5)
    assert sim.slots_launched() == ["a[0]", "a[1]", "a[0]", "a[1]"]  # -np workers, the same slots
    assert_round(sim.join("a[0]", "a[1]"), 2, needs_sync=True)
    script_ends(sim, "a[0]")
    script_ends(sim, "a[1]")
    assert sim.outcome.success and "after 1 restart(s)" in sim.outcome.reason, sim.outcome
    assert "rollback" not in kinds(sim)  # a restart starts the script over: nothing rolled back


def test_restarts_run_out() -> None:
    sim = restarted()
    script_ends(sim, "a[0]", CRASH, error="ValueError: bad batch again")
    failed(sim, "worker a[0]#3 (rank 0) exited with code 1: ValueError: bad batch again", "no restart left (--restarts 1)")


def test_a_job_whose_workers_committed_is_never_restarted_from_the_script_s_start() -> None:
    """Progress is sacred: a restart would train from initial weights over the committed state."""
    sim = started(2, {"a": 2}, restarts=3)
    assert sim.job.completed(sim.id("a[1]"), sim.now, elastic=False) == ("done", "")
    sim.commit("a[0]")  # a commit (State.commit outside elastic.run): the job now holds trained state
    sim.exit("a[1]", CRASH)
    failed(sim, "exited with code 1", "not restarted: workers had committed training state")
    assert sim.slots_launched() == ["a[0]", "a[1]"]


def test_an_elastic_job_s_newcomer_ending_without_elastic_run_is_an_elastic_failure() -> None:
    """The members' heartbeats say they are inside elastic.run: a newcomer that fails in its set-up does not make
    the job fixed-size."""
    sim = started(2, {"a": 2}, min_np=1, max_np=3)
    sim.job.fixed.entered(sim.id("a[0]"))
    sim.commit("a[0]", "a[1]", count=5)
    sim.discover({"a": 2, "b": 1})
    sim.join("b[0]")
    script_ends(sim, "b[0]", CRASH, error="OSError: dataset not found")
    assert sim.outcome is None and sim.blocked("b[0]")  # blacklisted, as any failed elastic worker
    assert not sim.job.fixed.known


def test_the_completion_report_carries_elastic_and_older_workers_count_as_elastic() -> None:
    from cloud_elastic.errors import ControlPlaneError
    from cloud_elastic.protocol import CompletedReport

    report = CompletedReport(1, 0, 20, "RuntimeError: boom", elastic=False)
    assert CompletedReport.from_wire(report.to_wire()) == report
    assert CompletedReport.from_wire({"round": 1, "commit_seq": 3}).elastic is True
    with pytest.raises(ControlPlaneError, match="'elastic' must be true or false"):
        CompletedReport.from_wire({"round": 1, "elastic": "no"})


def test_a_silent_worker_of_a_fixed_size_job_fails_it_without_blacklisting() -> None:
    sim = started(2, {"a": 2}, heartbeat_timeout_s=5)
    assert sim.job.completed(sim.id("a[1]"), sim.now, elastic=False) == ("done", "")
    sim.silent.add(sim.id("a[0]"))
    sim.advance(7)
    failed(sim, "worker a[0]#1 (rank 0)", "a fixed-size job")
    assert not sim.blocked("a[0]") and not sim.blocked("a[1]")


def noticed(deadline_s: float = 600, **kwargs) -> Sim:
    """A fixed-size job of a[0] and b[0] in which host b got a spot notice mid-run: b[0] drains, but its script,
    without hvd.elastic.run, cannot leave at a commit (a fixed-size job cannot shrink)."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, **kwargs)
    sim.discover({"a": 1}, {"b": Drain(T0 + deadline_s, "spot interruption")})
    assert sim.job.workers[sim.id("b[0]")].state is WorkerState.DRAINING
    return sim


def test_a_draining_worker_whose_script_ends_with_exit_0_is_a_success_not_a_failure() -> None:
    sim = noticed()
    script_ends(sim, "b[0]")  # b's script finished within its notice's time
    script_ends(sim, "a[0]")
    assert sim.outcome == Finish(True, "training completed on 2 worker(s), every one exiting 0 (a fixed-size job: "
                                       "no worker entered hvd.elastic.run)", 0)
    assert not {"worker_failed", "rollback"} & set(kinds(sim)), sim.events


def test_a_draining_worker_whose_script_fails_fails_the_fixed_size_job() -> None:
    sim = noticed()
    script_ends(sim, "b[0]", CRASH, error="RuntimeError: CUDA out of memory")
    script_ends(sim, "a[0]")
    failed(sim, "worker b[0]#2 (rank 1) exited with code 1: RuntimeError: CUDA out of memory", "a fixed-size job")
    [event] = [f for kind, f in sim.events if kind == "worker_failed"]
    assert (event["worker"], event["exit_code"], event["blacklisted_s"]) == (sim.id("b[0]"), 1, None), event


@pytest.mark.parametrize("how", ["removed by force", "silent"])
def test_a_draining_worker_lost_before_its_script_ends_is_the_attempt_s_failure_with_no_rollback(how) -> None:
    sim = noticed(60, heartbeat_timeout_s=5, restarts=1)
    script_ends(sim, "a[0]")  # the job knows it is fixed-size; b's script still runs when its host goes
    if how == "silent":
        sim.silent.add(sim.id("b[0]"))
        sim.advance(6)
    else:
        sim.advance(56)  # past one deadline margin (5 s) before the deadline
    assert sim.job.workers[sim.id("b[0]")].state is WorkerState.LOST
    assert sim.job.abort_round == 0 and "rollback" not in kinds(sim)  # nothing elastic rolls back
    sim.exit("b[0]", KILLED)
    sim.advance(0.5)
    assert sim.job.fixed.restarts == 1 and sim.job.last_failure.startswith(f"worker {sim.id('b[0]')} (rank 1) ")
    assert [f["worker"] for kind, f in sim.events if kind == "worker_failed"] == [sim.id("b[0]")]


# ------------------------------------------------------------ the piece alone, on a FakeJob
def test_the_piece_alone_takes_the_job_only_from_the_first_report_and_never_after_a_worker_entered() -> None:
    from cloud_elastic.driver.job.actions import Phase
    from cloud_elastic.driver.job.fixed_size import FixedSize
    from tests.unit.job_view import FakeJob, S

    job = FakeJob(2)
    job.phase, job.round = Phase.RUNNING, 1
    r0, r1 = (job.worker("a", i, S.RUNNING, round_=1, rank=i) for i in range(2))
    fixed = FixedSize(job)
    spare = job.worker("b", 0, S.WAITING)
    assert not fixed.failed(spare, "exited with code 1", exit_code=1, was_member=False)  # not known yet: elastic rules
    assert not fixed.exited(r1, CLEAN) and not fixed.step(1000.0)
    assert fixed.script_ended(r1, "RuntimeError: x\nmore") == ("done", "") and fixed.known
    assert fixed.step(1000.0)  # its round runs: nothing launches or re-forms
    r1.state = S.EXITED
    assert fixed.exited(r1, ExitStatus(1)) and job.outcome is None
    assert fixed.step(1000.0) and not job.outcome.success
    assert job.outcome.reason.startswith("worker a[1]#2 (rank 1) exited with code 1: RuntimeError: x (a fixed-size")

    # Only a worker entering elastic.run makes the job elastic; a commit alone does not (a worker refuses one
    # outside it, and an older worker's commit outside it says nothing of the script: review s63 rvU finding 1).
    committed = FakeJob(2)
    committed.state_committed = True
    w = committed.worker("a", 0, S.WAITING)
    fixed_after_all = FixedSize(committed)
    assert fixed_after_all.script_ended(w, None) == ("done", "") and fixed_after_all.known
    entered = FixedSize(FakeJob(2))
    entered.entered("a[1]#2")
    assert entered.script_ended(entered._job.worker("a", 0, S.WAITING), None) == ("done", "") and not entered.known


# --------------------------------------------- a command that never calls hvd.init() (hostname, python -c 1)
def launched(np: int = 2, **kwargs) -> Sim:
    """A job whose -np workers were launched and have not registered yet."""
    sim = Sim(np, **kwargs)
    sim.discover({"a": np})
    assert sim.slots_launched() == [f"a[{i}]" for i in range(np)]
    return sim


def test_a_command_that_never_connects_succeeds_when_every_worker_exits_0() -> None:
    sim = launched(2)
    sim.exit("a[1]", CLEAN)
    assert sim.outcome is None  # a[0] still runs the command
    sim.advance(30)
    assert sim.slots_launched() == ["a[0]", "a[1]"]  # nothing runs the command again meanwhile
    sim.exit("a[0]", CLEAN)
    assert sim.outcome == Finish(True, "every worker (2) exited with code 0 without ever connecting to the driver "
                                       "(its command never called hvd.init()): the job ran it as a plain command "
                                       "(nothing elastic happened)", 0)
    assert "worker_failed" not in kinds(sim) and not sim.blocked("a[0]") and not sim.blocked("a[1]")


def test_a_command_that_never_connects_says_how_many_ran_it_beyond_np() -> None:
    """Review h4 (2026-12-01): ``-np 2 --spares 1`` on three slots ran ``hostname`` three times, and said only
    "every worker (3)": a spare is not counted in -np, but it runs the command as every launched worker does (no
    worker can be known a plain command's before one exits)."""
    sim = Sim(2, spares=1)
    sim.discover({"a": 3})
    assert sim.slots_launched() == ["a[0]", "a[1]", "a[2]"]
    for slot in ("a[0]", "a[1]", "a[2]"):
        sim.exit(slot, CLEAN)
    assert sim.outcome == Finish(True, "every worker (3) exited with code 0 without ever connecting to the driver "
                                       "(its command never called hvd.init()): the job ran it as a plain command "
                                       "(nothing elastic happened); 1 of them beyond -np 2: every worker launched "
                                       "runs it, on the slots of --max-np and --spares too", 0)


@pytest.mark.parametrize("order", ["unreached first", "plain exit first"])
def test_a_plain_command_waits_for_a_booting_host_and_runs_once_a_slot(order) -> None:
    """A review's plain command on two hosts, one whose sshd came up 6 s late: the SSH failure made the job "mixed",
    the command ran again on the first host and its exit 0 counted as a failure ("all workers failed; last: ...
    exited with code 0"). A host not reached before its worker connected is a booting one: its slot alone is tried
    again, the other's command is not run again, and the job succeeds once both ran it."""
    from tests.unit.test_job import PAST_FIRST_COOLDOWN_S, UNREACHABLE

    sim = Sim(2, start_timeout_s=120)
    sim.discover({"a": 1, "b": 1})
    steps = [("b[0]", UNREACHABLE), ("a[0]", CLEAN)]
    for slot, status in steps if order == "unreached first" else steps[::-1]:
        sim.exit(slot, status)
    assert sim.outcome is None and sim.blocked("b[0]") and not sim.blocked("a[0]")
    sim.advance(PAST_FIRST_COOLDOWN_S)
    assert sim.slots_launched() == ["a[0]", "b[0]", "b[0]"]  # the booting host again, not the command on a
    sim.exit("b[0]", UNREACHABLE)  # still booting
    sim.advance(PAST_FIRST_COOLDOWN_S)
    assert sim.slots_launched() == ["a[0]", "b[0]", "b[0]", "b[0]"] and sim.outcome is None
    sim.exit("b[0]", CLEAN)  # up: it ran the command
    assert sim.outcome == Finish(True, "every worker (2) exited with code 0 without ever connecting to the driver "
                                       "(its command never called hvd.init()): the job ran it as a plain command "
                                       "(nothing elastic happened)", 0)


def test_with_checkpoint_dir_a_command_that_never_connects_is_no_success() -> None:
    """Progress is sacred: the command neither loaded the job's checkpoints nor saved any."""
    sim = launched(2, checkpointing=True)
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CLEAN)
    failed(sim, "all workers failed", "without ever connecting to the driver (its command never called hvd.init())",
           "with --checkpoint-dir that is no success")


def test_a_worker_that_never_connects_among_workers_that_did_is_a_failure() -> None:
    sim = launched(2, min_np=1)
    sim.join("a[0]")
    sim.exit("a[1]", CLEAN)
    assert sim.outcome is None and sim.blocked("a[1]")
    [failure] = [f for kind, f in sim.events if kind == "worker_failed"]
    assert failure["reason"] == ("exited with code 0 without ever connecting to the driver (its command never called "
                                 "hvd.init()); other workers of the job connected or failed")


def test_a_worker_connecting_after_a_plain_exit_puts_the_job_back_under_its_elastic_rules() -> None:
    sim = launched(2)
    sim.exit("a[0]", CLEAN)
    assert sim.outcome is None and not sim.blocked("a[0]")
    sim.join("a[1]")  # it runs cloud_elastic after all: the job is no plain command
    sim.advance(0.5)
    assert sim.outcome is None
    assert sim.slots_launched() == ["a[0]", "a[1]", "a[0]"]  # the plain exit's slot runs a worker again
    sim.exit("a[0]", CLEAN)  # and it exits 0 unregistered again: now a failure
    assert sim.outcome is None and sim.blocked("a[0]")
