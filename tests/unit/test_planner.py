"""Rank assignment for one round (cloud_elastic.driver.planner)."""

from __future__ import annotations

import pytest

from cloud_elastic.driver.planner import Member, RankInfo, assign_ranks

pytestmark = pytest.mark.timeout(10)


def ranks(*slots: str) -> dict[str, RankInfo]:
    """Assign ranks to members named ``host/n``, given in rank order."""
    return assign_ranks([Member(s, s.split("/")[0]) for s in slots])


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


def test_interleaved_survivor_order_is_kept_and_hosts_ordered_by_first_rank() -> None:
    # After failures, survivors of one host need not be contiguous in rank order.
    result = ranks("b/1", "a/0", "b/0")
    assert [result[s].rank for s in ("b/1", "a/0", "b/0")] == [0, 1, 2]
    assert (result["b/1"].local_rank, result["b/0"].local_rank, result["a/0"].local_rank) == (0, 1, 0)
    assert (result["b/1"].cross_rank, result["a/0"].cross_rank) == (0, 1)
    assert (result["b/0"].cross_rank, result["b/0"].cross_size) == (0, 1)


def test_no_members_no_ranks() -> None:
    assert assign_ranks([]) == {}
