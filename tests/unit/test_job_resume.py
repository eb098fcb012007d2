"""A restarted driver resumes its job: the first round loads the latest durable checkpoint."""

from __future__ import annotations

import random

import pytest

from cloud_elastic.driver.job.hosts import Blacklist, HostManager
from cloud_elastic.driver.job.elastic_job import Assignment, ElasticJob, Phase, Policy
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


def _heard(sim: Sim, seq: int, *slots: str) -> None:
    """These workers' heartbeats say they hold commit ``seq`` of the job."""
    for slot in slots:
        sim.job.heartbeat(sim.id(slot), sim.now, seq, seq)


def _load(sim: Sim, commit_seq: int | None) -> int | None:
    lost = sim.job.checkpoint_loaded(commit_seq or 7, commit_seq, "/ck/ckpt-x")
    sim._collect()
    return lost


def _of(sim: Sim, kind: str) -> list[dict]:
    return [fields for k, fields in sim.events if k == kind]


def test_a_whole_group_loss_reports_the_committed_steps_after_the_checkpoint_as_lost(caplog) -> None:
    caplog.set_level("WARNING", logger="cloud_elastic")
    sim = Sim(2, checkpointing=True, cooldown=(1000, 1000))
    sim.start({"a": 1, "b": 1})
    _heard(sim, 40, "a[0]", "b[0]")
    sim.exit("a[0]", KILLED)
    sim.exit("b[0]", KILLED)
    sim.discover({"c": 1, "d": 1})
    sim.join("c[0]", "d[0]")
    formed = _of(sim, "round_formed")[-1]
    assert formed["from_checkpoint"] and formed["step"] is None  # known only once rank 0 has loaded
    assert not _of(sim, "rollback")

    assert _load(sim, 33) == 7
    assert _of(sim, "checkpoint_loaded") == [{"step": 33, "path": "/ck/ckpt-x", "steps_lost": 7}]
    [rollback] = _of(sim, "rollback")
    assert (rollback["round"], rollback["commit_step"], rollback["steps_lost"]) == (1, 33, 7)
    assert "resumed from the checkpoint of step 33 (/ck/ckpt-x); 7 committed step(s) after it were lost" \
        in caplog.text

    # The next loss counts from this checkpoint on, not from the first generation's last commit.
    _heard(sim, 38, "c[0]", "d[0]")
    sim.exit("c[0]", KILLED)
    sim.exit("d[0]", KILLED)
    sim.discover({"e": 1, "f": 1})
    sim.join("e[0]", "f[0]")
    assert _load(sim, 35) == 3
    assert [r["steps_lost"] for r in _of(sim, "rollback")] == [7, 3]


def test_a_restarted_driver_does_not_make_up_the_steps_its_predecessors_workers_lost(caplog) -> None:
    caplog.set_level("WARNING", logger="cloud_elastic")
    sim = resumed_sim(2)
    sim.start({"a": 2})
    assert _load(sim, 50) is None
    assert _of(sim, "checkpoint_loaded")[0]["steps_lost"] is None and not _of(sim, "rollback")
    assert "(this driver did not run them: it cannot say how many)" in caplog.text
    # From its own load on, this driver knows: a later whole-group loss is counted.
    _heard(sim, 56, "a[0]", "a[1]")
    sim.exit("a[0]", KILLED)
    sim.exit("a[1]", KILLED)
    sim.discover({"b": 2})
    sim.join("b[0]", "b[1]")
    assert _load(sim, 52) == 4
