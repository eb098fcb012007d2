"""``status`` between rounds shows the job's last commit, which the survivors still hold.

It showed ``world size 0 ... last commit -`` while a drained job waited for its next
round: the commit was taken from the current round's members only, and between rounds
there are none, so a reader could think the training state was gone.
"""

from __future__ import annotations

import pytest

from cloud_elastic.config import JobConfig
from cloud_elastic.driver.job.status_reply import status_reply
from cloud_elastic.status import StatusReply, render_status
from tests.unit.test_job import Sim, started

pytestmark = pytest.mark.timeout(10)

CONFIG = JobConfig(command=("python", "t.py"), num_proc=3, min_np=3, max_np=3)


def _status(sim: Sim) -> StatusReply:
    reply = status_reply(sim.job, CONFIG, provider="static", now=sim.now, wall_now=sim.now, uptime_s=60)
    return StatusReply.from_json(reply.to_json())


def test_between_rounds_status_shows_the_commit_the_survivors_hold():
    sim = started(3, {"a": 2, "b": 1})
    for slot in ("a[0]", "a[1]", "b[0]"):
        sim.job.heartbeat(sim.id(slot), sim.now, 57, commit_seq=57)
    assert _status(sim).commit_step == 57  # in the round: the round's commit, as before
    sim.exit("b[0]")  # its round ends; the survivors roll back to commit 57 and wait for a third worker
    sim.join("a[0]", "a[1]")
    sim.advance(1)
    reply = _status(sim)
    assert reply.world_size == 0 and reply.commit_step == 57
    text = render_status(reply, now=sim.now)
    assert "last commit #57 (the job's: no round now)" in text, text
