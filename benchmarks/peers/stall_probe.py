"""Timestamps of a cloud-elastic worker's way through a membership change, for the host-added and kill benchmarks.

``install()`` wraps, from the outside and without changing ``cloud_elastic``, the
calls a worker makes between a pending update and its first step in the new
group, and prints one ``PROBE {json}`` line per event (wall time ``t``, ``pid``,
``event``, and the call's duration ``dt`` where it has one):

* ``update_seen``: the heartbeat thread learned of a pending update (the
  driver raised ``update_gen``: a newcomer is waiting at rendezvous);
* ``interrupt``: ``commit()`` raised ``HostsUpdatedInterrupt`` (all workers
  agreed, on the gradient allreduce's flag, to stop at this commit);
* ``register``, ``rendezvous``: the control-plane calls, ``dt`` = time waiting
  for the driver (for ``rendezvous``: until the round formed);
* ``preload``: the newcomer's import of ``torch._dynamo`` before it joins;
* ``form_group`` (the Gloo group of the new round, ``dt``; ``new_group``, the
  Gloo constructor within it, which waits for every member), ``sync``
  (broadcast of rank 0's state; with ``broadcasts``, the number of
  ``broadcast_`` calls it made, ``bcast_s``, their time, and ``codec_s``, the
  time spent encoding and decoding non-tensor state), its parts
  ``sync:_ModelHandler``, ``sync:_OptimizerHandler`` and ``sync:objects``
  (the plain attributes), ``hold_synced`` (the commit-sequence broadcast and
  the save after it), ``reset`` (the state's reset callbacks);
* ``main``: the workload's ``main`` started (torch imported).

After a peer failure (``kill_profile.py``) also:

* ``collective_error``: a collective (``WorkerContext.wait`` or ``group``)
  raised ``CollectiveError``; ``t`` is the raise, ``waited`` the time the call
  had waited, ``why`` the start of the message (a Gloo error, or the driver's
  abort of the round);
* ``abort_seen``: the heartbeat thread learned that the driver aborted a
  round (``round``);
* ``restore`` (``TorchState.restore``, the rollback to the last commit) and
  ``root_seq`` (the broadcast of rank 0's commit sequence that opens a sync,
  the new group's first collective).

And for the heartbeat (``false_alarms.py``): ``poll_gap``, when the heartbeat
thread's next poll of the driver goes out more than 0.6 s after its previous
one (``gap``: a bound on the silence the driver saw) or more than 0.1 s after
the previous reply came back (``idle``: the thread waited for the CPU or the
GIL). A few per second at most, never one per step.

Only events, never one per step, so the probe adds nothing to a step.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Callable


def emit(event: str, t: float, **fields: Any) -> None:
    print("PROBE " + json.dumps({"event": event, "t": t, "pid": os.getpid(), **fields}), flush=True)


#: Calls and seconds of the collectives and the codec since the last ``sync`` event.
_COUNTS = {"broadcasts": 0, "bcast_s": 0.0, "codec_s": 0.0}


def _counted(key: str, fn: Callable[..., Any], calls: str | None = None) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _COUNTS[key] += time.perf_counter() - t0
            if calls:
                _COUNTS[calls] += 1

    return wrapper


def _timed(event: str, fn: Callable[..., Any], counts: bool = False) -> Callable[..., Any]:
    """``fn`` that emits ``event`` with its start and duration (also when it raises)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        if counts:
            _COUNTS.update(broadcasts=0, bcast_s=0.0, codec_s=0.0)
        ok = False
        try:
            out = fn(*args, **kwargs)
            ok = True
            return out
        finally:
            extra = {k: round(v, 6) for k, v in _COUNTS.items()} if counts else {}
            emit(event, t0, dt=round(time.time() - t0, 6), ok=ok, **extra)

    return wrapper


