"""Completion and the no-progress watch on their own (cloud_elastic.driver.job.completion)."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.actions import Phase, Stop
from cloud_elastic.driver.job.completion import EARLY_RETURN_WAIT_S, NOT_BACK_LIMIT, STACKS_WAIT_S, Completion
from cloud_elastic.driver.job.exit_status import reported_error_line
from cloud_elastic.driver.launch.api import ExitStatus
from cloud_elastic.protocol_reports import MAX_ERROR_LINE
from tests.unit.job_view import T0, FakeJob, S

pytestmark = pytest.mark.timeout(30)  # the first test may import torch (conftest)


def running(np: int = 2, **policy) -> tuple[FakeJob, Completion, list]:
    job = FakeJob(np, **policy)
    job.phase, job.round = Phase.RUNNING, 1
    workers = [job.worker("a", i, S.RUNNING, round_=1, rank=i) for i in range(np)]
    return job, Completion(job, lambda: next((w for w in workers if w.rank == 0 and w.member_of(job.round)), None)), workers


def test_rank_0_returning_completes_the_job_and_every_member_parked_before_it() -> None:
    job, completion, (r0, r1) = running()
    assert completion.completed(r1.worker_id, T0) == ("wait", "")
    assert r1.returned and r1.state is S.RUNNING and completion.reply(r1.worker_id) is None
    assert completion.completed(r0.worker_id, T0 + 0.01, commit_seq=9, steps=90) == ("done", "")
    assert job.phase is Phase.FINISHING and job.ticks == [T0 + 0.01]
    assert (r0.state, r1.state, r0.commit_seq, r0.steps) == (S.COMPLETED, S.COMPLETED, 9, 90)
    assert completion.reply(r1.worker_id) == ("done", "")


def test_a_member_that_returned_while_rank_0_waits_in_a_collective_leaves_and_the_round_aborts() -> None:
    job, completion, (r0, r1) = running()
    completion.completed(r1.worker_id, T0)
    r0.waiting_s, r0.waiting_at = EARLY_RETURN_WAIT_S + 1, T0 - 1  # reported before r1 parked: not counted
    completion.check_early_returns(T0)
    assert r1.state is S.RUNNING
    r0.waiting_at = T0 + 1
    completion.check_early_returns(T0 + 1)
    assert r1.state is S.EXITING and job.aborts == 1 and "while rank 0" in r1.why
    assert job.hosts.blacklist.blocked(r1.slot, T0 + 1)  # it backs off like a failed slot
    assert r1.returned_early  # its worker_left event (written by the job when its process ends) says so
    assert "worker_left" not in dict(job.events)
    assert completion.reply(r1.worker_id)[0] == "leave"


def test_the_job_succeeds_once_everyone_is_gone_unless_a_worker_failed_after_completing() -> None:
    job, completion, (r0, r1) = running()
    completion.completed(r0.worker_id, T0)
    completion.step_finishing(T0)
    assert job.outcome is None  # r1 is still running
    r1.state = S.EXITED
    r0.state = S.EXITED
    completion.exited_after_completing(r0, ExitStatus(0))
    completion.step_finishing(T0 + 1)
    assert job.outcome.success and "training completed on" in job.outcome.reason

    job, completion, (r0, r1) = running()
    completion.completed(r0.worker_id, T0)
    r0.state = S.EXITED
    completion.exited_after_completing(r0, ExitStatus(-9))
    assert dict(job.events)["worker_failed"]["signal"] == "SIGKILL"
    completion.step_finishing(T0 + 31)
    assert job.outcome is None  # r1 still heartbeats: the job waits for it
    r1.state = S.EXITED
    completion.step_finishing(T0 + 32)
    assert not job.outcome.success and "after its training function returned" in job.outcome.reason


def test_a_failure_after_completing_ends_the_job_with_the_error_the_worker_said_once_and_bounded() -> None:
    # What the driver keeps of a worker's exit report (Adoption.exiting): its first line, bounded.
    long = reported_error_line("OSError: the final save failed: " + "x" * 5000 + "\nTraceback (most recent call last):")
    job, completion, (r0, r1) = running()
    completion.completed(r0.worker_id, T0)
    completion.completed(r1.worker_id, T0)
    r0.error, r0.state = long, S.EXITED
    completion.exited_after_completing(r0, ExitStatus(1))
    crash = "RuntimeError: [enforce fail at pair.cc:553] Connection closed by peer"
    r1.error, r1.state = crash, S.EXITED  # it said so, then crashed printing the same line: named once
    completion.exited_after_completing(r1, ExitStatus(-6, last_error=crash))
    completion.step_finishing(T0 + 1)
    reason = job.outcome.reason
    assert reason.startswith(f"rank 0 finished training, but worker {r0.worker_id} (rank 0) exited with code 1 after "
                             f"its training function returned (commit 0, 0 optimizer step(s)): OSError: the final "
                             f"save failed: xxx"), reason
    assert len(long) == MAX_ERROR_LINE and "Traceback" not in reason and len(reason) < MAX_ERROR_LINE + 200, reason
    failed = [fields for kind, fields in job.events if kind == "worker_failed"]
    assert failed[0]["reason"].endswith(f"returned: {long}") and failed[1]["reason"].count(crash) == 1, failed


def test_a_stalled_round_asks_for_stacks_then_is_aborted() -> None:
    job, completion, (r0, r1) = running(progress_timeout_s=60)
    completion.round_formed(T0)
    completion.check_progress(T0 + 30)
    completion.progressed(T0 + 30)
    completion.check_progress(T0 + 90)
    assert job.kinds() == []
    completion.check_progress(T0 + 90.5)
    assert job.kinds() == ["round_stalled"] and r0.stacks_wanted == r1.stacks_wanted == completion.stacks_gen == 1
    completion.check_progress(T0 + 91)
    assert job.aborts == 0  # waiting for the stacks
    r0.stacks_sent = r1.stacks_sent = 1
    completion.check_progress(T0 + 91.5)
    assert job.aborts == 1 and "made no progress for 60s" in job.last_failure


def test_members_not_back_a_timeout_after_the_abort_are_given_up_after_their_stacks() -> None:
    job, completion, (r0, r1) = running(progress_timeout_s=60)
    completion.round_formed(T0)
    job.abort_round = 1
    completion.check_progress(T0 + 1)  # the abort is seen now
    completion.check_progress(T0 + 62)
    assert dict(job.events)["round_stalled"]["workers"] == [r0.worker_id, r1.worker_id]
    completion.check_progress(T0 + 62 + STACKS_WAIT_S)
    assert [w for w, _ in job.given_up] == [r0.worker_id, r1.worker_id]


def test_a_member_progressing_after_the_abort_is_given_up_only_past_the_limit_of_a_phase_without_collectives() -> None:
    job, completion, (r0, r1) = running(progress_timeout_s=60)
    completion.round_formed(T0)
    job.abort_round = 1
    completion.check_progress(T0 + 1)  # the abort is seen now
    limit = T0 + 1 + NOT_BACK_LIMIT * 60
    t = T0 + 1
    while t < limit:  # both compute (an evaluation pass): never idle for the timeout
        t += 10
        r0.progress_at = r1.progress_at = t
        completion.check_progress(t)
    assert job.kinds() == [] and job.given_up == []
    r0.progress_at = r1.progress_at = t = limit + 1
    completion.check_progress(t)
    assert dict(job.events)["round_stalled"]["workers"] == [r0.worker_id, r1.worker_id]
    completion.check_progress(t + STACKS_WAIT_S)
    assert [w for w, _ in job.given_up] == [r0.worker_id, r1.worker_id]
    assert "though still making progress" in job.given_up[0][1]
