"""The planned next round keeps the survivors' ranks (cloud_elastic.driver.job.next_round): a plan is made from
what heartbeats told so far, which lags a worker's commits by up to a heartbeat; rank 0 must not move to a younger
host for that (rank 0 writes the checkpoints and is the state's source)."""

from __future__ import annotations

import pytest

from tests.unit.test_job import started
from tests.unit.test_job_next_round import formed, offer

pytestmark = pytest.mark.timeout(10)


def test_survivors_keep_their_ranks_in_the_plan_while_rank_0_s_heartbeat_has_not_told_its_commit_yet() -> None:
    """Under load rank 1's heartbeat told of its commit and rank 0's not yet (a clean-clone run's planned round
    had them swapped); at the commit that switches rounds both hold the same state."""
    sim = started(2, {"a": 1, "c": 1}, max_np=3, min_np=1, plan_admissions=True)
    sim.commit("c[0]")  # a[0] committed too; its heartbeat saying so is still on its way
    sim.discover({"a": 1, "c": 1, "b": 1})
    sim.join("b[0]")
    assert {s: offer(sim, s).ranks.rank for s in ("a[0]", "c[0]")} == {"a[0]": 0, "c[0]": 1}
    assert sim.reply("b[0]").ranks.rank == 2
    sim.commit("a[0]")
    formed(sim, "a[0]", "c[0]", "b[0]")
    replies = sim.join("a[0]", "c[0]", reason="update")
    assert all(r.planned == 1 for r in replies.values()) and sim.layout() == ["a[0]", "c[0]", "b[0]"]


def test_a_plan_made_before_any_commit_keeps_the_survivors_order_too() -> None:
    """Nobody committed yet (the first round's first steps): the survivors keep their order, the newcomer last."""
    sim = started(2, {"a": 1, "c": 1}, max_np=3, min_np=1, plan_admissions=True)
    sim.discover({"a": 1, "c": 1, "b": 1})
    sim.join("b[0]")
    assert {s: offer(sim, s).ranks.rank for s in ("a[0]", "c[0]")} == {"a[0]": 0, "c[0]": 1}
    assert sim.reply("b[0]").ranks.rank == 2
