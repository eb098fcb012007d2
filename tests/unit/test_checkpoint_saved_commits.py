"""A checkpoint reported saved is a commit the job holds, before any heartbeat says so (cloud_elastic.driver.runtime.
control_plane, ``checkpoint`` ``saved``).

Found by fixA: with --checkpoint-dir, every worker failing within a heartbeat (0.5 s) of the job's first commit ended
the job "all workers failed", though rank 0 had reported that commit's checkpoint saved: the driver learnt of commits
only from heartbeats, so it saw nothing to resume. The job now resumes from that checkpoint; the real job is
tests/integration/test_first_commit_checkpoint.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.runtime.condition import JobCondition
from cloud_elastic.driver.runtime.control_plane import ControlPlane
from tests.unit.test_job import CRASH, Sim, assert_round, failed

pytestmark = pytest.mark.timeout(30)  # the first test of a run may import torch (conftest)


def plane(sim: Sim) -> ControlPlane:
    cond = JobCondition()
    cond.watch(sim.job)
    return ControlPlane(sim.job, cond, JobConfig(command=("x",), num_proc=2, min_np=2, max_np=2),
                        sinks=SimpleNamespace(sink=SimpleNamespace(emit=lambda kind, **fields: None), metrics=None),
                        clock=lambda: sim.now, stop=lambda reason, code: None, record_events=lambda: None)


@pytest.mark.parametrize("reported", [True, False])
def test_every_worker_failing_before_a_heartbeat_tells_of_the_first_commit_resumes_from_its_checkpoint(reported):
    sim = Sim(2, checkpointing=True, cooldown=(0.5, 0.5), elastic_timeout_s=20.0)
    assert_round(sim.start({"a": 2}), 1, needs_sync=True)
    if reported:  # rank 0 committed, stored the checkpoint and said so; no heartbeat carried the commit yet
        reply = plane(sim).handle("checkpoint", {"worker": sim.id("a[0]"), "event": "saved", "step": 1,
                                                 "path": "/ckpt/ckpt-1", "commit_seq": 1})
        assert reply == {"ok": True}
    sim.exit("a[1]", CRASH)
    sim.exit("a[0]", CRASH)
    if not reported:  # nothing committed that the driver knows of, nothing stored: nothing to resume from
        failed(sim, "all workers failed; last: worker ")
        return
    assert sim.outcome is None
    sim.advance(1)  # past the slots' cooldown: both relaunched
    assert_round(sim.join("a[0]", "a[1]"), 2, needs_sync=True)
    assert [f["from_checkpoint"] for kind, f in sim.events if kind == "round_formed"] == [False, True]
