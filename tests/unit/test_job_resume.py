"""A restarted driver resumes its job: the first round loads the latest durable checkpoint."""

from __future__ import annotations

import random

import pytest

from cloud_elastic.driver.hosts import Blacklist, HostManager
from cloud_elastic.driver.job import Assignment, ElasticJob, Phase, Policy
from tests.unit.test_job import KILLED, Sim, failed

pytestmark = pytest.mark.timeout(10)


def resumed_sim(np: int = 2, **policy) -> Sim:
    sim = Sim(np, **policy)
    sim.job = ElasticJob(
        Policy(np, policy.get("min_np", np), np, checkpointing=True,
               **{k: v for k, v in policy.items() if k not in ("min_np",)}),
        HostManager(Blacklist((10.0, 300.0), random.Random(0))), job_id="t", resumed=True,
    )
    sim.job.start(sim.now)
    return sim


def test_the_first_round_of_a_resumed_job_loads_the_checkpoint() -> None:
    sim = resumed_sim(2)
    replies = sim.start({"a": 2})
    assert all(isinstance(r, Assignment) and r.from_checkpoint and r.needs_sync for r in replies.values())
    assert sim.job.phase is Phase.RUNNING
    assert [f["from_checkpoint"] for k, f in sim.events if k == "round_formed"] == [True]


def test_a_fresh_job_starts_without_a_checkpoint() -> None:
    sim = Sim(2, checkpointing=True)
    replies = sim.start({"a": 2})
    assert not any(r.from_checkpoint for r in replies.values())


def test_a_resumed_job_whose_workers_all_die_before_committing_loads_the_checkpoint_again() -> None:
    sim = resumed_sim(2, min_np=1)
    sim.start({"a": 1, "b": 1})
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    sim.discover({"c": 1})
    assert sim.outcome is None
    replies = sim.join("c[0]")
    assert all(isinstance(r, Assignment) and r.from_checkpoint for r in replies.values())


def test_a_resumed_job_needs_checkpointing() -> None:
    with pytest.raises(ValueError, match="needs checkpointing"):
        ElasticJob(Policy(1, 1, 1), HostManager(Blacklist((1.0, 1.0))), resumed=True)


def test_after_the_first_commit_of_a_resumed_round_a_survivor_keeps_the_state() -> None:
    sim = resumed_sim(2, min_np=1)
    sim.start({"a": 1, "b": 1})
    sim.commit("a[0]", "b[0]", count=3)
    sim.exit("b[0]", KILLED)
    replies = sim.join("a[0]", reason="failure")
    assert isinstance(replies["a[0]"], Assignment) and not replies["a[0]"].from_checkpoint
    assert sim.outcome is None


def test_without_a_checkpoint_dir_losing_every_holder_still_fails() -> None:
    sim = Sim(2, min_np=1)
    sim.start({"a": 1, "b": 1})
    sim.commit("a[0]", "b[0]", count=3)
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    failed(sim, "training state was lost")
