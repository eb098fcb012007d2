"""A round member whose training function had not returned, ending badly while the job finishes, fails the job.

Found by review (f4_success_after_raise.sh): rank 1's training function raised after its last commit (a final
evaluation inside it) while rank 0's returned; the driver logged ``exited with code 1 while the job was
finishing`` and the job ``succeeded`` with exit 0. Horovod fails such a job; so does this driver now, naming the
worker and its error, once the others are done (rank 0's final save is not cut short).
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.elastic_job import Finish, Phase
from cloud_elastic.driver.launch.api import ExitStatus
from tests.unit.test_job import CLEAN, CRASH, failed, started

pytestmark = pytest.mark.timeout(10)

ERROR = "ValueError: user bug on rank 1 after the last commit, before returning (e.g. a final evaluation)"


def test_a_member_that_raises_before_returning_while_the_job_finishes_fails_it_naming_its_error() -> None:
    sim = started(2)
    sim.complete("a[0]")
    assert sim.job.phase is Phase.FINISHING
    sim.job.adoption.exiting(sim.id("a[1]"), 1, ERROR)  # its exit hook's report, as the control plane passes it
    sim.exit("a[1]", CRASH)
    assert sim.outcome is None  # rank 0's work after training (a final save) runs to its end
    sim.exit("a[0]", CLEAN)
    failed(sim, f"rank 0 finished training, but worker {sim.id('a[1]')} (rank 1) exited with code 1 before its "
                f"training function returned: {ERROR}")
    event = [f for kind, f in sim.events if kind == "worker_failed"]
    assert len(event) == 1 and event[0]["exit_code"] == 1 and event[0]["worker"] == sim.id("a[1]")


def test_a_member_killed_before_returning_while_the_job_finishes_fails_it() -> None:
    sim = started(2)
    sim.complete("a[0]")
    sim.exit("a[1]", ExitStatus(-11))
    sim.exit("a[0]", CLEAN)
    failed(sim, f"worker {sim.id('a[1]')} (rank 1) killed by signal 11 before its training function returned")
    assert [f.get("signal") for kind, f in sim.events if kind == "worker_failed"] == ["SIGSEGV"]


def test_a_member_exiting_0_before_returning_while_the_job_finishes_does_not_fail_it() -> None:
    sim = started(2)
    sim.complete("a[0]")
    sim.exit("a[1]", CLEAN)  # sys.exit(0) in its function, say: its exit status is its verdict, as under Horovod
    sim.exit("a[0]", CLEAN)
    assert sim.outcome == Finish(True, "training completed on 1 worker(s) after 0 reset(s)", 0)
