"""Round formation on its own (cloud_elastic.driver.job.formation): when a round forms, updates, rollbacks,
and the O(1) bookkeeping of arrivals."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.formation import RoundFormation
from cloud_elastic.providers.api import DiscoveredHosts
from tests.unit.job_view import T0, FakeJob, S

pytestmark = pytest.mark.timeout(30)  # the first test may import torch (conftest)


class Drains:
    def __init__(self) -> None:
        self.draining_round = -1
        self.forced: list[str] = []

    def members_may_drain(self, round_: int) -> bool:
        return round_ == self.draining_round

    def take_forced_drains(self) -> list[str]:
        lines, self.forced = self.forced, []
        return lines


def formation(np: int = 2, **kwargs) -> tuple[FakeJob, RoundFormation, list[float], Drains]:
    job = FakeJob(np, **kwargs)
    job.hosts.update(DiscoveredHosts(ready={"a": 4, "b": 4}), T0)
    formed: list[float] = []
    drains = Drains()
    return job, RoundFormation(job, drains, formed.append), formed, drains


def arrive(job: FakeJob, rounds: RoundFormation, *workers) -> None:
    for w in workers:
        w.state = S.WAITING
        rounds.now_waiting(w.worker_id)


def test_the_first_round_forms_once_np_wait_and_not_before() -> None:
    job, rounds, formed, _ = formation(2, max_np=3)
    a0, a1, b0 = job.worker("a", 0), job.worker("a", 1), job.worker("b", 0)
    rounds.index(job.alive())
    arrive(job, rounds, a0)
    assert not rounds.may_form()
    rounds.maybe_form(T0)
    assert job.round == 0
    arrive(job, rounds, a1)
    assert rounds.may_form()  # -np 2: the third worker, still starting, joins later as a scale-up
    rounds.maybe_form(T0 + 1)
    assert job.round == 1 and job.phase is Phase.RUNNING and formed == [T0 + 1]
    assert (a0.state, a0.rank, a1.rank, b0.state) == (S.RUNNING, 0, 1, S.STARTING)
    reply = rounds.assignment(a1)
    assert reply.round == 1 and reply.ranks.size == 2 and reply.needs_sync
    assert rounds.assignment(b0) is None
    event = dict(job.events)["round_formed"]
    assert event["size"] == 2 and event["ranks"] == {"a": [0, 1]} and event["step"] is None
    assert event["workers"] == [a0.worker_id, a1.worker_id]  # in rank order (the timeline's lanes)


def test_a_round_waits_for_its_last_running_member_and_a_newcomer_asks_for_one_update() -> None:
    job, rounds, _, _ = formation(2, max_np=3)
    a0, a1, b0 = job.worker("a", 0), job.worker("a", 1), job.worker("b", 0)
    arrive(job, rounds, a0, a1)
    rounds.maybe_form(T0)
    rounds.index(job.alive())
    arrive(job, rounds, b0)
    assert rounds.arrived(b0) is False and job.update_gen == 1
    rounds.maybe_request_update()
    assert job.update_gen == 1  # once per round
    arrive(job, rounds, a0)
    assert rounds.member_left(running_only=True) and not rounds.may_form()
    arrive(job, rounds, a1)
    assert not rounds.member_left(running_only=True) and rounds.may_form()
    rounds.maybe_form(T0 + 1)
    assert job.round == 2 and job.resets == 1 and (a0.rank, a1.rank, b0.rank) == (0, 1, 2)
    assert rounds.round_update_gen == 1


def test_a_draining_member_asks_for_an_update_only_where_leavers_said_so() -> None:
    job, rounds, _, drains = formation(2)
    a0, a1 = job.worker("a", 0), job.worker("a", 1)
    arrive(job, rounds, a0, a1)
    rounds.maybe_form(T0)
    a1.state = S.DRAINING
    rounds.maybe_request_update()
    assert job.update_gen == 0  # no member was marked draining in this round, as far as leavers know
    drains.draining_round = 1
    rounds.maybe_request_update()
    assert job.update_gen == 1


def test_the_next_round_reports_the_aborted_rounds_rollback_with_the_steps_lost() -> None:
    job, rounds, _, drains = formation(2, min_np=1)
    a0, a1 = job.worker("a", 0, commits=3), job.worker("a", 1, commits=3)
    job.state_committed = True
    arrive(job, rounds, a0, a1)
    rounds.maybe_form(T0)
    a1.state = S.EXITED
    rounds.pending_rollback, job.last_failure = 1, "worker a[1] exited with code 1"
    drains.forced = ["job t: host a drained (...): "]
    a0.commit_seq = 5
    rounds.steps_lost = 2
    arrive(job, rounds, a0)
    rounds.maybe_form(T0 + 1)
    kinds = job.kinds()
    assert kinds.index("rollback") < kinds.index("round_formed", 1)
    rollback = dict(job.events)["rollback"]
    assert rollback == {"round": 1, "commit_step": 5, "steps_lost": 2, "reason": "worker a[1] exited with code 1"}
    assert rounds.pending_rollback is None and rounds.steps_lost == 0 and drains.forced == []


def test_the_reset_limit_ends_the_job_instead_of_forming_a_round() -> None:
    job, rounds, _, _ = formation(1, reset_limit=0)
    a0 = job.worker("a", 0)
    arrive(job, rounds, a0)
    rounds.maybe_form(T0)
    arrive(job, rounds, a0)
    rounds.maybe_form(T0 + 1)
    assert job.round == 1 and "reset limit exceeded: reset 1 would exceed --reset-limit 0" in job.outcome.reason
    assert job.resets == 0  # job_finished's count: no round formed after the first


def test_news_names_the_workers_that_stopped_waiting_since_the_last_step() -> None:
    job, rounds, _, _ = formation(2)
    a0, a1 = job.worker("a", 0), job.worker("a", 1)
    arrive(job, rounds, a0, a1)
    rounds.index(job.alive())
    rounds.maybe_form(T0)
    rounds.index(job.alive())
    assert rounds.take_news() == {a0.worker_id, a1.worker_id} and rounds.take_news() == set()


def test_an_adopted_round_goes_on_with_the_adopted_ranks() -> None:
    job, rounds, formed, _ = formation(1)
    w = job.worker("a", 0, S.RUNNING, round_=4, rank=0)
    job.round = 4
    from cloud_elastic.protocol import RankInfo

    rounds.adopt_round({w.worker_id: RankInfo(0, 1, 0, 1, 0, 1)}, update_gen=3, now=T0)
    assert formed == [job.running(T0)], "the no-progress watch must start over at the adoption"
    reply = rounds.assignment(w)
    assert (reply.round, reply.update_gen, reply.needs_sync, reply.from_checkpoint) == (4, 3, False, False)
    assert rounds.rank0() is w
