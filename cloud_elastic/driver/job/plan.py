"""Round formation as a pure function of the workers waiting at rendezvous.

Rules (each tested alone in ``tests/unit/test_rounds.py``):

* Survivors of earlier rounds keep their relative order and newcomers follow,
  older hosts first, so the oldest worker is rank 0 and its state is the one
  broadcast.
* Rank 0 must hold the job's committed training state once there is any: a
  worker that has never committed (a newcomer, or one whose only sync was cut
  short) never broadcasts its initial weights over trained state. Holders
  therefore go first, in their usual order, except that the holder of the
  newest commit (highest ``commit_seq``) is rank 0: a collective can complete on some
  ranks and fail on others, so after a failure one survivor may have committed
  a step the others roll back from; its state is the one broadcast, as torchft
  recovers from its most advanced peer.
* With no holder left the round can only start from a durable checkpoint; with
  no checkpoint, the plan is :class:`StateLost` and the job must fail rather
  than silently train from initial weights.
* With whole hosts (``--whole-hosts``, ``host_slots`` > 0) a round holds only
  hosts whose ``host_slots`` workers all wait (a host with one still on its
  way waits for the next round), each host's workers side by side in slot
  order; hosts are ordered by the rules above applied to their workers (the
  host of the newest commit first, its holder rank 0 even when it is not the
  host's slot 0), and ``max_np`` is cut at a host's end.
  No complete host: :func:`plan_round` returns None (not yet). Tested in
  ``tests/unit/test_job_whole_hosts.py``.
* ``needs_sync`` is decided here once for the whole round (Horovod #3494
  deadlocked when old and new workers decided it locally and disagreed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Sequence, TypeVar, Union

__all__ = ["Candidate", "RoundPlan", "StateLost", "plan_round", "whole_host_groups"]

T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    """A worker waiting at rendezvous. ``prev_rank`` is None for a newcomer."""

    worker_id: str
    host: str
    slot: int
    prev_rank: int | None
    holds_state: bool
    #: Order among newcomers: (host first seen, slot index, launch sequence).
    newcomer_key: tuple[Hashable, ...] = ()
    #: Position in the job's history of the commit it holds (0: none known).
    commit_seq: int = 0


@dataclass(frozen=True)
class RoundPlan:
    """Who is in the next round, in rank order, and how it gets its state."""

    members: tuple[Candidate, ...]
    needs_sync: bool
    from_checkpoint: bool = False


@dataclass(frozen=True)
class StateLost:
    """No candidate holds the committed state and there is no checkpoint to load."""

    reason: str


def plan_round(
    waiting: Sequence[Candidate],
    *,
    max_np: int,
    state_committed: bool,
    failure_since_last_round: bool,
    checkpointing: bool,
    host_slots: int = 0,
) -> Union[RoundPlan, StateLost, None]:
    """The next round made of ``waiting`` (at most ``max_np`` of them); see the module rules."""
    if not waiting:
        raise ValueError("a round needs at least one worker")
    survivors = sorted((c for c in waiting if c.prev_rank is not None), key=lambda c: (not c.holds_state, c.prev_rank))
    newcomers = sorted((c for c in waiting if c.prev_rank is None), key=lambda c: (not c.holds_state, c.newcomer_key))
    queue = survivors + newcomers
    # The newest commit a worker can give: one that cannot (a sharded host's shards at two commits, see
    # worker/sharded.py) may report a newer one, which must not keep the newest holder from rank 0.
    newest = max((c for c in queue if c.holds_state), key=lambda c: c.commit_seq, default=None)  # first of equals
    if newest is not None:
        queue.remove(newest)
        queue.insert(0, newest)
    if host_slots:
        queue = _whole_hosts(queue, host_slots, max_np)
        if not queue:
            return None
    ordered = tuple(queue[:max_np])
    if state_committed and not ordered[0].holds_state:
        if checkpointing:
            return RoundPlan(ordered, needs_sync=True, from_checkpoint=True)
        return StateLost(
            "the training state was lost with the last worker that held it, and without --checkpoint-dir "
            "nothing can bring it back (refusing to start over from initial weights)"
        )
    has_newcomer = any(c.prev_rank is None for c in ordered)
    unsynced = state_committed and any(not c.holds_state for c in ordered)
    diverged = len({c.commit_seq for c in ordered}) > 1
    return RoundPlan(ordered, needs_sync=has_newcomer or failure_since_last_round or unsynced or diverged)


def whole_host_groups(items: Iterable[T], slots: int, where: Callable[[T], tuple[str, int]]) -> list[list[T]]:
    """``items`` (each on ``where(item) == (host, slot)``) by host, for the hosts that have one in every slot
    ``0..slots-1``: hosts in the order of their first item, each host's items in slot order; items on a slot
    at or past ``slots`` are left out. The one rule of ``--whole-hosts`` for launches, newcomers and rounds."""
    hosts: dict[str, list[T]] = {}
    for item in items:
        host, slot = where(item)
        if slot < slots:
            hosts.setdefault(host, []).append(item)
    whole = []
    for members in hosts.values():
        members.sort(key=lambda item: where(item)[1])
        if [where(item)[1] for item in members] == list(range(slots)):
            whole.append(members)
    return whole


def _whole_hosts(queue: list[Candidate], host_slots: int, max_np: int) -> list[Candidate]:
    """``queue`` regrouped by whole host (:func:`whole_host_groups`), as many whole hosts as ``max_np`` allows."""
    regrouped: list[Candidate] = []
    for ordered in whole_host_groups(queue, host_slots, lambda c: (c.host, c.slot)):
        if len(regrouped) + host_slots > max_np:
            break
        head = queue[0]
        mates_newest = max((c.commit_seq for c in ordered if c is not head), default=-1)
        if not regrouped and head in ordered and head.commit_seq > mates_newest:
            # Only the head of the queue holds the newest commit (a collective completed on it alone): it stays
            # rank 0, whose state the round syncs from. Host-mates with equal commits keep slot order.
            ordered.remove(head)
            ordered.insert(0, head)
        regrouped += ordered
    return regrouped
