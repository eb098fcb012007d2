"""What a state sync must know first: rank 0's commit, and which workers need it.

A sync gives every worker rank 0's newest commit. A worker that already holds
that very commit (every old member after a graceful membership change, every
survivor after a failure they all rolled back from alike) keeps its own values
and sends a part of them (``comm.heal``); only the others receive. So before
anything moves, each worker must learn rank 0's ``commit_seq`` and the set of
receivers, and a newcomer what rank 0's loop showed of its commit window
(``ledger.CommitWindow``).

It costs one gather at most and no collective of its own after it: :func:`begin`
(``elastic.run``, before ``state.sync()``) gathers every worker's live commit
sequence, whether it holds that commit and a key of its host to rank 0, which works out the facts
(:func:`receivers`); they then ride, as :func:`carried`, in the first broadcast
the sync makes anyway (``ObjectState``'s and ``TorchState``'s, of their small
parts), and every worker takes them there (:func:`learn`). A ``State`` whose own
``sync()`` carries nothing gets them in a broadcast of their own afterwards
(:func:`ensure_known`), before the synced state is held as the new commit.

The first sync of a round needs no gather: every member said the same at rendezvous, and the driver tells rank 0
in its assignment (``protocol.Assignment.facts``, ``ledger.told_facts``; rank 0 puts its own row as it is now, a
checkpoint it loaded since included). What a member said there is stale if its commit changed between its rendezvous
and the sync: a commit in a reset callback (a save, the survivors' alone: the newcomers run none, so what was told
stays, or they would gather alone) makes it a receiver of rank 0's commit, which is safe. A member counted a holder
that no longer holds rank 0's commit would keep its own state instead: it checks when it learns the facts, and fails
the sync (a new round) if it does not hold it.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Sequence

import torch

from cloud_elastic.worker.comm import collectives
from cloud_elastic.worker.comm.statecodec import Parts, StateSyncError
from cloud_elastic.worker.exceptions import CollectiveError

__all__ = ["begin", "receivers", "carried", "learn", "share", "ensure_known", "end", "NAME"]

#: The name of the gather (and of the facts' own broadcast, when no sync carries them).
NAME = "commit sequence"


def receivers(rows: Sequence[tuple[int, bool]]) -> list[int]:
    """The ranks that need rank 0's commit, from every rank's (live ``commit_seq``, ``holds_commit``).

    A worker needs it unless it holds that very commit; commit 0, the initial
    state, may differ on every worker, so it is always given. A rank 0 that does
    not hold its commit exactly (the driver never makes one rank 0) gives it to all.
    """
    root_seq, root_holds = rows[0][0], rows[0][1]
    return [rank for rank, (seq, holds) in enumerate(rows)
            if rank != 0 and (seq != root_seq or not holds or seq == 0 or not root_holds)]


def begin(ctx: Any) -> None:
    """Gather the facts to rank 0 (every worker of the round calls it, before ``state.sync()``)."""
    ledger = ctx.ledger
    ledger.sync_begun, ledger.sync_known, ledger.sync_pending = True, False, None
    told, ledger.told_facts = ledger.told_facts, None  # the round's first sync only: on every member alike
    mine = [ledger.live_commit_seq, int(ledger.holds_commit), zlib.crc32(str(getattr(ctx, "hostname", "")).encode())]
    if ctx.standalone or ctx.info is None:
        ledger.sync_hosts = [mine[2]]
        learn(ledger, _facts(ledger, [(mine[0], bool(mine[1]))]))
        return
    if told is not None:  # told at rendezvous (rank 0's rows, by rank), so no gather
        ledger.sync_hosts = None
        if ctx.info.rank == 0:
            rows = [(mine[0], mine[1], told[0][2]), *told[1:]]
            ledger.sync_hosts = [host for _, _, host in rows]
            ledger.sync_pending = _facts(ledger, [(seq, bool(holds)) for seq, holds, _ in rows])
        return
    rows = collectives.gather_rows(torch.tensor(mine, dtype=torch.int64), NAME)
    ledger.sync_hosts = None if rows is None else [int(host) for _, _, host in rows.tolist()]
    if rows is not None:
        ledger.sync_pending = _facts(ledger, [(int(seq), bool(holds)) for seq, holds, _ in rows.tolist()])


def _facts(ledger: Any, rows: list[tuple[int, bool]]) -> dict[str, Any]:
    window = ledger.window  # rank 0's
    return {"root_seq": rows[0][0], "has_collectives": bool(window.has_collectives), "confirmed": bool(window.confirmed),
            "receivers": receivers(rows), "fresh": [rank for rank, (seq, _) in enumerate(rows) if rank and seq == 0]}


def carried(ctx: Any) -> tuple[bool, dict[str, Any] | None]:
    """Whether the sync's first broadcast must carry the facts (the same on every worker), and what rank 0
    puts there (None on the others)."""
    ledger = ctx.ledger
    if not ledger.sync_begun:
        begin(ctx)  # a sync() called outside elastic.run: on every worker alike
    return not ledger.sync_known, ledger.sync_pending


def learn(ledger: Any, facts: dict[str, Any] | None, size: int | None = None, rank: int = 0) -> None:
    """Take rank 0's facts (received by ``rank`` in a broadcast from a round of ``size`` workers, or worked out here).
    CollectiveError (the sync fails, and a new round forms) if they keep this worker's own state, which is not rank
    0's commit: what it told at rendezvous was stale (see the module docstring)."""
    if ledger.sync_known:
        return
    if not isinstance(facts, dict):
        raise StateSyncError(f"{NAME}: rank 0 sent no facts of its commit")
    try:
        has_collectives, confirmed = bool(facts["has_collectives"]), bool(facts["confirmed"])
        root_seq, ranks = int(facts["root_seq"]), [int(rank) for rank in facts["receivers"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise StateSyncError(f"{NAME}: rank 0's facts of its commit are malformed ({exc!r}): corrupt or forged") from exc
    # Peer traffic: the receivers are other ranks of this round, each once (a heal plans by them).
    if size is not None and (len(set(ranks)) != len(ranks) or not all(0 < rank < size for rank in ranks)):
        raise StateSyncError(f"{NAME}: rank 0 names {len(ranks)} receiver(s) {str(ranks)[:80]}, not distinct ranks "
                             f"of 1 to {size - 1}: corrupt or forged")
    if rank and rank not in ranks and (ledger.live_commit_seq != root_seq or not ledger.holds_commit):
        raise CollectiveError(f"{NAME}: rank 0 counts this worker (rank {rank}) a holder of its commit {root_seq}, but "
                              f"it holds commit {ledger.live_commit_seq}{'' if ledger.holds_commit else ' inexactly'}: "
                              "a stale account; the round starts over")
    ledger.window.learn(has_collectives, confirmed=confirmed)
    ledger.sync_root_seq = root_seq
    ledger.sync_receivers = ranks
    ledger.sync_known = True


def share(ctx: Any, parts: Callable[[dict[str, Any] | None], dict[str, Any]], name: str) -> dict[str, Any]:
    """A sync's first broadcast: rank 0's ``parts(facts)`` (its facts, None once known), with the facts when
    this sync has not told them yet, to every worker, who learns them; outside a round or alone in it, the parts
    as they are."""
    carry, facts = carried(ctx)
    small = Parts({NAME: facts, **parts(facts if carry else None)}) if ctx.info is None or ctx.info.rank == 0 else None
    if ctx.info is not None and ctx.info.size > 1:  # alone, nobody to send to: nothing to encode either
        small = collectives.broadcast_state(small, 0, name)
    if carry:
        learn(ctx.ledger, small.get(NAME) if isinstance(small, dict) else None, None if ctx.info is None else ctx.info.size,
              0 if ctx.info is None else ctx.info.rank)
    return small


def ensure_known(ctx: Any) -> None:
    """After ``state.sync()``: the facts in a broadcast of their own if the sync carried none."""
    ledger = ctx.ledger
    if ledger.sync_begun and not ledger.sync_known:
        learn(ledger, collectives.broadcast_state(ledger.sync_pending, 0, NAME), ctx.info.size, ctx.info.rank)


def end(ledger: Any) -> None:
    """The sync is over: its facts are no longer pending (the next sync gathers its own)."""
    ledger.sync_begun = ledger.sync_known = False
    ledger.sync_pending = None
