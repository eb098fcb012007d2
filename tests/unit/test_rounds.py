"""Round formation rules (cloud_elastic.driver.job.plan), each alone."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.plan import Candidate, RoundPlan, StateLost, plan_round


def c(wid: str, prev: int | None = None, holds: bool = False, key: tuple = (), seq: int = 0) -> Candidate:
    return Candidate(wid, host=wid[0], slot=0, prev_rank=prev, holds_state=holds, newcomer_key=key or (wid,),
                     commit_seq=seq)


def order(plan: RoundPlan | StateLost) -> list[str]:
    assert isinstance(plan, RoundPlan), plan
    return [m.worker_id for m in plan.members]


def plan(waiting, *, max_np=8, committed=True, failure=False, checkpointing=False):
    return plan_round(waiting, max_np=max_np, state_committed=committed,
                      failure_since_last_round=failure, checkpointing=checkpointing)


def test_survivors_keep_their_order_and_newcomers_follow_by_host_age() -> None:
    p = plan([c("n2", key=(1,)), c("s1", 1, True), c("n1", key=(0,)), c("s0", 0, True)])
    assert order(p) == ["s0", "s1", "n1", "n2"]
    assert p.needs_sync


def test_a_survivor_that_never_committed_yields_rank_0_to_a_holder() -> None:
    assert order(plan([c("x", 0, False), c("y", 1, True)])) == ["y", "x"]


def test_the_holder_of_the_newest_commit_is_rank_0_and_the_others_keep_their_order() -> None:
    # A gradient allreduce completed on s2 and failed on s0 and s1: s2 committed one more step.
    p = plan([c("s0", 0, True, seq=73), c("s1", 1, True, seq=73), c("s2", 2, True, seq=74)], failure=True)
    assert order(p) == ["s2", "s0", "s1"] and p.needs_sync


def test_equal_commits_keep_the_oldest_worker_rank_0() -> None:
    assert order(plan([c("s1", 1, True, seq=9), c("s0", 0, True, seq=9), c("n")])) == ["s0", "s1", "n"]


def test_members_holding_different_commits_always_sync() -> None:
    assert plan([c("s0", 0, True, seq=5), c("s1", 1, True, seq=4)], failure=False).needs_sync


def test_no_holder_and_no_checkpoint_is_state_lost() -> None:
    lost = plan([c("x", 0, False), c("n")])
    assert isinstance(lost, StateLost) and "--checkpoint-dir" in lost.reason


def test_no_holder_with_checkpoints_loads_the_checkpoint() -> None:
    p = plan([c("n1", key=(0,)), c("n2", key=(1,))], checkpointing=True)
    assert isinstance(p, RoundPlan) and p.from_checkpoint and p.needs_sync


def test_before_any_commit_anyone_may_be_rank_0() -> None:
    p = plan([c("n1", key=(0,))], committed=False)
    assert order(p) == ["n1"] and not p.from_checkpoint


@pytest.mark.parametrize(
    ("waiting", "failure", "sync"),
    [
        ([c("s0", 0, True), c("s1", 1, True)], False, False),  # graceful shrink: no sync
        ([c("s0", 0, True), c("s1", 1, True)], True, True),  # after a failure: sync
        ([c("s0", 0, True), c("n")], False, True),  # newcomer: sync
        ([c("s0", 0, True), c("s1", 1, False)], False, True),  # a member without the state: sync
    ],
)
def test_needs_sync(waiting, failure: bool, sync: bool) -> None:
    assert plan(waiting, failure=failure).needs_sync is sync


def test_at_most_max_np_members_and_the_holders_are_kept() -> None:
    assert order(plan([c("n", key=(0,)), c("s1", 1, True), c("s0", 0, True)], max_np=2)) == ["s0", "s1"]


def test_an_empty_round_is_a_bug() -> None:
    with pytest.raises(ValueError):
        plan([])
