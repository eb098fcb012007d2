"""Rank assignment for a rendezvous round. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["Member", "RankInfo", "assign_ranks"]


@dataclass(frozen=True)
class Member:
    """A worker taking part in a round, in rank order."""

    worker_id: str
    host: str


@dataclass(frozen=True)
class RankInfo:
    """Horovod's topology numbers for one worker in one round."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def assign_ranks(members: Sequence[Member]) -> dict[str, RankInfo]:
    """Give each member its ranks; ``members`` is already in rank order.

    ``local_rank`` counts members on the same host in rank order;
    ``cross_rank`` is the position of the member's host among the hosts that
    have a member with the same ``local_rank`` (hosts ordered by their first
    member's rank), and ``cross_size`` is how many such hosts there are.
    """
    size = len(members)
    host_order: dict[str, int] = {}
    per_host: dict[str, list[str]] = {}
    for m in members:
        host_order.setdefault(m.host, len(host_order))
        per_host.setdefault(m.host, []).append(m.worker_id)
    local_rank = {wid: i for ids in per_host.values() for i, wid in enumerate(ids)}
    hosts_with_local: dict[int, list[str]] = {}
    for host in sorted(per_host, key=host_order.__getitem__):
        for i in range(len(per_host[host])):
            hosts_with_local.setdefault(i, []).append(host)
    result: dict[str, RankInfo] = {}
    for rank, m in enumerate(members):
        lr = local_rank[m.worker_id]
        peers = hosts_with_local[lr]
        result[m.worker_id] = RankInfo(
            rank=rank,
            size=size,
            local_rank=lr,
            local_size=len(per_host[m.host]),
            cross_rank=peers.index(m.host),
            cross_size=len(peers),
        )
    return result
