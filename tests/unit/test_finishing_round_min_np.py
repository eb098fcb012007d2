"""A finishing round is not ended by the --min-np wait (review s57 rvC F2 of 651dc0c, twohost_notice.py).

-np 2 on hosts a and b, --elastic-timeout 20: rank 1 (host b) returned at the last commit and waited for rank 0,
whose training function ran a 30 s evaluation; a notice for host b sent rank 1 away writing the commit it held, and
20 s later the job failed "fewer than --min-np 2 worker(s) for 20s (elastic timeout)", rank 0's evaluation killed.
Rank 0's return completes the job however few workers are left: it succeeds, however long rank 0 takes
(``--finish-timeout`` counts from rank 0's return).
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.providers.api import Drain
from tests.unit.test_job import CLEAN, KILLED, started

pytestmark = pytest.mark.timeout(10)

LAST = 40


def rank1_left_with_the_final_state(**policy):
    """Rank 0 on a, rank 1 on b, both at commit LAST (a checkpoint of step 1 stored); rank 1 returns and waits; a
    notice for b (15 s ahead) sends it away at b's leave-by time writing commit LAST; it leaves. Rank 0 is still in
    its training function (an evaluation), heartbeating."""
    sim = started(2, {"a": 1, "b": 1}, checkpointing=True, elastic_timeout_s=20, **policy)
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    for wid in (r0, r1):
        sim.commits[wid] = LAST
        sim.job.heartbeat(wid, sim.now, LAST, LAST)
    sim.job.checkpoint_saved(1, 1)
    assert sim.job.completed(r1, sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    sim.advance(0.5)
    sim.discover({"a": 1}, {"b": Drain(deadline=sim.now + 15, reason="spot interruption")})
    told = None
    for _ in range(40):
        sim.advance(0.5)
        told = sim.job.completion_reply(r1)
        if told is not None:
            break
    assert told is not None and told[0] == "leave", told
    assert sim.job.leaving_checkpoint(r1)[1]  # it writes the commit it holds
    sim.job.checkpoint_saved(LAST, LAST)
    sim.exit("b[0]", CLEAN)
    sim.advance(0.5)
    return sim, r0


def test_rank_0_in_a_long_evaluation_after_the_returned_member_left_completes_the_job(caplog) -> None:
    caplog.set_level(logging.INFO)
    sim, r0 = rank1_left_with_the_final_state()
    sim.advance(60)  # three times --elastic-timeout, rank 0 still evaluating (heartbeating)
    assert sim.outcome is None, sim.outcome
    assert "elastic timeout" not in caplog.text and "waiting up to 20s" not in caplog.text, caplog.text
    assert "the job waits for rank 0 to return, however few workers are left" in caplog.text
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.advance(35)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome


def test_finish_timeout_does_not_bound_the_hold_rank_0s_return_still_completes_the_job(caplog) -> None:
    """--finish-timeout counts from rank 0's return (review s57 rvG F1): rank 0 evaluating twice as long after rank 1
    left is neither stopped nor ended by the --min-np wait."""
    sim, r0 = rank1_left_with_the_final_state(finish_timeout_s=30)
    sim.advance(60)
    assert sim.outcome is None and sim.stops == [], sim.outcome
    assert "elastic timeout" not in caplog.text
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome


def test_rank_0_lost_in_its_evaluation_after_the_member_left_still_ends_the_job() -> None:
    """Rank 0 killed during the hold: the wait for --min-np starts then, and the job ends after it (the final state
    is in the checkpoint rank 1 wrote)."""
    sim, _ = rank1_left_with_the_final_state()
    sim.advance(10)
    sim.exit("a[0]", KILLED)
    for _ in range(60):
        sim.advance(1)
        if sim.outcome is not None:
            break
    assert sim.outcome is not None and not sim.outcome.success, sim.outcome
