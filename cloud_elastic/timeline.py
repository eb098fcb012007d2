"""``cloud-elastic timeline``: a picture of a job from its events file.

:func:`read_events` reads the JSON lines of ``--events-file`` (the last job in
the file, unless told which); :func:`build_timeline` turns them into a pure
:class:`Timeline` (world size over time, one lane per host slot holding each
worker's life, notices, rollbacks, and with several priced host sources the
running cost); :func:`draw_timeline` draws it with
matplotlib, which is the optional extra ``[plot]``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from cloud_elastic.errors import ConfigError
from cloud_elastic.event_schema import SCHEMA, validate

__all__ = ["WorkerLife", "Timeline", "read_events", "build_timeline", "draw_timeline", "MAX_LINE_CHARS"]

log = logging.getLogger(__name__)

_EXTRA_HINT = "cloud-elastic timeline needs matplotlib: pip install 'cloud-elastic[plot]'"
#: The formats `cloud-elastic timeline -o` writes, by suffix.
_FORMATS = (".png", ".svg", ".pdf")


@dataclass
class WorkerLife:
    """One worker on one host slot; times are seconds since the job started."""

    start: float
    ready: float | None = None
    end: float | None = None
    #: "failed", "left", "finished" (the job ended with it running) or None while open.
    how: str | None = None
    worker: str | None = None
    #: (t, "starting" | "waiting" | "training") from t on: waiting is ready but in no round (a spare, or
    #: a worker waiting for its first round). Events files without ``round_formed.workers`` (written by
    #: older drivers) cannot tell: there a ready worker counts as training.
    phases: list[tuple[float, str]] = field(default_factory=list)

    def enter(self, t: float, phase: str) -> None:
        if not self.phases or self.phases[-1][1] != phase:
            self.phases.append((t, phase))


@dataclass
class Timeline:
    """What the picture shows, derived from one job's events."""

    job: str
    duration: float
    #: (t, size): the world size from t on.
    world: list[tuple[float, int]] = field(default_factory=list)
    #: (host, slot) -> the lives of the workers that ran there, in order.
    lanes: dict[tuple[str, int], list[WorkerLife]] = field(default_factory=dict)
    #: (t, host, source)
    notices: list[tuple[float, str, str]] = field(default_factory=list)
    #: (t, steps lost, commit rolled back to)
    rollbacks: list[tuple[float, int, int | None]] = field(default_factory=list)
    #: (t, dollars so far), from the ``cost`` events and ``job_finished`` (several host sources).
    cost: list[tuple[float, float]] = field(default_factory=list)
    outcome: str | None = None

    def summary(self) -> str:
        workers = sum(len(lives) for lives in self.lanes.values())
        lost = sum(r[1] for r in self.rollbacks)
        cost = f", cost ${self.cost[-1][1]:.4g}" if self.cost else ""
        return (f"job {self.job}: {_count(workers, 'worker')} on {_count(len(self.lanes), 'host slot')}, "
                f"{_count(len(self.world), 'round')}, {_count(len(self.rollbacks), 'rollback')} "
                f"({_count(lost, 'step')} lost), {_count(len(self.notices), 'notice')}{cost}")


