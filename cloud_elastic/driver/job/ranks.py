"""Rank assignment for a rendezvous round. Pure functions.

The topology numbers are defined in :mod:`cloud_elastic.protocol` (where
:class:`RankInfo` lives, as both sides use it): ``local_rank`` is the
worker's slot index on its host, fixed for the worker's life, so a GPU
never changes hands between rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from cloud_elastic.protocol import RankInfo
from cloud_elastic.protocol_reports import MAX_TOLD_FACTS

__all__ = ["Member", "RankInfo", "assign_ranks", "tells_facts", "facts_rows"]


@dataclass(frozen=True)
class Member:
    """A worker taking part in a round, in rank order, with the slot it holds on its host."""

    worker_id: str
    host: str
    slot: int


def assign_ranks(members: Sequence[Member]) -> dict[str, RankInfo]:
    """Give each member its ranks; ``members`` is already in rank order.

    ``local_rank`` is the member's slot index; ``local_size`` is one more than
    the highest slot in use on the host in this round; ``cross_rank`` is the
    position of the member's host among the hosts that have a member with the
    same ``local_rank`` (hosts ordered by their first member's rank), and
    ``cross_size`` is how many such hosts there are.

    Raises ValueError when two members claim the same slot of a host: the
    driver launches one worker per slot, so that would be a bug there, and
    two workers sharing a GPU must not start.
    """
    host_order: dict[str, int] = {}
    slots: dict[str, set[int]] = {}
    for m in members:
        if m.slot < 0:
            raise ValueError(f"worker {m.worker_id}: negative slot {m.slot}")
        taken = slots.setdefault(m.host, set())
        if m.slot in taken:
            raise ValueError(f"two workers of this round hold slot {m.slot} of host {m.host}")
        taken.add(m.slot)
        host_order.setdefault(m.host, len(host_order))
    hosts_with_local: dict[int, list[str]] = {}
    for host in sorted(slots, key=host_order.__getitem__):
        for slot in slots[host]:
            hosts_with_local.setdefault(slot, []).append(host)
    result: dict[str, RankInfo] = {}
    for rank, m in enumerate(members):
        peers = hosts_with_local[m.slot]
        result[m.worker_id] = RankInfo(
            rank=rank,
            size=len(members),
            local_rank=m.slot,
            local_size=max(slots[m.host]) + 1,
            cross_rank=peers.index(m.host),
            cross_size=len(peers),
        )
    return result


def tells_facts(members: Sequence[Any]) -> bool:
    """Whether a round of these workers (``WorkerRecord``) is told its first sync's facts at rendezvous
    (``protocol.Assignment.facts``): every member reads them there, and the round is at most
    ``MAX_TOLD_FACTS`` strong (a bigger one gathers them on its own)."""
    return 0 < len(members) <= MAX_TOLD_FACTS and all(w.takes_facts for w in members)


def facts_rows(members: Sequence[Any]) -> tuple[tuple[int, int, int], ...]:
    """Rank 0's facts of the round of ``members`` (``WorkerRecord``, in rank order): each one's commit and whether it
    holds it, as it said at this rendezvous (``sync_row``), and an index of its host (the same for a host's workers)."""
    hosts: dict[str, int] = {}
    return tuple((*w.sync_row, hosts.setdefault(w.slot.host, len(hosts))) for w in members)
