"""``cloud-elastic drain``: the reply and the log say what happens (review s58 rvM findings 2, 3 and 6).

* F2 (k2/drain_early.sh): a member parked after its training function returned, drained at once: the reply said it
  stays until rank 0 returns, then runs to the end of the script; its return was early (rank 0 still in its loop, in
  a collective that needs it), and it was sent away 10 s later as an early return, rank 0 rolling back. The driver
  cannot tell which until rank 0 returns or waits in that collective: the reply says both, and the release's line
  what happened.
* F3 (k/r0drain.out): rank 0's host drained while rank 0 evaluates past its loop, a peer parked at the last commit:
  the reply and the notice line said it leaves at its next commit; it never committed again and ran to the end, and
  the release line said "left at a commit". The reply says both; the release line says it ran to the end.
* F6 (k2/double_drain*.sh): a second drain of a host or slot whose worker is still leaving was refused with "no host
  b in this job" / "no worker on b[0]": it says the host (or worker) is already draining, and (review s59 rvO
  finding 3) what its workers do, per kind as the first reply says: a parked one was said to be leaving.
"""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.driver.job.completion import EARLY_RETURN_WAIT_S
from cloud_elastic.driver.job.elastic_job import WorkerState
from tests.unit.test_job import CLEAN, started
from tests.unit.test_operator_drain_reply_cases import LAST
from tests.unit.test_operator_drain_reply_cases import _rank1_parked as _rank1_returned

pytestmark = pytest.mark.timeout(30)

S = WorkerState
EARLY = ("or leave the job if that return proves early (rank 0 still in its loop waits 5s in a collective that needs "
         "them; the others then roll back to their last commit)")
FINISHING = ("leave at their next commit if rank 0 is still in its training loop, or run to the end of the script with "
             "the others if it is past it (rank 1 returned from its training function at the last commit: the round is "
             "likely finishing)")
HELD = "no new worker is placed there until it leaves discovery"