def _count(n: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def read_events(path: str, job: str | None = None) -> list[dict[str, Any]]:
    """The events of ``job`` (default: the last job started in the file), in file order.

    Only that job's events are kept (the file is read twice when the job is not named: once to find it),
    and no line longer than :data:`MAX_LINE_CHARS` is read whole, so memory stays bounded by the drawn job.
    Every line is checked against the events schema (:mod:`cloud_elastic.event_schema`; kinds and fields it
    does not know, from a newer driver, are passed over). ConfigError ``FILE line N: ...`` for a line that is
    not an event, has a field of the wrong type or is too long, or when the file holds no events of the job.
    A last line without its newline (the driver was killed while writing it) is left out with a warning, and so
    is such a line that the next driver's events follow (see :func:`_records`).
    """
    named = job is not None
    if not named:
        last_started = last_any = None
        for _, record in _records(path):
            last_any = record.get("job")
            if record["event"] == "job_started":
                last_started = last_any
        job = last_started if last_started is not None else last_any
    chosen = [record for _, record in _records(path, quiet=not named) if record.get("job") == job]
    if not chosen:
        raise ConfigError(f"{path} holds no events" + (f" of job {job}" if job else ""))
    return chosen


#: The longest line :func:`read_events` reads (an event is a few KiB; a ``stacks`` event's text is cut to the
#: control plane's 64 KiB message limit): a longer one is refused by its number rather than held in memory.
MAX_LINE_CHARS = 1 << 20


def _records(path: str, *, quiet: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, event) for each event line of the file, checked (see :func:`read_events`).

    A line that is no JSON followed by an event is a line a stopped driver left cut short, which the next
    driver's events follow: left out with a note; an event a driver older than this one appended to the cut
    line, writing no newline first, is read. Such a line followed by another, or by nothing, is refused.
    """
    number, cut = 0, None
    try:
        with open(path, encoding="utf-8") as fh:
            while True:
                number += 1
                try:
                    line = fh.readline(MAX_LINE_CHARS + 1)
                except UnicodeDecodeError:
                    raise ConfigError(f"{path} line {number}: not UTF-8 text") from None
                if not line:
                    break
                if len(line) > MAX_LINE_CHARS:
                    raise ConfigError(f"{path} line {number}: longer than {MAX_LINE_CHARS} characters")
                if not line.endswith("\n"):
                    if not quiet:
                        log.warning("note: %s line %d has no newline at its end (the driver was stopped while "
                                    "writing it): left out", path, number)
                    break
                if not line.strip():
                    continue
                parsed = _json(line)
                if parsed is _NOT_JSON:
                    if cut is not None:
                        raise ConfigError(f"{path} line {cut} is not an event (a JSON object with 'event' and 'ts')")
                    cut, parsed = number, _appended(line)
                    if parsed is _NOT_JSON:
                        continue
                record = _event(path, number, parsed)
                if cut is not None and not quiet:
                    log.warning("note: %s line %d %s an event cut short (a driver was stopped while writing it): "
                                "left out", path, cut, "is" if cut < number else "begins with")
                cut = None
                if record is not None:
                    yield number, record
    except OSError as exc:
        raise ConfigError(f"cannot read events file {path}: {exc.strerror or exc}") from None
    if cut is not None:
        raise ConfigError(f"{path} line {cut} is not an event (a JSON object with 'event' and 'ts')")


_NOT_JSON = object()


def _json(text: str) -> Any:
    """The JSON value of ``text``, or ``_NOT_JSON``."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return _NOT_JSON


def _appended(line: str) -> Any:
    """The event an older driver appended to a line cut short (it wrote no newline first), or ``_NOT_JSON``."""
    start = line.find('{"v":', 1)
    return _json(line[start:]) if start > 0 else _NOT_JSON


def _event(path: str, number: int, record: Any) -> dict[str, Any] | None:
    """The event of one line's JSON value, checked against the schema; None for a kind the schema does not know."""
    if not isinstance(record, dict) or "event" not in record or "ts" not in record:
        raise ConfigError(f"{path} line {number} is not an event (a JSON object with 'event' and 'ts')")
    kind, ts = record["event"], record["ts"]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
        raise ConfigError(f"{path} line {number}: 'ts' must be a number of seconds, got {ts!r:.60}")
    spec = SCHEMA.get(kind) if isinstance(kind, str) else None
    if spec is None:
        return None  # nothing the picture draws
    known = {k: v for k, v in record.items() if k in spec.required or k in spec.optional}
    try:
        validate(kind, known)
    except ValueError as exc:
        raise ConfigError(f"{path} line {number}: {str(exc)[:300]}") from None
    return record


def build_timeline(events: Iterable[dict[str, Any]]) -> Timeline:
    """Fold one job's events into a :class:`Timeline` (pure)."""
    events = sorted(events, key=lambda e: e["ts"])
    t0 = events[0]["ts"]
    line = Timeline(job=str(events[0].get("job")), duration=events[-1]["ts"] - t0)
    open_lives: dict[tuple[str, int], WorkerLife] = {}
    members_known = any(e["event"] == "round_formed" and isinstance(e.get("workers"), list) for e in events)
    for event in events:
        t, kind = event["ts"] - t0, event["event"]
        lane = (event.get("host"), event.get("slot"))
        if kind == "worker_started":
            life = WorkerLife(start=t, worker=event.get("worker"), phases=[(t, "starting")])
            line.lanes.setdefault(lane, []).append(life)
            open_lives[lane] = life
        elif kind == "worker_ready" and lane in open_lives:
            open_lives[lane].ready = t
            open_lives[lane].enter(t, "waiting" if members_known else "training")
        elif kind in ("worker_failed", "worker_left") and lane in open_lives:
            life = open_lives.pop(lane)
            life.end, life.how = t, "failed" if kind == "worker_failed" else "left"
        elif kind == "round_formed":
            line.world.append((t, event["size"]))
            members = event.get("workers")
            if isinstance(members, list):
                for life in open_lives.values():
                    if life.ready is not None:
                        life.enter(t, "training" if life.worker in members else "waiting")
        elif kind == "notice":
            line.notices.append((t, event["host"], event["source"]))
        elif kind == "rollback":
            line.rollbacks.append((t, event["steps_lost"], event.get("commit_step")))
        elif kind == "cost":
            line.cost.append((t, float(event["dollars"])))
        elif kind == "job_finished":
            line.outcome = event["outcome"]
            if event.get("cost") is not None:
                line.cost.append((t, float(event["cost"])))
            for life in open_lives.values():
                life.end, life.how = t, "finished"
            open_lives.clear()
    for life in open_lives.values():  # a job still running (or killed): lives end where the record ends
        life.end = line.duration
    return line


def draw_timeline(events: Iterable[dict[str, Any]], output: str) -> str:
    """Draw the job to ``output`` (format from its suffix: png, svg, pdf); return a one-line summary.

    ConfigError naming the ``[plot]`` extra when matplotlib is missing, or when ``output`` does not end in one of
    those suffixes (matplotlib would add ``.png`` to a name without one, and refuse others with a traceback).
    """
    suffix = os.path.splitext(output)[1].lower()
    if suffix not in _FORMATS or output.endswith(os.sep):
        raise ConfigError(f"cannot write {output!r}: the picture's file name must end in .png, .svg or .pdf")
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(_EXTRA_HINT) from None
    line = build_timeline(events)
    end = max(line.duration, 1e-3)
    lanes = sorted(line.lanes, key=lambda lane: (str(lane[0]), lane[1] if lane[1] is not None else -1))
    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=(10, 2.5 + 0.35 * max(len(lanes), 2)),
        gridspec_kw={"height_ratios": [1, max(len(lanes), 2) * 0.35]},
    )
    _draw_world(top, line, end)
    _draw_lanes(bottom, line, lanes)
    for t, lost, commit in line.rollbacks:
        for ax in (top, bottom):
            ax.axvline(t, color="tab:red", linestyle="--", linewidth=1)
        label = f"rollback: {lost} step{'' if lost == 1 else 's'} lost" + (
            f" (back to commit {commit})" if commit is not None else "")
        top.annotate(label, (t, top.get_ylim()[1]), xytext=(3, -12), textcoords="offset points",
                     fontsize=8, color="tab:red")
    bottom.set_xlabel("seconds since the job started")
    title = f"cloud-elastic job {line.job}" + (f": {line.outcome}" if line.outcome else "")
    fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(output, dpi=100)
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return line.summary()


