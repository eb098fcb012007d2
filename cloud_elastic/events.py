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
file and the Prometheus metrics). The schema itself lives in
:mod:`cloud_elastic.event_schema` (re-exported here), which the metrics use too,
so this module may import the metrics without a cycle.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, TextIO

from cloud_elastic.errors import ConfigError
from cloud_elastic.event_schema import ENVELOPE, SCHEMA, SCHEMA_VERSION, EventKind, validate

if TYPE_CHECKING:
    from cloud_elastic.metrics import MetricsServer

__all__ = [
    "SCHEMA_VERSION",
    "EventKind",
    "SCHEMA",
    "ENVELOPE",
    "EventSink",
    "NullEvents",
    "JsonLinesEvents",
    "TeeEvents",
    "JobSinks",
    "open_sinks",
    "validate",
]

log = logging.getLogger(__name__)


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
        self._broken = self._newline = False

    def start(self) -> None:
        """Open the file; OSError if it cannot be opened (report it before the job starts).

        A new file is created readable by its owner only (0600): it holds the job's command line, whose
        arguments may carry credentials, and what the job went through. An existing file keeps its mode
        (the user chose it). One that does not end with a newline (a driver stopped while writing a line)
        gets one before this sink's first event.
        """
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._file = open(fd, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        # A driver stopped mid-line left the file without its last newline: this job's first event starts a
        # line of its own, not the end of that cut one (``timeline`` skips the cut line then).
        self._newline = _ends_cut(self.path, fd)

    def emit(self, kind: str, **fields: Any) -> None:
        validate(kind, fields)
        record = {"v": SCHEMA_VERSION, "ts": round(self._clock(), 3), "event": kind, "job": self.job_id, **fields}
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            if self._file is None or self._broken:
                return
            try:
                self._file.write("\n" + line if self._newline else line)
                self._file.flush()
                self._newline = False
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


def _ends_cut(path: str, fd: int) -> bool:
    """Whether the regular file ``path`` (open as ``fd``) is non-empty and does not end with a newline.
    False where that cannot be read (a pipe, a file the user may only write)."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return False
        with open(path, "rb") as fh:
            fh.seek(info.st_size - 1)
            return fh.read(1) != b"\n"
    except OSError:
        return False


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
    takes ``observe_discovery`` / ``observe_progress``. ``close()`` closes both."""

    sink: EventSink
    metrics: "MetricsServer | None"

    def close(self) -> None:
        self.sink.close()


def open_sinks(job_id: str, events_file: str | None, metrics_port: int | None, *,
               metrics_addr: str = "127.0.0.1") -> JobSinks:
    """Start the events file and the metrics server a job's flags ask for (either, both or none).

    The metrics server binds ``metrics_addr`` (``--metrics-addr``): loopback unless the user says otherwise.

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

            metrics = MetricsServer(job_id, metrics_port, bind=metrics_addr)
            try:
                metrics.start()
            except OSError as exc:
                raise ConfigError(f"--metrics-addr {metrics_addr} --metrics-port {metrics_port}: "
                                  f"{exc.strerror or exc}") from None
            sinks.append(metrics)
    except BaseException:
        for opened in sinks:
            opened.close()
        raise
    return JobSinks(TeeEvents(*sinks), metrics)
