"""The job's side of adoption on its own (cloud_elastic.driver.job.adoption)."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.adoption import Adoption
from cloud_elastic.protocol import AdoptRequest, RankInfo
from tests.unit.job_view import T0, FakeJob, S

pytestmark = pytest.mark.timeout(30)  # the first test may import torch (conftest)


def adoption() -> tuple[FakeJob, Adoption, list, list]:
    job = FakeJob(2)
    seqs: list[int] = []
    rounds: list = []
    return job, Adoption(job, seqs.append, lambda ranks, gen, now: rounds.append((ranks, gen)),
                         lambda worker_id, now, error=None: ("done", "")), seqs, rounds


def member(rank: int, size: int = 2, round_: int = 3, commit_seq: int = 40) -> AdoptRequest:
    return AdoptRequest(round_, RankInfo(rank, size, rank, size, 0, 1), 2, 5, 1, commit_seq, rank, 100 + rank,
                        commit_seq)


def test_adopted_members_keep_their_round_and_the_job_continues_from_what_they_saw() -> None:
    job, window, seqs, rounds = adoption()
    window.begin(last_seq=7)
    assert window.open and seqs == [7]
    assert window.adopt("a[0]#1", Slot("a", 0), 1, member(0), T0) is None
    assert window.adopt("a[0]#1", Slot("a", 0), 1, member(0), T0) is None  # idempotent
    assert window.adopt("a[1]#2", Slot("a", 1), 2, member(1), T0) is None
    w = job.workers["a[0]#1"]
    assert (w.state, w.round, w.rank) == (S.RUNNING, 3, 0)
    assert (job.round, job.update_gen, job.abort_round, job.state_committed, job.commit_high) == (3, 5, 1, True, 40)
    window.end(T0 + 1, {})
    assert not window.open and job.phase is Phase.RUNNING and job.aborts == 0
    (ranks, gen), = rounds
    assert sorted(ranks) == ["a[0]#1", "a[1]#2"] and gen == 2
    assert job.kinds() == ["worker_adopted", "worker_adopted", "adoption_done"]


def test_a_member_that_did_not_come_back_aborts_the_adopted_round() -> None:
    job, window, _, _ = adoption()
    window.begin(last_seq=2)
    window.adopt("a[0]#1", Slot("a", 0), 1, member(0), T0)
    window.end(T0 + 1, {"a[1]#2": "did not re-register within 3s"})
    assert job.aborts == 1 and "round 3 is incomplete after the driver restart" in job.last_failure
    assert dict(job.events)["adoption_done"]["missing"] == ["a[1]#2"]


def test_after_the_window_closes_nobody_is_adopted() -> None:
    job, window, _, _ = adoption()
    window.begin(last_seq=1)
    window.end(T0, {})
    assert window.adopt("a[0]#1", Slot("a", 0), 1, member(0), T0) == "the adoption window of the restarted driver has closed"
    assert job.workers == {} and job.phase is Phase.STARTING