def _draw_world(ax: Any, line: Timeline, end: float) -> None:
    if line.world:
        xs = [t for t, _ in line.world] + [end]
        ys = [size for _, size in line.world] + [line.world[-1][1]]
        ax.plot(xs, ys, drawstyle="steps-post", color="tab:blue", linewidth=2, label="world size")
        ax.set_ylim(0, max(ys) + 1)
    ax.set_ylabel("world size")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for t, host, source in line.notices:
        ax.plot([t], [0.3], marker="v", color="tab:orange", markersize=9)
        ax.annotate(f"{source} notice: {host}", (t, 0.3), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if line.cost:  # the running cost, on its own scale
        dollars = ax.twinx()
        dollars.plot([0.0] + [t for t, _ in line.cost], [0.0] + [d for _, d in line.cost], color="tab:green",
                     linewidth=1.5)
        dollars.set_ylabel("dollars so far", color="tab:green")
        dollars.set_ylim(bottom=0)


_COLOURS = {"starting": "0.75", "waiting": "tab:cyan", "training": "tab:green"}
_ENDS = {"failed": ("X", "tab:red"), "left": ("D", "tab:blue"), "finished": ("", None)}


def _draw_lanes(ax: Any, line: Timeline, lanes: list[tuple[str, int]]) -> None:
    for y, lane in enumerate(lanes):
        for life in line.lanes[lane]:
            end = life.end if life.end is not None else line.duration
            phases = life.phases or [(life.start, "starting")]
            for (t, phase), (until, _) in zip(phases, [*phases[1:], (end, "")]):
                ax.broken_barh([(t, max(until - t, 1e-3))], (y - 0.35, 0.7), color=_COLOURS[phase])
            marker, colour = _ENDS.get(life.how or "finished", ("", None))
            if marker:
                ax.plot([end], [y], marker=marker, color=colour, markersize=10, markeredgewidth=2)
        for t, host, _source in line.notices:
            if host == lane[0]:
                ax.plot([t], [y + 0.45], marker="v", color="tab:orange", markersize=7)
    ax.set_yticks(range(len(lanes)), [f"{host}[{slot}]" for host, slot in lanes])
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    ax.invert_yaxis()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(handles=[
        Patch(color=_COLOURS["starting"], label="starting"),
        Patch(color=_COLOURS["waiting"], label="waiting (spare, or for a round)"),
        Patch(color=_COLOURS["training"], label="training"),
        Line2D([], [], marker="X", color="tab:red", linestyle="", label="failed"),
        Line2D([], [], marker="D", color="tab:blue", linestyle="", label="left"),
        Line2D([], [], marker="v", color="tab:orange", linestyle="", label="notice"),
    ], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
