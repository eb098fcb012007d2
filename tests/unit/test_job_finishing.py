"""After the training function returns: the work after it (a final save, an evaluation) runs to its end as under
horovodrun, ``--finish-timeout`` bounds it only when asked, and a second ``hvd.elastic.run`` function makes the job
elastic again (cloud_elastic.driver.job.completion)."""

from __future__ import annotations

import pytest

from cloud_elastic.cli import parse_command_line
from cloud_elastic.driver.job.elastic_job import Finish, Phase, WorkerState
from cloud_elastic.errors import ConfigError
from tests.unit.test_job import CLEAN, KILLED, Sim, assert_round, failed, started

pytestmark = pytest.mark.timeout(30)

DONE = Finish(True, "training completed on 2 worker(s) after 0 reset(s)", 0)


def again(sim: Sim, slot: str) -> tuple[str, str]:
    """The worker on ``slot`` entered ``hvd.elastic.run`` again (a second training function)."""
    answer = sim.job.completed(sim.id(slot), sim.now, again=True)
    sim._collect()
    return answer


def finish_alone(sim: Sim) -> None:
    """Rank 0 (a[0]) completes the job alone: the worker launched on a[1]'s freed slot, still starting, is
    stopped, and the job succeeds."""
    sim.complete("a[0]")
    assert [s.worker_id for s in sim.stops] == [sim.id("a[1]")]
    sim.exit("a[1]", KILLED)
    sim.exit("a[0]", CLEAN)
    assert sim.outcome == Finish(True, "training completed on 1 worker(s) after 1 reset(s)", 0)


# ------------------------------------------------------------- the work after training
def test_a_final_save_that_takes_minutes_runs_to_its_end_and_the_job_succeeds() -> None:
    sim = started(2)
    sim.complete("a[0]")
    sim.complete("a[1]")
    sim.exit("a[1]", CLEAN)
    sim.advance(600)  # rank 0 saves its final model to slow storage, heartbeating all along
    assert sim.outcome is None and sim.stops == []
    sim.exit("a[0]", CLEAN)
    assert sim.outcome == DONE


def test_a_completed_worker_that_goes_silent_is_given_up_and_the_job_fails_naming_it() -> None:
    sim = started(2)  # --heartbeat-timeout 5
    sim.complete("a[0]")
    sim.complete("a[1]")
    sim.exit("a[1]", CLEAN)
    sim.silent.add(sim.id("a[0]"))  # its host is lost during the final save
    sim.advance(4)
    assert sim.outcome is None
    sim.advance(2)
    assert [s.worker_id for s in sim.stops] == [sim.id("a[0]")]
    failed(sim, "rank 0 finished training, but worker a[0]#1 (rank 0) stopped answering heartbeats",
           "after its training function returned")


def test_the_finish_timeout_is_a_flag_off_by_default_and_refuses_nonsense() -> None:
    base = ["run", "-np", "2", "-H", "h:2"]
    assert parse_command_line([*base, "python", "t.py"])[1]["config"].finish_timeout_s is None
    assert parse_command_line([*base, "--finish-timeout", "90", "python", "t.py"])[1]["config"].finish_timeout_s == 90
    for bad in ("0", "-1", "nan"):
        with pytest.raises(ConfigError, match="--finish-timeout"):
            parse_command_line([*base, "--finish-timeout", bad, "python", "t.py"])


# ------------------------------------------------------------- a second training function
def test_a_second_training_function_makes_the_job_elastic_again_and_survives_a_failure() -> None:
    sim = started(2, min_np=1)
    sim.complete("a[0]")
    sim.complete("a[1]")
    assert sim.job.phase is Phase.FINISHING
    sim.advance(200)  # an evaluation between the two functions: longer than --progress-timeout (120)
    assert again(sim, "a[1]") == ("done", "")  # fine-tuning after pre-training
    assert again(sim, "a[0]") == ("done", "")
    assert sim.job.phase is Phase.RUNNING
    assert {w.state for w in sim.job.workers.values()} == {WorkerState.RUNNING}
    sim.advance(1)
    assert not [kind for kind, _ in sim.events if kind == "round_stalled"]  # the no-progress watch started over
    sim.exit("a[1]", KILLED)  # during fine-tuning
    assert sim.poll("a[0]").abort_round == 1  # the survivor rolls back and goes on
    assert_round(sim.join("a[0]", reason="failure"), 2, needs_sync=True)
    sim.advance(60)
    assert sim.outcome is None
    finish_alone(sim)


def test_a_worker_lost_between_the_two_functions_is_a_lost_member_not_a_failed_job() -> None:
    sim = started(2, min_np=1)
    sim.complete("a[0]")
    sim.complete("a[1]")
    sim.exit("a[1]", KILLED)
    assert again(sim, "a[0]") == ("done", "")
    assert sim.poll("a[0]").abort_round == 1  # its peer is gone: a collective with it would fail or hang
    assert_round(sim.join("a[0]", reason="failure"), 2, needs_sync=True)
    finish_alone(sim)


def test_a_member_whose_first_function_returns_after_rank_0_entered_the_second_goes_on_too() -> None:
    sim = started(2)
    sim.complete("a[0]")
    assert again(sim, "a[0]") == ("done", "")  # rank 0 is quick: it enters fine-tuning first
    assert sim.job.completed(sim.id("a[1]"), sim.now) == ("done", "")  # not parked as an early return
    assert again(sim, "a[1]") == ("done", "")
    assert sim.job.phase is Phase.RUNNING and sim.job.workers[sim.id("a[1]")].state is WorkerState.RUNNING
    sim.complete("a[0]")  # fine-tuning done
    assert sim.job.completed(sim.id("a[1]"), sim.now) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("a[1]", CLEAN)
    assert sim.outcome == DONE


def test_entering_again_once_the_job_is_over_sends_the_worker_away() -> None:
    sim = started(2, finish_timeout_s=5)
    sim.complete("a[0]")
    sim.complete("a[1]")
    sim.advance(6)
    assert sim.outcome is not None
    assert again(sim, "a[0]")[0] == "leave"
