"""A worker says at exit the code it exits with (``exiting``): where this driver cannot learn its process's status
(a local fork server killed under it, an adopted process), that code is its status (reviewer's fs_kill.sh)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.exit_status import ExitStatus
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.control_plane import ControlPlane
from tests.unit.test_job import Sim

pytestmark = pytest.mark.timeout(30)

FORK_SERVER_GONE = ExitStatus(1, known=False)  # what launch/local.py reads once the fork server died


@pytest.mark.parametrize("said, success", [(0, True), (2, False), (None, False)])
def test_a_worker_whose_fork_server_died_ends_the_job_by_the_code_it_said(said, success) -> None:
    """No driver restart: the fork server is killed during rank 0's final save, which then exits 0: the job
    succeeds (it failed 'ended without reporting completion (adopted ...)'); a code 2 said, or none, fails it."""
    sim = Sim(2)
    sim.start({"a": 1, "b": 1})
    cond = JobCondition()
    cond.watch(sim.job)
    plane = ControlPlane(sim.job, cond, JobConfig(command=("x",), num_proc=2, min_np=2, max_np=2),
                         sinks=SimpleNamespace(sink=None, metrics=None), clock=lambda: sim.now,
                         stop=lambda reason, code: None, record_events=lambda: None)
    for slot in ("b[0]", "a[0]"):
        sim.complete(slot)
    sim.advance(1)
    wire = {"worker": sim.id("b[0]"), "code": 0, "error": None}
    plane.handle("exiting", wire)
    sim.exit("b[0]", ExitStatus(0))
    plane.handle("exiting", {"worker": sim.id("a[0]"), "code": said, "error": None})
    sim.exit("a[0]", FORK_SERVER_GONE)
    sim.advance(1)
    outcome = sim.outcome
    assert outcome is not None and outcome.success is success, outcome
    if said is None:
        assert "ended without saying its exit code" in outcome.reason and "adopted" not in outcome.reason
    elif said:
        assert "exited with code 2 after its training function returned" in outcome.reason
