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


def _commit_line(sim: Sim) -> str:
    return next(line for line in render_status(_status(sim), now=sim.now).splitlines() if "last commit" in line)


def test_a_commit_no_live_worker_holds_is_shown_lost_with_the_checkpoint_the_next_round_resumes_from():
    """Every holder of commit 57 SIGKILLed (a whole spot fleet), the newest checkpoint of commit 40: status said
    '#57 (the job's: no round now)', and '#57' for the round resuming from the checkpoint, while the driver's
    next line said 17 committed steps after it were lost."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, checkpointing=True)
    for slot in ("a[0]", "b[0]"):
        sim.job.heartbeat(sim.id(slot), sim.now, 57, commit_seq=57)
    sim.job.checkpoint_saved(40, 40)
    sim.exit("a[0]")
    sim.exit("b[0]")
    sim.advance(1)
    reply = _status(sim)
    assert (reply.world_size, reply.commit_step, reply.commit_lost) == (0, 40, True)
    assert "last commit lost; resumes from the checkpoint of commit #40," in _commit_line(sim)
    sim.discover({"c": 2})
    sim.advance(1)
    sim.join("c[0]", "c[1]")
    sim.advance(1)
    reply = _status(sim)  # the round from the checkpoint: its members' commit only, none reported yet
    assert reply.world_size >= 1 and reply.commit_step is None and not reply.commit_lost
    assert "last commit -," in _commit_line(sim)


def test_a_lost_commit_with_no_checkpoint_reported_says_so():
    sim = started(2, {"a": 1, "b": 1}, min_np=1, checkpointing=True)
    for slot in ("a[0]", "b[0]"):
        sim.job.heartbeat(sim.id(slot), sim.now, 9, commit_seq=9)
    sim.exit("a[0]")
    sim.exit("b[0]")
    sim.advance(1)
    assert "last commit lost; resumes from the latest checkpoint, if any," in _commit_line(sim)
