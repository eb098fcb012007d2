"""The cost per commit of a run that resumed a job counts this run's commits and dollars only.

Review of 0b8a78b: a new run of a job resumed from the checkpoint of commit 1000 made 2 commits, and its end
line said "$0.0002 per commit (1002 commit(s))": its dollars over every commit of the job's earlier runs. An
adopted driver likewise divided its dollars, with those carried from its crashed predecessor, by the job's
whole history.
"""

from __future__ import annotations

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.cost import CostSoFar
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.status_reply import status_reply
from cloud_elastic.driver.runtime.costs import final_cost
from cloud_elastic.protocol import AdoptRequest, RankInfo
from cloud_elastic.status import StatusReply
from tests.unit.test_job_sourcing import Sourced

pytestmark = pytest.mark.timeout(30)

CONFIG = JobConfig(command=("python", "t.py"), num_proc=2, min_np=2, max_np=2)


def resumed() -> Sourced:
    """A job the driver resumes from its checkpoints, on spot-a and spot-b ($2.20 an hour for both slots)."""
    sim = Sourced(2, progress_timeout_s=0, checkpointing=True)
    sim.job.resumed = sim.job.state_committed = True  # what Driver._resume sets
    return sim


def commit_to(sim: Sourced, commit_seq: int, *worker_ids: str) -> None:
    for wid in worker_ids:
        sim.job.heartbeat(wid, sim.now, commit_seq, commit_seq=commit_seq)


def cost_per_commit(sim: Sourced) -> tuple[float | None, str]:
    """What status says the cost per commit is, and the driver's end line."""
    reply = StatusReply.from_json(status_reply(sim.job, CONFIG, provider="aws", now=sim.now, wall_now=sim.now,
                                               uptime_s=360).to_json())
    return reply.cost_per_step, str(final_cost(sim.job, sim.now).line)


def test_a_run_resumed_from_a_checkpoint_divides_its_cost_by_the_commits_it_made():
    sim = resumed()
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.job.checkpoint_loaded(10000, 1000, "s3://bucket/ckpt")  # rank 0 of the first round loaded commit 1000
    sim.advance(360)
    commit_to(sim, 1002, sim.id("a0[0]"), sim.id("b0[0]"))  # this run: 2 commits for its $0.22
    per_step, line = cost_per_commit(sim)
    assert per_step == pytest.approx(0.11)
    assert "cost $0.22 for 0.200 slot-hour(s), $0.11 per commit (2 commit(s))" in line, line
    sim.advance(60)  # a cost event is due
    cost = [fields for kind, fields in sim.events if kind == "cost"][-1]
    assert cost["per_step"] == pytest.approx(cost["dollars"] / 2, abs=1e-5)


def test_an_adopted_driver_divides_its_own_cost_by_the_commits_since_the_adopted_commit():
    sim = resumed()
    sim.job.begin_adoption(last_seq=7)
    for rank, host in enumerate(("a0", "b0")):  # the crashed driver's round, at commit 40
        request = AdoptRequest(3, RankInfo(rank, 2, 0, 1, rank, 2), update_gen=4, seen_update=5, seen_abort=2,
                               commits=40, slot=0, pid=100 + rank, commit_seq=40)
        assert sim.job.adopt(f"{host}[0]#{6 + rank}", Slot(host, 0), 6 + rank, request, sim.now) is None
    sim.job.end_adoption(sim.now, {})
    sim.groups(a=1, b=1, od=1)
    sim.job.capacity.sourcing.carry_cost(CostSoFar(dollars=5.0, slot_hours=2.0))  # the crashed driver's 40 commits
    sim.advance(360)
    commit_to(sim, 42, "a0[0]#6", "b0[0]#7")
    per_step, line = cost_per_commit(sim)
    assert per_step == pytest.approx(0.11)
    assert "cost $5.22 for 2.200 slot-hour(s), $0.11 per commit (2 commit(s) for this driver's $0.22, not the " \
           "cost carried from before it)" in line, line


def test_a_run_that_has_not_loaded_its_checkpoint_yet_has_no_cost_per_commit():
    sim = resumed()
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.advance(360)
    per_step, line = cost_per_commit(sim)
    assert per_step is None and "per commit" not in line, line
