"""Rank assignment for one round (cloud_elastic.driver.job.ranks)."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.ranks import Member, RankInfo, assign_ranks

pytestmark = pytest.mark.timeout(10)


def ranks(*slots: str) -> dict[str, RankInfo]:
    """Assign ranks to members named ``host/slot``, given in rank order."""
    return assign_ranks([Member(s, s.split("/")[0], int(s.split("/")[1])) for s in slots])


def test_ranks_follow_the_given_order() -> None:
    result = ranks("b/0", "a/0", "c/0")
    assert [result[s].rank for s in ("b/0", "a/0", "c/0")] == [0, 1, 2]
    assert {info.size for info in result.values()} == {3}


def test_two_hosts_of_two() -> None:
    result = ranks("a/0", "a/1", "b/0", "b/1")
    assert result["a/0"] == RankInfo(rank=0, size=4, local_rank=0, local_size=2, cross_rank=0, cross_size=2)
    assert result["a/1"] == RankInfo(rank=1, size=4, local_rank=1, local_size=2, cross_rank=0, cross_size=2)
    assert result["b/0"] == RankInfo(rank=2, size=4, local_rank=0, local_size=2, cross_rank=1, cross_size=2)
    assert result["b/1"] == RankInfo(rank=3, size=4, local_rank=1, local_size=2, cross_rank=1, cross_size=2)


def test_uneven_hosts_count_cross_ranks_per_local_rank() -> None:
    result = ranks("a/0", "a/1", "a/2", "b/0", "c/0", "c/1")
    local = {s: (i.local_rank, i.local_size) for s, i in result.items()}
    assert local == {"a/0": (0, 3), "a/1": (1, 3), "a/2": (2, 3), "b/0": (0, 1), "c/0": (0, 2), "c/1": (1, 2)}
    cross = {s: (i.cross_rank, i.cross_size) for s, i in result.items()}
    assert cross == {"a/0": (0, 3), "b/0": (1, 3), "c/0": (2, 3), "a/1": (0, 2), "c/1": (1, 2), "a/2": (0, 1)}


def test_local_rank_is_the_slot_whatever_the_rank_order() -> None:
    # After failures, survivors of one host need not be contiguous in rank order,
    # nor in slot order: each keeps the GPU of its slot.
    result = ranks("b/1", "a/0", "b/0")
    assert [result[s].rank for s in ("b/1", "a/0", "b/0")] == [0, 1, 2]
    assert (result["b/1"].local_rank, result["b/0"].local_rank, result["a/0"].local_rank) == (1, 0, 0)
    assert (result["b/1"].cross_rank, result["b/1"].cross_size) == (0, 1)
    assert (result["b/0"].cross_rank, result["a/0"].cross_rank, result["a/0"].cross_size) == (0, 1, 2)


def test_a_gap_left_by_a_lost_slot_keeps_the_others_on_their_gpus() -> None:
    # Host a had slots 0..3; slot 0's worker died. The others keep 1, 2, 3, and
    # local_size still bounds them, so local_rank % local_size is the GPU too.
    before = ranks("a/0", "a/1", "a/2", "a/3")
    after = ranks("a/1", "a/2", "a/3")
    assert [after[f"a/{i}"].local_rank for i in (1, 2, 3)] == [before[f"a/{i}"].local_rank for i in (1, 2, 3)]
    assert {i.local_size for i in after.values()} == {4}
    # The replacement takes the free slot, after the survivors in rank order.
    rejoined = ranks("a/1", "a/2", "a/3", "a/0")
    assert (rejoined["a/0"].rank, rejoined["a/0"].local_rank) == (3, 0)
    assert all(0 <= i.local_rank < i.local_size for i in rejoined.values())


def test_two_workers_on_one_slot_are_refused() -> None:
    with pytest.raises(ValueError, match="slot 1 of host a"):
        assign_ranks([Member("x", "a", 1), Member("y", "a", 1)])


def test_no_members_no_ranks() -> None:
    assert assign_ranks([]) == {}
