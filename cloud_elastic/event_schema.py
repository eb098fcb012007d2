"""The schema of the job's events (version 1): every kind, its fields and their JSON types.

:data:`SCHEMA` names each :class:`EventKind`; :func:`validate` raises
ValueError for an unknown kind, a missing required field, a field the kind
does not have or a value of the wrong type (a bool where a number belongs
included). That is a bug in the caller: every sink validates at ``emit``, so
the unit tests of the schema catch it. ``docs/events.md`` documents every
kind. Pure data and one function; it imports nothing of the package, so both
the sinks (:mod:`cloud_elastic.events`) and the metrics
(:mod:`cloud_elastic.metrics`) can check events against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["SCHEMA_VERSION", "EventKind", "SCHEMA", "ENVELOPE", "validate"]

SCHEMA_VERSION = 1

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_INT = (int, type(None))
_OPT_STR = (str, type(None))


@dataclass(frozen=True)
class EventKind:
    """One kind of event: its required and optional fields, each with the JSON types it accepts."""

    name: str
    required: Mapping[str, tuple[type, ...]]
    optional: Mapping[str, tuple[type, ...]]
    doc: str


def _kind(name: str, doc: str, required: dict[str, tuple[type, ...]], optional: dict | None = None) -> EventKind:
    return EventKind(name, required, optional or {}, doc)


_WORKER = {"host": (str,), "slot": (int,)}
_WORKER_OPT = {"worker": (str,), "round": (int,)}

#: Every event kind of schema version 1, by name.
SCHEMA: dict[str, EventKind] = {k.name: k for k in (
    _kind("job_started", "the driver started the job",
          {"num_proc": (int,), "min_np": (int,), "max_np": (int,), "provider": (str,)},
          {"command": (list,)}),
    _kind("hosts_changed", "discovery reported a different set of hosts",
          {"added": (list,), "removed": (list,), "draining": (list,)},
          {"missing": (list,), "resized": (list,)}),
    _kind("worker_started", "a worker process was launched on a host slot", _WORKER,
          {**_WORKER_OPT, "source": (str,), "price": _NUM}),
    _kind("worker_ready", "a worker registered and is ready to join a round", _WORKER, _WORKER_OPT),
    _kind("worker_failed", "a worker exited or went silent before the job succeeded",
          {**_WORKER, "exit_code": _OPT_INT, "blacklisted_s": _OPT_NUM},
          {**_WORKER_OPT, "signal": (str,), "reason": (str,), "rank": _OPT_INT, "whole_host": (bool,),
           "booting": (bool,), "blacklisted_for_good": (bool,)}),
    _kind("worker_left", "a worker left gracefully (its host is draining or was removed, or it returned early)",
          {**_WORKER, "reason": (str,)},
          {**_WORKER_OPT, "early_return": (bool,), "commit_step": _OPT_INT, "steps": (int,), "blacklisted_s": _NUM}),
    _kind("round_stalled", "no member of a round made progress within --progress-timeout",
          {"round": (int,), "idle_s": _NUM}, {"reason": (str,), "workers": (list,)}),
    _kind("collective_stalled", "members of a round waited in a collective for ranks that had not arrived",
          {"round": (int,), "seq": (int,), "op": (str,), "waited_s": _NUM, "waiting": (list,), "missing": (list,)},
          {"verdict": (str,)}),
    _kind("stacks", "a worker's Python stacks: sent when the driver found its round stuck, or printed when signalled",
          {**_WORKER, "text": (str,)}, {**_WORKER_OPT, "rank": _OPT_INT, "via": (str,)}),
    _kind("straggler", "a worker stayed slower than --straggler-factor x the round's median: it is drained",
          {**_WORKER, "compute_s": _NUM, "median_s": _NUM},
          {**_WORKER_OPT, "rank": _OPT_INT, "factor": _NUM, "window_s": _NUM, "blacklisted_s": _NUM,
           "comm_share": _OPT_NUM}),
    _kind("slow_link", "every measured link of a host was much slower than the links between the other hosts: "
          "its workers are drained", {"host": (str,), "mb_s": _NUM, "peers_mb_s": _NUM},
          {"workers": (list,), "peers": (list,), "factor": _NUM, "blacklisted_s": _NUM, "comm_share": _OPT_NUM}),
    _kind("round_formed", "a rendezvous round formed a process group",
          {"round": (int,), "size": (int,), "ranks": (dict,), "synced": (bool,)},
          {"step": _OPT_INT, "from_checkpoint": (bool,), "spares_taken": (int,), "planned": (int,),
           "workers": (list,)}),
    _kind("spares", "the number of spares waiting outside the rounds changed (--spares)",
          {"ready": (int,), "wanted": (int,), "workers": (list,)}),
    _kind("worker_adopted", "a driver restarted within --driver-grace took over a running worker",
          {**_WORKER, "worker": (str,), "round": (int,)}, {"rank": _OPT_INT, "commit_step": _OPT_INT}),
    _kind("adoption_done", "the restarted driver's adoption window closed",
          {"round": (int,), "adopted": (int,), "missing": (list,)}),
    _kind("rollback", "survivors rolled back to their last commit after a failure",
          {"commit_step": _OPT_INT, "steps_lost": (int,)},
          {"round": (int,), "reason": (str,)}),
    _kind("notice", "a host received a termination or maintenance notice",
          {"source": (str,), "host": (str,), "deadline": _OPT_NUM},
          {"action": (str,), "reason": (str,), "soft": (bool,)}),
    _kind("checkpoint_saved", "a durable checkpoint was written",
          {"step": (int,), "path": (str,)}, {"duration_s": _NUM, "bytes": (int,)}),
    _kind("checkpoint_failed", "a durable checkpoint could not be written; training goes on while a later one may be",
          {"reason": (str,), "failed_in_a_row": (int,), "since_s": _NUM}),
    _kind("checkpoint_loaded", "training resumed from a durable checkpoint",
          {"step": (int,), "path": (str,)}, {"steps_lost": _OPT_INT}),
    _kind("capacity", "--manage-capacity: the job set a fallback group's desired capacity",
          {"source": (str,), "hosts": (int,)}, {"reason": (str,)}),
    _kind("cost", "what the job has cost so far (several host sources with prices)",
          {"dollars": _NUM, "dollars_per_hour": _NUM, "slot_hours": _NUM},
          {"unpriced_slot_hours": _NUM, "idle_slot_hours": _NUM, "per_step": _OPT_NUM, "fallback_slots": (int,),
           "by_source": (dict,)}),
    _kind("job_finished", "the job ended",
          {"outcome": (str,), "exit_code": (int,), "resets": (int,), "wall_s": _NUM},
          {"reason": (str,), "cost": _NUM, "cost_fallback_only": _OPT_NUM, "slot_hours": _NUM,
           "unpriced_slot_hours": _NUM, "idle_slot_hours": _NUM, "cost_per_step": _OPT_NUM}),
)}

#: Names every event carries; a field may not reuse them.
ENVELOPE = ("v", "ts", "event", "job")


def validate(kind: str, fields: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``fields`` are exactly what ``kind`` accepts."""
    spec = SCHEMA.get(kind)
    if spec is None:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(SCHEMA)}")
    missing = [name for name in spec.required if name not in fields]
    if missing:
        raise ValueError(f"event {kind!r} lacks required field(s) {', '.join(missing)}")
    for name, value in fields.items():
        types = spec.required.get(name) or spec.optional.get(name)
        if types is None:
            raise ValueError(f"event {kind!r} has no field {name!r}")
        # bool is an int to isinstance, but a bool where a number belongs is a bug.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"event {kind!r} field {name!r} must be {wanted}, got {value!r}")
