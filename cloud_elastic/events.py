"""Job events: one machine-readable record of what a job went through.

The driver calls ``sink.emit(kind, **fields)`` for each event of :data:`SCHEMA`;
:class:`JsonLinesEvents` writes them to ``--events-file`` as JSON lines (one
object per line, flushed per event)::

    {"v": 1, "ts": 1763900000.25, "event": "worker_failed", "job": "ab12cd34", "host": "10.0.1.7", ...}

``docs/events.md`` documents every kind (schema version 1). A field the
schema does not know, a missing required field or a value of the wrong type
raises ValueError at the call: that is a bug in the caller, and the unit tests
of the schema catch it. Sinks are thread-safe. :class:`NullEvents` is the sink
when no events file is given; :class:`TeeEvents` feeds several sinks (e.g. the
file and the Prometheus metrics).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, TextIO

from cloud_elastic.errors import ConfigError

if TYPE_CHECKING:
    from cloud_elastic.metrics import MetricsServer

__all__ = [
    "SCHEMA_VERSION",
    "EventKind",
    "SCHEMA",
    "EventSink",
    "NullEvents",
    "JsonLinesEvents",
    "TeeEvents",
    "JobSinks",
    "open_sinks",
    "validate",
]

log = logging.getLogger(__name__)

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
    _kind("worker_started", "a worker process was launched on a host slot", _WORKER, _WORKER_OPT),
    _kind("worker_ready", "a worker registered and is ready to join a round", _WORKER, _WORKER_OPT),
    _kind("worker_failed", "a worker exited or went silent before the job succeeded",
          {**_WORKER, "exit_code": _OPT_INT, "blacklisted_s": _OPT_NUM},
          {**_WORKER_OPT, "signal": (str,), "reason": (str,), "rank": _OPT_INT, "whole_host": (bool,)}),
    _kind("worker_left", "a worker left gracefully (its host is draining or was removed, or it returned early)",
          {**_WORKER, "reason": (str,)},
          {**_WORKER_OPT, "early_return": (bool,), "commit_step": _OPT_INT, "steps": (int,)}),
    _kind("round_stalled", "no member of a round made progress within --progress-timeout",
          {"round": (int,), "idle_s": _NUM}, {"reason": (str,), "workers": (list,)}),
    _kind("stacks", "a worker's Python stacks, sent when the driver found its round stuck",
          {**_WORKER, "text": (str,)}, {**_WORKER_OPT, "rank": _OPT_INT}),
    _kind("round_formed", "a rendezvous round formed a process group",
          {"round": (int,), "size": (int,), "ranks": (dict,), "synced": (bool,)},
          {"step": _OPT_INT, "from_checkpoint": (bool,)}),
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
    _kind("checkpoint_loaded", "training resumed from a durable checkpoint",
          {"step": (int,), "path": (str,)}, {"steps_lost": _OPT_INT}),
    _kind("job_finished", "the job ended",
          {"outcome": (str,), "exit_code": (int,), "resets": (int,), "wall_s": _NUM},
          {"reason": (str,)}),
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


class EventSink(Protocol):
    """Where the driver sends events. ``emit`` validates and never blocks for long."""

    def emit(self, kind: str, **fields: Any) -> None: ...

    def close(self) -> None: ...


class NullEvents:
    """The sink when no events file is given: validates (so bugs surface in every run), keeps nothing."""

    def emit(self, kind: str, **fields: Any) -> None:
        validate(kind, fields)

    def close(self) -> None:
        pass


class JsonLinesEvents:
    """Appends one JSON object per event to ``path``, flushed as it happens.

    ``start()`` opens the file (appending, so an earlier job's record is kept;
    each line names its job). Thread-safe. A write that fails (disk full,
    file removed) is logged once and later events are dropped: losing the
    record must not stop the training.
    """

    def __init__(self, path: str, job_id: str, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.job_id = job_id
        self._clock = clock
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._broken = False

    def start(self) -> None:
        """Open the file; OSError if it cannot be opened (report it before the job starts)."""
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def emit(self, kind: str, **fields: Any) -> None:
        validate(kind, fields)
        record = {"v": SCHEMA_VERSION, "ts": round(self._clock(), 3), "event": kind, "job": self.job_id, **fields}
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            if self._file is None or self._broken:
                return
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                self._broken = True
                log.warning("events file %s: %s; no further events are written", self.path, exc)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    if not self._broken:  # the failed write's bytes fail again here: already reported
                        log.warning("events file %s: %s", self.path, exc)
                self._file = None

    def __enter__(self) -> "JsonLinesEvents":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TeeEvents:
    """Sends each event to several sinks; an invalid event raises before any sink sees it."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = sinks or (NullEvents(),)

    def emit(self, kind: str, **fields: Any) -> None:
        validate(kind, fields)
        for sink in self.sinks:
            sink.emit(kind, **fields)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


@dataclass(frozen=True)
class JobSinks:
    """What :func:`open_sinks` started: ``sink`` gets every event; ``metrics`` (or None) also
    takes ``observe_discovery`` / ``observe_step``. ``close()`` closes both."""

    sink: EventSink
    metrics: "MetricsServer | None"

    def close(self) -> None:
        self.sink.close()


def open_sinks(job_id: str, events_file: str | None, metrics_port: int | None) -> JobSinks:
    """Start the events file and the metrics server a job's flags ask for (either, both or none).

    Call it before any worker starts: a file that cannot be opened, a port
    that is taken or a missing ``[metrics]`` extra is a ConfigError (the CLI's
    exit code 2, nothing started), and whatever was already opened is closed.
    """
    sinks: list[Any] = []
    metrics = None
    try:
        if events_file is not None:
            events = JsonLinesEvents(events_file, job_id)
            try:
                events.start()
            except OSError as exc:
                raise ConfigError(f"--events-file {events_file}: {exc.strerror or exc}") from None
            sinks.append(events)
        if metrics_port is not None:
            from cloud_elastic.metrics import MetricsServer

            metrics = MetricsServer(job_id, metrics_port)
            try:
                metrics.start()
            except OSError as exc:
                raise ConfigError(f"--metrics-port {metrics_port}: {exc.strerror or exc}") from None
            sinks.append(metrics)
    except BaseException:
        for opened in sinks:
            opened.close()
        raise
    return JobSinks(TeeEvents(*sinks), metrics)
