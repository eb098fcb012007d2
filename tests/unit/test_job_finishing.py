"""After the training function returns: the work after it (a final save, an evaluation) runs to its end as under
horovodrun, and ``--finish-timeout`` bounds it only when asked (cloud_elastic.driver.job.completion)."""

from __future__ import annotations

import pytest

from cloud_elastic.cli import parse_command_line
from cloud_elastic.driver.job.elastic_job import Finish
from cloud_elastic.errors import ConfigError
from tests.unit.test_job import CLEAN, failed, started

pytestmark = pytest.mark.timeout(30)

DONE = Finish(True, "training completed on 2 worker(s) after 0 reset(s)", 0)


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
