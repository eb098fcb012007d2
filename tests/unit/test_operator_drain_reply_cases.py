"""``cloud-elastic drain``: the reply, and the slot drain's log line, say what the drained worker then does (review
s58 rvH F3, F5 and its suspicion of health.py's slot-drain line).

* F3 (drain_el_setup.sh): an ELASTIC script still in its set-up after ``hvd.init()`` (round 1 formed, no worker in
  ``hvd.elastic.run`` yet): the reply said the drained worker "run(s) to the end of the script with the others", and
  it left at its first commit. The driver cannot tell yet whether the script is elastic, so the reply says both: it
  leaves at its first commit if the script enters ``hvd.elastic.run``, or runs to the end of the script if it never
  does (the fixed-size half: test_operator_drain_fixed_size.py).
* F5 (drain_parked.sh): a member whose training function returned, parked until rank 0 returns from its own: the
  reply said it "leave(s) at their next commit"; it stayed until rank 0 returned, 19 s later, and ran to the end of
  its script. The reply says so.
* The slot drain's log line said "it leaves at its next commit" whatever the worker did (one still in its set-up is
  stopped now): it says what the reply says.
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.elastic_job import WorkerState
from tests.unit.test_job import CLEAN, Sim, started

pytestmark = pytest.mark.timeout(30)

S = WorkerState
LAST = 40
EITHER = ("leave at their first commit if the script enters hvd.elastic.run, or run to the end of the script with "
          "the others if it never does (none has entered it yet; a fixed-size script cannot leave at a commit)")
PARKED = ("whose training function returned stay until rank 0 returns from its own, then run to the end of the "
          "script, or leave the job if that return proves early (rank 0 still in its loop waits 5s in a collective "
          "that needs them; the others then roll back to their last commit)")


# --------------------------------------------- F3: an elastic script still in its set-up after hvd.init()
def _set_up_after_init() -> Sim:
    """-np 2 --min-np 1 on a[0] and b[0]: round 1 formed (both passed hvd.init()), no worker in hvd.elastic.run yet."""
    return started(2, {"a": 1, "b": 1}, min_np=1, elastic_timeout_s=300, progress_timeout_s=0)


def _script_enters_elastic_run(sim: Sim, drained: str) -> None:
    """Both workers enter hvd.elastic.run; at the first commit the drained one leaves and the other re-forms alone."""
    for slot in ("a[0]", "b[0]"):
        sim.job.fixed.entered(sim.id(slot))
    sim.commit("a[0]", "b[0]")
    sim.join("a[0]", reason="update")
    sim.join(drained, reason="update")
    assert sim.job.workers[sim.id(drained)].state is S.EXITING  # told to leave at rendezvous: it left at that commit
    sim.exit(drained, CLEAN)
    sim.advance(2)


def test_a_host_drained_in_the_set_up_of_an_elastic_script_says_it_leaves_at_its_first_commit_and_it_does() -> None:
    """drain_el_setup.sh: before, 'its 1 worker(s) run to the end of the script with the others (...)'."""
    sim = _set_up_after_init()
    done, message = sim.job.drain("b", None, sim.now)
    assert done and message == (f"host b drains: its 1 worker(s) {EITHER}; no new worker is placed there until it "
                                "leaves discovery"), message
    _script_enters_elastic_run(sim, "b[0]")
    assert sim.outcome is None and sim.layout() == ["a[0]"] and sim.job.round == 2


def test_a_slot_drained_in_the_set_up_of_an_elastic_script_says_so_in_the_reply_and_the_log(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_elastic.driver.job.health")
    sim = _set_up_after_init()
    done, message = sim.job.drain("b", 0, sim.now)
    either = EITHER.replace("leave at their", "leaves at its").replace("or run to", "or runs to")
    assert done and message.startswith(f"worker {sim.id('b[0]')} {either}; slot b[0] blacklisted"), message
    assert f"drained by hand (cloud-elastic drain b:0); it {either}; its slot is blacklisted" in caplog.text
    _script_enters_elastic_run(sim, "b[0]")
    assert sim.outcome is None and sim.layout() == ["a[0]"]


# ---------------------------------------- the suspicion: a slot drained while its worker is in its set-up
def test_the_log_line_of_a_slot_drained_during_set_up_says_it_leaves_now(caplog) -> None:
    """Before: 'drained by hand (cloud-elastic drain a:1); it leaves at its next commit', while it was stopped."""
    caplog.set_level(logging.WARNING, logger="cloud_elastic.driver.job.health")
    sim = Sim(2, hosts_fixed=True)
    sim.discover({"a": 2})  # both still in their set-up, before hvd.init()
    assert sim.job.drain("a", 1, sim.now)[0]
    line = [r.getMessage() for r in caplog.records if "cloud-elastic drain a:1" in r.getMessage()]
    assert len(line) == 1 and "next commit" not in line[0], line
    assert ("; it, not yet in a round, leaves now (stopped in its set-up, or told to exit at rendezvous); its slot is "
            "blacklisted for ") in line[0], line
    sim.advance(0.5)
    assert sim.id("a[1]") in [s.worker_id for s in sim.stops]  # as it says: stopped now


# -------------------------------------------------------------- F5: a parked member's host
def _rank1_parked() -> Sim:
    """-np 2 --min-np 1, rank 0 on a, rank 1 on b, both at commit LAST; rank 1's training function returned and it
    waits (parked) while rank 0 is still in its own (an evaluation: heartbeating, in no collective)."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, elastic_timeout_s=20)
    for slot in ("a[0]", "b[0]"):
        sim.job.fixed.entered(sim.id(slot))
        sim.commits[sim.id(slot)] = LAST
        sim.job.heartbeat(sim.id(slot), sim.now, LAST, LAST)
    assert sim.job.completed(sim.id("b[0]"), sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    return sim


def _stays_until_rank_0_returns_then_runs_on(sim: Sim) -> None:
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    sim.advance(19)  # rank 0's evaluation
    assert sim.job.workers[r1].alive and sim.job.completion_reply(r1) is None  # still waiting, as the reply said
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r1) == ("done", "")  # the rest of its script runs
    sim.exit("a[0]", CLEAN)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome
    assert sim.outcome.reason.startswith("training completed on 2 worker(s)"), sim.outcome


