"""A worker that joins a running job runs no collective before ``hvd.elastic.run``.

The running workers meet a newcomer (an added worker, a replacement, a spare) in the state sync that
``hvd.elastic.run`` starts with; a collective the newcomer's script runs before that (Horovod's
cifar10 example broadcasts ``resume_from_epoch``, ported scripts keep ``broadcast_parameters``) is
matched against the sync's and could only hang until the collective timeout, then fail, again at every
relaunch. So it raises :class:`UnsupportedError` at once, naming the call, and the worker exits; its
peers' sync fails at once on its closed connections and they go on without it.

A broadcast the sync overwrites could have been made a local no-op, but whether a value is part of the
state the sync carries is not known here: one that is not would be silently wrong on the newcomer.

What decides is the round the newcomer joins, not the job's past: a worker inside ``hvd.elastic.run``
marks a round (:func:`mark_round`) before it forms that round's group, at rendezvous or in the
background for a planned round, and the newcomer reads its round's mark once its own group has formed
(:func:`peers_in_round`); the group cannot form before every member started forming it, so a mark that
exists is never missed. A mark is a key of its round's own namespace in the rendezvous store, signed: a stranger
can neither forge it nor, by flooding the store, evict it, and the driver deletes it with the round's other keys
(``StoreServer.forget``), so marks do not pile up over a job's rounds. Hence:

* workers of the first round, who run the same set-up collectives together, are never refused;
* when every worker was lost, the fresh workers of the round that resumes (from the checkpoint, or from
  initial weights when nothing was committed) are not refused: no member of their round is inside
  ``hvd.elastic.run``, whatever the dead workers wrote for their own rounds (a mark names the round and
  the plan it formed from: a dropped plan's round number is reused by the round formed instead);
* a round that loads a checkpoint but keeps a survivor inside ``hvd.elastic.run`` does refuse: that
  survivor goes straight to the load and the sync, which a set-up collective would stall;
* workers adopted by a restarted driver mark the rounds they form with it in its new store, as any other.

A running member that formed a planned round's group while still in its own set-up (the plan came before
it entered ``hvd.elastic.run``) leaves no mark: that newcomer's set-up collective then waits for the
collective timeout as any mismatched collective.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, NoReturn

import torch.distributed as dist

from cloud_elastic.worker.unsupported import UnsupportedError
from cloud_elastic.worker.rounds.signed_store import SignedStore, round_namespace

log = logging.getLogger(__name__)

__all__ = ["mark_round", "peers_in_round", "refuse"]

#: After the round's namespace: the marks are keys of the round itself. Naming one proves the connection to the
#: driver's store (``driver/net/store_server.py:round_keys``), so a stranger's flood cannot evict it (the store gives
#: what unproven connections write a quarter of its bound, oldest out first), and the driver's ``forget`` of the
#: round deletes it with the round's other keys.
_SUFFIX = "-elastic-run"


def _key(plan: int) -> str:
    # The plan too: a plan the driver dropped gave its round number to the round formed instead (the recovery
    # after every worker was lost, say), whose fresh members must not read the dead members' mark.
    return f"plan-{plan}"


def _signed(ctx: Any, round_: int, store: Any = None) -> SignedStore | None:
    store = getattr(ctx, "_store", None) if store is None else store
    if store is None or ctx.standalone:
        return None
    secret = ctx.settings.secret
    return SignedStore(store, round_namespace(secret, ctx.job_id, round_) + _SUFFIX, secret)


def mark_round(ctx: Any, round_: int, plan: int = 0, *, own_client: bool = False) -> None:
    """Tell round ``round_``'s newcomers (of plan ``plan``, 0: a round formed at rendezvous) that this worker, inside ``hvd.elastic.run``, will sync its state to
    them; call before forming the round's group. ``own_client``: on a store client of its own (a thread other
    than the training thread's, whose client must stay free). A store that cannot be reached only loses the
    early refusal: a newcomer's set-up collective then times out as any mismatched collective."""
    try:
        client = None
        if own_client and not ctx.standalone:
            host, _, port = ctx.settings.store_address.rpartition(":")
            client = dist.TCPStore(host, int(port), None, False, timeout=timedelta(seconds=ctx.collective_timeout_s))
        store = _signed(ctx, round_, client)
        if store is not None:
            store.set(_key(plan), b"1")
    except Exception as exc:  # the store is the driver's: it may be restarting
        log.debug("worker %s: could not mark round %d as inside elastic.run: %s", ctx.worker_id, round_, exc)


def peers_in_round(ctx: Any, round_: int, plan: int = 0) -> bool:
    """Whether a member of round ``round_`` (formed from plan ``plan``, 0: at rendezvous) marked it from inside ``hvd.elastic.run`` (a signed mark: a
    stranger cannot forge it)."""
    store = _signed(ctx, round_)
    if store is None:
        return False
    try:
        key = _key(plan)
        return bool(store.check([key])) and store.get(key) == b"1"
    except Exception as exc:
        log.debug("worker %s: could not read round %d's elastic.run mark: %s", ctx.worker_id, round_, exc)
        return False


def refuse(what: str) -> NoReturn:
    """The one-line error of a collective (``what``) a newcomer runs before ``hvd.elastic.run``."""
    raise UnsupportedError(
        f"collective {what!r} called before hvd.elastic.run by a worker that joined a running job; its peers are in "
        "hvd.elastic.run's state sync, which gives a joining worker rank 0's state: move this call into the "
        "function hvd.elastic.run runs, or drop it if the state carries its result (see docs/porting.md)")
