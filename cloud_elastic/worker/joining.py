"""A worker that joins a running job runs no collective before ``hvd.elastic.run``.

The running workers meet a newcomer (an added worker, a replacement, a spare) in the state sync that
``hvd.elastic.run`` starts with; a collective the newcomer's script runs before that (Horovod's
cifar10 example broadcasts ``resume_from_epoch``, ported scripts keep ``broadcast_parameters``) is
matched against the sync's and could only hang until the collective timeout, then fail, again at every
relaunch. So it raises :class:`UnsupportedError` at once, naming the call, and the worker exits; its
peers' sync fails at once on its closed connections and they go on without it.

A broadcast the sync overwrites could have been made a local no-op, but whether a value is part of the
state the sync carries is not known here: one that is not would be silently wrong on the newcomer.

The job is running once any worker has entered ``hvd.elastic.run``: each worker says so once in the
rendezvous store (:func:`mark_entered`), and a worker that joined after the job started reads it when
it joins (:func:`peers_entered`). Workers of the first round, who run the same set-up collectives
together before any enters ``hvd.elastic.run``, are never refused.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from cloud_elastic.worker.unsupported import UnsupportedError
from cloud_elastic.worker.rounds.signed_store import SignedStore

log = logging.getLogger(__name__)

__all__ = ["mark_entered", "peers_entered", "refuse"]

_NAMESPACE = "cloud-elastic/elastic-run/"
_KEY = "entered"


def _signed(ctx: Any) -> SignedStore | None:
    store = getattr(ctx, "_store", None)
    return None if store is None or ctx.standalone else SignedStore(store, _NAMESPACE, ctx.settings.secret)


def mark_entered(ctx: Any) -> None:
    """Tell the job that a worker entered ``hvd.elastic.run`` (once per process; a lost store only loses the
    early refusal: a newcomer's set-up collective then times out as any mismatched collective)."""
    store = _signed(ctx)
    if store is None:
        return
    try:
        store.set(_KEY, b"1")
    except Exception as exc:  # the store is the driver's: it may be restarting
        log.debug("worker %s: could not record entering elastic.run: %s", ctx.worker_id, exc)


def peers_entered(ctx: Any) -> bool:
    """Whether a worker of the job has entered ``hvd.elastic.run`` (a signed mark: a stranger cannot forge it)."""
    store = _signed(ctx)
    if store is None:
        return False
    try:
        return bool(store.check([_KEY])) and store.get(_KEY) == b"1"
    except Exception as exc:
        log.debug("worker %s: could not read whether the job runs elastic.run: %s", ctx.worker_id, exc)
        return False


def refuse(what: str) -> NoReturn:
    """The one-line error of a collective (``what``) a newcomer runs before ``hvd.elastic.run``."""
    raise UnsupportedError(
        f"collective {what!r} called before hvd.elastic.run by a worker that joined a running job; its peers are in "
        "hvd.elastic.run's state sync, which gives a joining worker rank 0's state: move this call into the "
        "function hvd.elastic.run runs, or drop it if the state carries its result (see docs/porting.md)")