class _Growing:
    """A data descriptor over a counter of ``WorkerContext``: emits ``event`` the moment it grows.

    The heartbeat thread assigns ``_seen_update`` and ``_seen_abort`` when a poll
    reply carries a newer update generation or aborted round; a class-level data
    descriptor takes precedence over the instance's dict, so the assignment comes
    through here.
    """

    def __init__(self, event: str, field: str) -> None:
        self.event, self.field = event, field

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_probe" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj.__dict__.get(self.key, 0)

    def __set__(self, obj: Any, value: int) -> None:
        if value > obj.__dict__.get(self.key, 0):
            emit(self.event, time.time(), **{self.field: value})
        obj.__dict__[self.key] = value


def _raising(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that emits ``collective_error`` when it raises ``CollectiveError``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            if type(exc).__name__ == "CollectiveError":
                now = time.time()
                emit("collective_error", now, waited=round(now - t0, 6), why=str(exc)[:120])
            raise

    return wrapper


#: Wall times of this process's last poll sent and its reply back (one heartbeat thread per worker).
_POLL: dict[str, float] = {}


def _poll_gaps(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``DriverClient.call`` that emits ``poll_gap`` for a late heartbeat poll (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(self: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind != "poll":
            return fn(self, kind, *args, **kwargs)
        now = time.time()
        if _POLL:
            gap, idle = now - _POLL["sent"], now - _POLL["back"]
            if gap > 0.6 or idle > 0.1:
                emit("poll_gap", now, gap=round(gap, 4), idle=round(idle, 4))
        _POLL["sent"] = _POLL["back"] = now
        try:
            return fn(self, kind, *args, **kwargs)
        finally:
            _POLL["back"] = time.time()

    return wrapper


def install() -> None:
    """Wrap the worker's membership-change path (see the module docstring). Idempotent enough: call once."""
    from cloud_elastic.worker import client, collectives, context, elastic, state, statecodec

    ctx_cls = context.WorkerContext
    for name, event, field in (("_seen_update", "update_seen", "gen"), ("_seen_abort", "abort_seen", "round")):
        descriptor = _Growing(event, field)
        descriptor.__set_name__(ctx_cls, name)
        setattr(ctx_cls, name, descriptor)
    client.DriverClient.call = _poll_gaps(client.DriverClient.call)
    ctx_cls.wait = _raising(ctx_cls.wait)
    ctx_cls.group = _raising(ctx_cls.group)
    original_call = ctx_cls._call

    @functools.wraps(original_call)
    def call(self: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
        if kind not in ("register", "rendezvous"):
            return original_call(self, kind, *args, **kwargs)
        return _timed(kind, original_call)(self, kind, *args, **kwargs)

    ctx_cls._call = call
    ctx_cls._form_group = _timed("form_group", ctx_cls._form_group)
    ctx_cls._new_group = _timed("new_group", ctx_cls._new_group)  # the Gloo constructor, on form_group's side thread
    context._preload_lazy_modules = _timed("preload", context._preload_lazy_modules)
    elastic._hold_synced_state = _timed("hold_synced", elastic._hold_synced_state)
    elastic._root_commit_seq = _timed("root_seq", elastic._root_commit_seq)
    state.TorchState.restore = _timed("restore", state.TorchState.restore)
    state.TorchState.sync = _timed("sync", state.TorchState.sync, counts=True)
    for handler in (state._ModelHandler, state._OptimizerHandler):
        handler.sync = _timed(f"sync:{handler.__name__}", handler.sync)
    state.ObjectState.sync = _timed("sync:objects", state.ObjectState.sync)
    # Looked up as module globals at each call, so the wrappers see every call.
    collectives.broadcast_ = _counted("bcast_s", collectives.broadcast_, calls="broadcasts")
    statecodec.encode = _counted("codec_s", statecodec.encode)
    statecodec.decode = _counted("codec_s", statecodec.decode)
    state.State.on_reset = _timed("reset", state.State.on_reset)

    check = state.State.check_host_updates

    @functools.wraps(check)
    def check_host_updates(self: Any) -> None:
        try:
            check(self)
        except BaseException as exc:
            if type(exc).__name__ == "HostsUpdatedInterrupt":
                emit("interrupt", time.time())
            raise

    state.State.check_host_updates = check_host_updates