def _log(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# ------------------------------------------------ F2: the parked member's return was early
def test_a_parked_member_drained_says_it_may_leave_as_an_early_return_and_the_release_says_it_did(caplog) -> None:
    """drain_early.sh: before, the reply promised it stays until rank 0 returns; it left as an early return."""
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.job.leaving")
    sim = _rank1_returned()
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    done, message = sim.job.drain("b", None, sim.now)
    assert done and message == (f"host b drains: its 1 worker(s) whose training function returned stay until rank 0 "
                                f"returns from its own, then run to the end of the script, {EARLY}; {HELD}"), message
    sim.advance(1)
    sim.job.heartbeat(r0, sim.now, LAST, LAST, waiting_s=EARLY_RETURN_WAIT_S + 1)  # rank 0 is in its loop after all
    sim.job.tick(sim.now)
    assert sim.job.workers[r1].state is S.EXITING and sim.job.workers[r1].returned_early
    assert sim.job.completion_reply(r1)[0] == "leave"  # as the reply's second half said
    sim.exit("b[0]", CLEAN)
    sim.join("a[0]", reason="failure")  # rank 0 rolls back to its last commit and trains on alone
    sim.advance(2)
    assert sim.outcome is None and sim.layout() == ["a[0]"]
    released = _log(caplog, "host b drained")
    assert len(released) == 1 and released[0].endswith(
        "its 1 worker(s) left as early returns (their training function returned while rank 0 still trained; the "
        "others rolled back to their last commit)"), released


# ------------------------------------ F3: rank 0's host drained while it is past its loop
def test_rank_0s_host_drained_while_a_peer_is_parked_says_it_may_run_to_the_end_and_the_release_says_it_did(
        caplog) -> None:
    """r0drain.out: before, 'its 1 worker(s) leave at their next commit' in the reply and the notice line, and 'its
    workers left at a commit; 0 steps lost' at the release, while rank 0 ran to the end of the script."""
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.job.leaving")
    sim = _rank1_returned()
    r0, r1 = sim.id("a[0]"), sim.id("b[0]")
    done, message = sim.job.drain("a", None, sim.now)
    assert done and message.startswith(f"host a drains: its 1 worker(s) {FINISHING}; {HELD}"), message
    notice = _log(caplog, "notice from operator for host a")
    assert len(notice) == 1 and notice[0].endswith(f"(cloud-elastic drain); its 1 worker(s) {FINISHING}"), notice
    sim.advance(15)  # rank 0's evaluation: no commit
    assert sim.job.completed(r0, sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r1) == ("done", "")
    sim.exit("a[0]", CLEAN)
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    assert sim.outcome is not None and sim.outcome.success, sim.outcome
    released = _log(caplog, "host a drained")
    assert len(released) == 1 and released[0].endswith(
        "its 1 worker(s) ran to the end of the script with the job, which completed"), released


def test_a_parked_members_host_released_after_the_job_completed_says_it_ran_to_the_end(caplog) -> None:
    """drain_parked.sh: the release line said 'its workers left at a commit; 0 steps lost'."""
    caplog.set_level(logging.INFO, logger="cloud_elastic.driver.job.leaving")
    sim = _rank1_returned()
    assert sim.job.drain("b", None, sim.now)[0]
    sim.advance(5)
    assert sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    sim.exit("b[0]", CLEAN)
    sim.advance(1)
    released = _log(caplog, "host b drained")
    assert len(released) == 1 and released[0].endswith(
        "its 1 worker(s) ran to the end of the script with the job, which completed"), released


# ------------------------------------------------------ F6: a drain of what is draining already
def test_a_second_drain_of_a_host_or_its_slot_says_it_is_already_draining() -> None:
    """double_drain*.sh: before, 'no host b in this job' and 'no worker on b[0]' (refused, exit status 1)."""
    sim = started(2, {"a": 1, "b": 1}, min_np=1, elastic_timeout_s=20)
    r1 = sim.id("b[0]")
    first = sim.job.drain("b", None, sim.now)
    how = first[1].removeprefix("host b drains: ").removesuffix(f"; {HELD}")
    assert first[0] and how.startswith("its 1 worker(s) leave at their first commit"), first
    # What the first reply said its worker does (rvO F3: not "are leaving" whatever the kind of worker)
    assert sim.job.drain("b", None, sim.now) == (
        True, f"host b is already draining (drained by hand (cloud-elastic drain), notice from operator): {how}; "
              f"{HELD}")
    assert sim.job.drain("b", 0, sim.now) == (
        True, f"worker {r1} on b[0] is already draining (host b is draining (drained by hand (cloud-elastic drain))): "
              f"it leaves at its first commit if the script enters hvd.elastic.run, or runs to the end of the script "
              f"with the others if it never does (none has entered it yet; a fixed-size script cannot leave at a "
              f"commit)")
    sim.commit("a[0]", "b[0]")
    sim.join("a[0]", reason="update")
    sim.join("b[0]", reason="update")
    sim.exit("b[0]", CLEAN)
    sim.advance(2)
    assert sim.layout() == ["a[0]"]
    assert sim.job.drain("b", None, sim.now) == (
        True, f"host b was already drained (drained by hand (cloud-elastic drain), notice from operator): its workers "
              f"have left; {HELD}")
    assert sim.job.drain("c", None, sim.now) == (False, "no host c in this job")  # unknown: still refused


def test_a_host_drained_after_its_slot_says_its_worker_is_already_leaving() -> None:
    sim = started(2, {"a": 1, "b": 1}, min_np=1, elastic_timeout_s=20)
    assert sim.job.drain("b", 0, sim.now)[0]
    done, message = sim.job.drain("b", None, sim.now)
    assert done and message == f"host b drains: its 1 worker(s) already leaving; {HELD}", message


def test_a_second_drain_of_a_parked_members_host_says_it_stays_until_rank_0_returns() -> None:
    """review s59 rvO finding 3 (dd_parked.sh): the second reply said 'its 1 worker(s) are leaving', the slot's
    'already draining'; the worker stayed until rank 0 returned and ran to the end of the script, as the first said."""
    sim = _rank1_returned()
    r1 = sim.id("b[0]")
    first = sim.job.drain("b", None, sim.now)
    assert first[0] and EARLY in first[1], first
    again = sim.job.drain("b", None, sim.now)
    assert again == (True, "host b is already draining (drained by hand (cloud-elastic drain), notice from operator): "
                           "its 1 worker(s) whose training function returned stay until rank 0 returns from its own, "
                           f"then run to the end of the script, {EARLY}; {HELD}"), again
    slot = sim.job.drain("b", 0, sim.now)
    assert slot[0] and "are leaving" not in slot[1] and slot[1].startswith(
        f"worker {r1} on b[0] is already draining (host b is draining (drained by hand (cloud-elastic drain))): it, "
        "whose training function returned, stays until rank 0 returns from its own, then runs to the end of the "
        "script"), slot
    sim.advance(10)  # rank 0 evaluates: the member still waits, as both replies say
    assert sim.job.workers[r1].alive and sim.job.completion_reply(r1) is None
    assert sim.job.completed(sim.id("a[0]"), sim.now, commit_seq=LAST, steps=LAST) == ("done", "")
    assert sim.job.completion_reply(r1) == ("done", "")
