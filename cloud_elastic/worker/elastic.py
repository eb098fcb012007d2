"""``elastic.run``: the loop that keeps a training function going across membership changes.

::

    sync state from rank 0
    loop:
        call the training function
          returned                 -> tell the driver, return its result
          CollectiveError          -> restore the last commit   (a peer failed)
          HostsUpdatedInterrupt    -> keep the state just committed (graceful change)
        rendezvous into the next round (or leave, if the driver says so)
        sync state from rank 0 if the driver says this round needs it
        reset callbacks

Whether to sync is decided by the driver for the whole round, so old and new
workers can never disagree about it (Horovod #3494).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, TypeVar

from cloud_elastic.worker.context import init
from cloud_elastic.worker.exceptions import CollectiveError, HostsUpdatedInterrupt, WorkerRemoved
from cloud_elastic.worker.state import State

__all__ = ["run"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def run(func: F) -> F:
    """Decorate ``func(state, *args, **kwargs)`` so it survives membership changes."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return _run(func, state, *args, **kwargs)
        except WorkerRemoved as exc:
            init().leave()
            print(f"cloud-elastic: leaving the job: {exc}", file=sys.stderr, flush=True)
            sys.exit(0)

    return wrapper  # type: ignore[return-value]


def _run(func: Callable[..., Any], state: State, *args: Any, **kwargs: Any) -> Any:
    ctx = init()
    sync = True
    while True:
        if sync:
            try:
                state.sync()
            except CollectiveError as exc:
                log.warning("state sync failed (%s); rejoining", exc)
                state.restore()
                _rejoin(ctx, "failure", state)
                continue
        try:
            result = func(state, *args, **kwargs)
        except CollectiveError as exc:
            log.warning("collective failed (%s); rolling back to the last commit", exc)
            state.restore()
            ctx.note_rollback()
            sync = _rejoin(ctx, "failure", state)
            continue
        except HostsUpdatedInterrupt:
            sync = _rejoin(ctx, "update", state)
            continue
        ctx.report_completed()
        return result


def _rejoin(ctx: Any, reason: str, state: State) -> bool:
    """Rendezvous until a round forms; return whether that round needs a state sync."""
    while True:
        try:
            info = ctx.rendezvous(reason)
        except CollectiveError as exc:
            log.warning("could not join the next round (%s); retrying", exc)
            reason = "failure"
            continue
        state.on_reset()
        return info.needs_sync
