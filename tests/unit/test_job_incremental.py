"""The incremental bookkeeping of rendezvous (driver scale): a round forms in the call of its
last arrival, with no tick in between, and only the workers whose answer changed are news."""

from __future__ import annotations

import random

import pytest

from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.driver.job.elastic_job import Assignment, ElasticJob, ExitOrder, Launch, Policy
from cloud_elastic.providers.api import DiscoveredHosts, Drain

pytestmark = pytest.mark.timeout(10)

T0 = 1000.0


def job_on(hosts: dict[str, int], np: int, *, min_np: int = 1, max_np: int | None = None) -> tuple[ElasticJob, list[str]]:
    job = ElasticJob(Policy(np, min_np, max_np or np), HostManager(Blacklist((10, 300), random.Random(0))), job_id="t")
    job.start(T0)
    job.discovered(DiscoveredHosts(ready=hosts), T0)
    ids = [a.worker_id for a in job.take_actions() if isinstance(a, Launch)]
    for w in ids:
        job.registered(w, T0)
    return job, ids


def arrive(job: ElasticJob, w: str, last_round: int = 0, reason: str = "start", commits: int = 0, now: float = T0):
    job.rendezvous(w, last_round, reason, now, commits)
    return job.assignment(w)


def test_the_first_round_forms_on_the_np_th_arrival_and_not_before():
    job, ids = job_on({"a": 4}, 4)
    replies = [arrive(job, w) for w in ids[:3]]
    assert replies == [None, None, None] and job.round == 0
    last = arrive(job, ids[3])
    assert isinstance(last, Assignment) and last.round == 1 and last.ranks.size == 4
    assert sorted(job.assignment(w).ranks.rank for w in ids) == [0, 1, 2, 3]


def test_a_new_round_forms_exactly_when_the_last_member_is_back():
    job, ids = job_on({"a": 4, "b": 1}, 4, max_np=5)
    members, newcomer = ids[:4], ids[4]
    for w in members:
        arrive(job, w)
    assert job.round == 1
    # The newcomer is ready: the running round is asked for an update, and waits for it.
    assert arrive(job, newcomer) is None and job.update_gen == 1
    for w in members[:3]:
        assert arrive(job, w, last_round=1, reason="update", commits=5) is None
    assert job.round == 1, "a round formed while one member was still training"
    reply = arrive(job, members[3], last_round=1, reason="update", commits=5)
    assert isinstance(reply, Assignment) and reply.round == 2 and reply.ranks.size == 5
    assert job.assignment(newcomer).ranks.rank == 4  # the newcomer comes last; the oldest stays rank 0
    assert job.assignment(members[0]).ranks.rank == 0


def test_a_repeated_long_poll_of_a_waiting_worker_changes_nothing():
    job, ids = job_on({"a": 3}, 3)
    arrive(job, ids[0])
    for _ in range(5):
        assert arrive(job, ids[0]) is None
    assert job.round == 0 and job.take_rendezvous_news() == set()


def test_news_names_the_members_of_a_formed_round_and_no_one_else():
    job, ids = job_on({"a": 3}, 2, min_np=2, max_np=3)
    arrive(job, ids[0])
    assert job.take_rendezvous_news() == set()
    arrive(job, ids[1])  # -np 2: the first round forms in this call, without the third worker
    assert job.round == 1 and job.take_rendezvous_news() == {ids[0], ids[1]}
    assert arrive(job, ids[2]) is None  # a newcomer: waits for the next round, and is no one's news
    assert job.update_gen == 1 and job.take_rendezvous_news() == set()


def test_news_names_a_waiting_worker_told_to_leave_and_not_the_others_waiting():
    job, ids = job_on({"a": 1, "b": 1, "c": 1}, 3, min_np=3)
    arrive(job, ids[0])
    arrive(job, ids[1])
    job.take_rendezvous_news()
    b = next(w for w in ids if w.startswith("b"))
    job.notice("b", Drain(deadline=None, reason="spot interruption"), T0, source="test")
    assert job.take_rendezvous_news() == {b}
    assert isinstance(job.assignment(b), ExitOrder)
    assert job.assignment(ids[0]) is None  # the other waiting worker still waits


def test_a_worker_silent_past_the_timeout_is_given_up_at_the_first_tick_after_it_and_not_before():
    # Ticks skip their scan of every worker while no one can have been silent for the timeout
    # (5 s); the silent worker must still be found on time, and the others, heartbeating, never.
    from cloud_elastic.driver.job.elastic_job import Stop

    job = ElasticJob(Policy(4, 1, 4), HostManager(Blacklist((10, 300), random.Random(0))), job_id="t")
    job.start(T0)
    job.discovered(DiscoveredHosts(ready={"a": 4}), T0)
    ids = [a.worker_id for a in job.take_actions() if isinstance(a, Launch)]
    job.tick(T0 + 0.05)  # the driver ticks while its workers are still starting (importing torch)
    for w in ids:
        job.registered(w, T0 + 0.1)
        arrive(job, w, now=T0 + 0.1)
    silent, now = ids[2], T0 + 0.1
    while now < T0 + 5.1:
        now = round(now + 0.05, 2)
        for w in ids:
            if w != silent:
                job.heartbeat(w, now)
        job.tick(now)
        assert not [a for a in job.take_actions() if isinstance(a, Stop)], f"a worker was given up at {now}"
    now = round(now + 0.05, 2)
    job.tick(now)
    stops = [a for a in job.take_actions() if isinstance(a, Stop)]
    assert [s.worker_id for s in stops] == [silent] and "stopped answering heartbeats" in stops[0].reason
