"""The cost per commit is called so: status and the driver's end line said "per committed step" of a figure
that is the cost over the job's commits (``state.commit()`` calls), which a script committing every N
optimizer steps makes N times fewer of."""

from __future__ import annotations

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.status_reply import status_reply
from cloud_elastic.driver.runtime.costs import final_cost
from cloud_elastic.status import StatusReply, render_status
from tests.unit.test_job_sourcing import Sourced

pytestmark = pytest.mark.timeout(30)


def test_status_and_the_end_line_call_the_cost_per_commit_a_cost_per_commit():
    sim = Sourced(2, progress_timeout_s=0)
    sim.groups(a=1, b=1, od=1)
    sim.join("a0[0]", "b0[0]")
    sim.advance(360)
    for slot in ("a0[0]", "b0[0]"):  # e.g. 20 optimizer steps, a commit every 10
        sim.job.heartbeat(sim.id(slot), sim.now, 2, commit_seq=2)
    config = JobConfig(command=("python", "t.py"), num_proc=2, min_np=2, max_np=2)
    reply = StatusReply.from_json(status_reply(sim.job, config, provider="aws", now=sim.now, wall_now=sim.now,
                                               uptime_s=360).to_json())
    assert reply.cost_per_step == pytest.approx(reply.cost / 2)
    text = render_status(reply, now=sim.now)
    assert "cost $0.22 so far, $2.20/h now, $0.11 per commit" in text and "step" not in text.split("cost ")[1]
    line = final_cost(sim.job, sim.now).line
    assert ", $0.11 per commit (2 commit(s))" in line and "step" not in line, line