def test_a_parked_members_host_drained_says_it_stays_until_rank_0_returns_and_it_does() -> None:
    """drain_parked.sh: before, 'its 1 worker(s) leave at their next commit'."""
    sim = _rank1_parked()
    done, message = sim.job.drain("b", None, sim.now)
    assert done and message == (f"host b drains: its 1 worker(s) {PARKED}; no new worker is placed there until it "
                                "leaves discovery"), message
    _stays_until_rank_0_returns_then_runs_on(sim)


def test_a_parked_members_slot_drained_says_so_in_the_reply_and_the_log(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_elastic.driver.job.health")
    sim = _rank1_parked()
    done, message = sim.job.drain("b", 0, sim.now)
    how = ("whose training function returned, stays until rank 0 returns from its own, then runs to the end of the "
           "script, or leaves the job if that return proves early (rank 0 still in its loop waits 5s in a collective "
           "that needs it; the others then roll back to their last commit)")
    assert done and message.startswith(f"worker {sim.id('b[0]')}, {how}; slot b[0] blacklisted"), message
    assert f"(cloud-elastic drain b:0); it, {how}; its slot" in caplog.text
    _stays_until_rank_0_returns_then_runs_on(sim)


def test_a_host_with_a_parked_member_and_a_training_one_says_what_each_does() -> None:
    """-np 3 on a[0] (rank 0) and b[0], b[1]: b[1] returned and waits, b[0] trains on (it leaves at its next commit)."""
    sim = started(3, {"a": 1, "b": 2}, min_np=1, elastic_timeout_s=20)
    for slot in ("a[0]", "b[0]", "b[1]"):
        sim.job.fixed.entered(sim.id(slot))
        sim.commits[sim.id(slot)] = LAST
        sim.job.heartbeat(sim.id(slot), sim.now, LAST, LAST)
    assert sim.job.completed(sim.id("b[1]"), sim.now, commit_seq=LAST, steps=LAST) == ("wait", "")
    done, message = sim.job.drain("b", None, sim.now)
    assert done and message.startswith(f"host b drains: its 1 worker(s) leave at their next commit if rank 0 is still "
                                       "in its training loop, or run to the end of the script with the others if it is "
                                       "past it (rank 2 returned from its training function at the last commit: the "
                                       f"round is likely finishing), and its 1 worker(s) {PARKED}; no new "
                                       "worker"), message
