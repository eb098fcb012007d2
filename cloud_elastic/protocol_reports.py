"""The reports and requests the driver parses besides :mod:`cloud_elastic.protocol`'s: ``drain``,
``unhealthy``, ``notice``, ``checkpoint``, ``stacks`` and ``exiting``, as typed values.

As in :mod:`cloud_elastic.protocol`, each type converts to the JSON object sent on the wire
(``to_wire()``) and back (``from_wire()``), and ``from_wire`` refuses a malformed object as a whole
with :class:`~cloud_elastic.errors.ControlPlaneError` (one line, naming the field). They live
beside that module, which is at its size bound.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields
from typing import Any, Mapping

from cloud_elastic.errors import ControlPlaneError
from cloud_elastic.notices.api import KINDS as NOTICE_KINDS

__all__ = ["CHECKPOINT_EVENTS", "CHECKPOINT_FAILURES", "CheckpointReport", "DrainRequest", "ExitingReport",
           "NOTICE_KINDS", "NoticeReport", "StacksReport", "UNTOLD", "UnhealthyReport", "driver_retrying",
           "driver_unreachable", "fingerprint_field", "said_own_reason", "said_retrying", "said_unreachable",
           "MAX_ADDRESSES", "address_field", "evidence_fields", "fingerprint_wire", "MAX_ERROR_LINE", "error_line",
           "MAX_TOLD_FACTS", "facts_field"]

#: The most characters of the error a worker reports it ended with (``exiting``, ``completed``). A worker's own
#: one-line refusals run past 300 characters, and their last words say where to read on (docs/porting.md).
MAX_ERROR_LINE = 500


def error_line(text: str, limit: int = MAX_ERROR_LINE) -> str:
    """The first line of ``text``, cut to at most ``limit`` characters at a word's end with "…" (not mid-word)."""
    lines = text.strip().splitlines()
    line = lines[0].rstrip() if lines else ""
    if len(line) <= limit:
        return line
    cut = line[:limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ;,:") + "…"

#: What a durable checkpoint report says happened (kind ``checkpoint``): ``not_written`` is one attempt that failed
#: in a way a later one may mend (storage trouble); the driver warns, and ends the job only by its own rule.
CHECKPOINT_EVENTS = ("saved", "loaded", "failed", "not_written", "writing")
#: What failed, in a ``failed`` report: loading the checkpoint of a ``from_checkpoint`` round, writing one (a
#: state the checkpoint cannot hold), or ``--checkpoint-dir`` itself (storage this worker sees apart from the
#: driver's), or the checkpoint found does not fit the state it was to be loaded into (``mismatch``: another
#: model; nothing lost). A report without one is a load (as older workers sent it).
CHECKPOINT_FAILURES = ("load", "write", "storage", "mismatch")

#: How the line begins that a worker which never reached its driver exits with (:func:`driver_unreachable`).
_UNREACHABLE = "cannot reach the driver at "


def driver_unreachable(address: str, tried_s: float, error: str) -> str:
    """Why a worker that never reached its driver at ``address`` in ``tried_s`` seconds (the last try failing with
    ``error``) exits: the line it prints (after ``cloud-elastic: worker ID: ``), which the driver reads back
    (:func:`said_unreachable`) as that worker's reason, since it never heard from the worker itself."""
    return (f"{_UNREACHABLE}{address} for {tried_s:.0f}s ({error[:200]}): check --driver-address and that the "
            "workers can reach the driver (firewall)")


#: How the warning ends that a worker prints when a call to its driver fails and it retries (:func:`driver_retrying`).
_RETRYING = "; retrying for up to "


def driver_retrying(worker_id: str, kind: str, address: str, tried: str, error: str, patience_s: float) -> str:
    """The warning a worker prints when its ``kind`` call to the driver at ``address`` failed (``tried``: ``failed``
    or ``still fails after Ns``) and it retries for up to ``patience_s``: the driver reads it back
    (:func:`said_retrying`) as proof that the worker reached ``hvd.init()`` and tried the driver."""
    return f"worker {worker_id}: {kind} to the driver at {address} {tried} ({error}){_RETRYING}{patience_s:.0f}s"


def said_retrying(line: str) -> bool:
    """Whether a worker's output ``line`` is the warning :func:`driver_retrying` made (whatever logging prefix the
    script's handler put before it). Two substring tests: cheap on every line."""
    return _RETRYING in line and " to the driver at " in line


def said_unreachable(line: str) -> str | None:
    """The reason in a worker's output ``line`` when it is the one :func:`driver_unreachable` made, else None."""
    if not line.startswith("cloud-elastic: worker ") or _UNREACHABLE not in line:
        return None
    return line[line.index(_UNREACHABLE):].strip()[:400]


#: How the reason begins that a worker exits with on a host that lacks the ``--network-interface`` it was given
#: (:mod:`cloud_elastic.worker.interface`), after ``cloud-elastic: worker ID``.
_NO_INTERFACE = ": --network-interface "


#: What the reason says after the host's name when the host's name does not resolve there (Gloo has no address
#: to bind: :func:`cloud_elastic.worker.interface.unresolved_host`), after ``cloud-elastic: worker ID: ``.
_UNRESOLVED = " does not resolve on that host"


def said_own_reason(line: str) -> str | None:
    """The reason in a worker's output ``line`` when it is cloud-elastic's own final line of a worker that exits
    before it could report one: it never reached the driver (:func:`said_unreachable`), its host lacks the
    ``--network-interface`` or its host's name does not resolve there
    (:func:`cloud_elastic.worker.interface.exit_if_missing`); else None."""
    if not line.startswith("cloud-elastic: worker "):
        return None
    if _NO_INTERFACE in line:
        return line[line.index(_NO_INTERFACE) + 2:].strip()[:400]
    if _UNRESOLVED in line and ": host name " in line:
        return line[line.index(": host name ") + 2:].strip()[:400]
    return said_unreachable(line)


def _field(msg: Mapping[str, Any], name: str, what: str, kind: type, must: str, ok: Any = None) -> Any:
    """``msg[name]`` if it is a ``kind`` (never a bool for a number) and ``ok(value)``, else a one-line error."""
    value = msg.get(name)
    if not isinstance(value, kind) or (kind is not str and isinstance(value, bool)) or (ok and not ok(value)):
        raise ControlPlaneError(f"malformed {what}: {name!r} must be {must}, got {value!r:.80}")
    return value


#: The most IP addresses in each address list of a rendezvous request (``protocol.RendezvousRequest``).
MAX_ADDRESSES = 16


def address_field(msg: Mapping[str, Any], name: str, what: str) -> tuple[str, ...] | None:
    """``msg[name]``: at most :data:`MAX_ADDRESSES` IP addresses in their canonical text, None when absent (an older
    worker's); ControlPlaneError naming the field otherwise."""
    raw = msg.get(name)
    if raw is None:
        return None
    if isinstance(raw, list) and len(raw) <= MAX_ADDRESSES and all(isinstance(a, str) for a in raw):
        try:
            return tuple(dict.fromkeys(str(ipaddress.ip_address(a)) for a in raw))
        except ValueError:
            pass
    raise ControlPlaneError(f"malformed {what}: {name!r} must be a list of at most {MAX_ADDRESSES} IP addresses")


def evidence_fields(msg: Mapping[str, Any], what: str) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """A rendezvous request's ``unreachable`` and ``addresses`` (``protocol.RendezvousRequest``). Without
    ``addresses`` it is an older worker's, whose ``unreachable`` names hosts of its assignment's ``hosts``, not
    addresses: at most :data:`MAX_ADDRESSES` names of at most 255 characters. ControlPlaneError naming the field."""
    addresses = address_field(msg, "addresses", what)
    if addresses is not None:
        return address_field(msg, "unreachable", what) or (), addresses
    raw = msg.get("unreachable") or []
    if isinstance(raw, list) and len(raw) <= MAX_ADDRESSES and all(isinstance(h, str) and 0 < len(h) <= 255
                                                                    for h in raw):
        return tuple(raw), None
    raise ControlPlaneError(f"malformed {what}: 'unreachable' must be a list of at most {MAX_ADDRESSES} host names")


#: The fingerprint a worker reports once its state's attributes stood still over training: they do not tell its
#: commits apart, and the driver counts commits instead (``driver.job.repeats``).
UNTOLD = "-"
#: The characters of any other fingerprint (``worker.commit.fingerprint``): at most 16 lower-case hex digits.
_FINGERPRINT = frozenset("0123456789abcdef")


def fingerprint_wire(trained: str) -> dict[str, Any]:
    """The fields that carry ``trained`` (``worker.ledger.CommitLedger.trained``): the fingerprint alone in
    ``trained``, as drivers before its mark read it (they refuse any other text there: a marked one cut a newer
    worker's heartbeats off), and its mark ``+`` as ``moved``, which they ignore. Read by :func:`fingerprint_field`."""
    return {"trained": trained.removeprefix("+"), "moved": trained.startswith("+")}


#: The largest round whose rank 0 its assignment tells every member's sync facts (``protocol.Assignment.facts``);
#: a bigger one gathers them, a collective whose cost is nothing beside such a round's.
MAX_TOLD_FACTS = 1024


def facts_field(msg: Mapping[str, Any], what: str, rank: int, size: int) -> tuple[tuple[int, int, int], ...] | None:
    """An assignment's ``facts`` (``protocol.Assignment``): None when absent (the round's first sync gathers them);
    () to any rank but 0; to rank 0, ``size`` rows of three non-negative integers, the second 0 or 1. ControlPlaneError
    naming the field for anything else (read before anything is allocated by it: at most :data:`MAX_TOLD_FACTS` rows)."""
    facts = msg.get("facts")
    if facts is None:
        return None
    want = size if rank == 0 else 0
    if not isinstance(facts, list) or len(facts) != want or want > MAX_TOLD_FACTS or not all(
            isinstance(row, list) and len(row) == 3 and row[1] in (0, 1)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row) for row in facts):
        raise ControlPlaneError(f"malformed {what}: 'facts' must be {want} row(s) [commit, holds 0/1, host] to rank "
                                f"{rank} of {size}")
    return tuple((row[0], row[1], row[2]) for row in facts)


def fingerprint_field(msg: Mapping[str, Any], what: str) -> str:
    """``msg["trained"]``: the fingerprint of the state a worker would restore (see ``driver.job.repeats``), "" when
    absent (an older worker, a state without plain attributes), marked ``+`` when ``msg["moved"]`` is true (see
    :func:`fingerprint_wire`; or written in it, as workers did for a while); a one-line error for anything else."""
    value = msg.get("trained")
    if value is None or value == "":
        return ""
    value = _field(msg, "trained", what, str, "a state fingerprint (at most 16 hex digits, marked '+' or not, or '-')",
                   lambda v: v == UNTOLD or 0 < len(v.removeprefix("+")) <= 16 and _FINGERPRINT.issuperset(
                       v.removeprefix("+")))
    return "+" + value if msg.get("moved") is True and value[0] not in "+-" else value


@dataclass(frozen=True)
class DrainRequest:
    """``cloud-elastic drain JOB HOST[:SLOT]`` (kind ``drain``, signed like ``status``): the host's workers,
    or the one in ``slot``, leave at their next commit."""

    host: str
    slot: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"host": self.host, "slot": self.slot}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "DrainRequest":
        what = "drain request"
        host = _field(msg, "host", what, str, "a host name of 1 to 255 characters", lambda v: 0 < len(v) <= 255)
        if msg.get("slot") is None:
            return cls(host)
        return cls(host, _field(msg, "slot", what, int, "a non-negative integer", lambda v: v >= 0))


@dataclass(frozen=True)
class UnhealthyReport:
    """A newcomer's device self-test failed (kind ``unhealthy``): ``reason``, its first line, at most 300 characters."""

    reason: str

    def to_wire(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "UnhealthyReport":
        return cls(_field(msg, "reason", "unhealthy report", str, "a non-empty string", len).splitlines()[0][:300])


@dataclass(frozen=True)
class NoticeReport:
    """A notice for the reporting worker's own host (kind ``notice``): from its metadata watcher, or (``own``)
    the SIGTERM the worker got. ``notice`` is one of :data:`NOTICE_KINDS`; ``deadline`` the Unix time the host
    goes, if known; ``source`` is cut to 40 characters and ``reason`` to 200."""

    source: str
    notice: str
    reason: str
    deadline: float | None = None
    own: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"source": self.source, "notice": self.notice, "reason": self.reason, "deadline": self.deadline,
                **({"own": True} if self.own else {})}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "NoticeReport":
        what = "notice message"
        notice = _field(msg, "notice", what, str, f"one of {NOTICE_KINDS}", lambda v: v in NOTICE_KINDS)
        deadline = None if msg.get("deadline") is None else _field(msg, "deadline", what, (int, float),
                                                                     "a number or null")
        return cls(_field(msg, "source", what, str, "a string")[:40], notice,
                   _field(msg, "reason", what, str, "a string")[:200], deadline, msg.get("own") is True)


@dataclass(frozen=True)
class CheckpointReport:
    """Rank 0 wrote (``saved``) or loaded (``loaded``) a durable checkpoint of ``step`` at ``path``, or one failed
    (``failed``, ``reason``, and which of :data:`CHECKPOINT_FAILURES` in ``failure``: the job then ends, with
    :meth:`ending`), or one attempt to write one failed (``not_written``, ``reason``, ``step`` if known) (kind
    ``checkpoint``). A load may give the ``commit_seq`` it restored, a save its
    ``duration_s`` and ``bytes`` (left out, not refused, when of the wrong type). ``path`` is cut to 1,000
    characters and ``reason`` to 600."""

    event: str
    step: int | None = None
    path: str | None = None
    commit_seq: int | None = None
    reason: str | None = None
    duration_s: float | None = None
    bytes: int | None = None
    failure: str | None = None
    #: A load's: the fingerprint of the state it gave (see ``driver.job.repeats``; "" when unknown).
    trained: str | None = None

    def ending(self) -> str:
        """The line a ``failed`` report ends the job with: a load failure loses the training state; a failed
        write or unshared storage ends it before training goes on without the checkpoints it asked for."""
        if self.failure in ("storage", "mismatch"):  # the worker's line says it all
            return str(self.reason)
        if self.failure == "write":
            return f"cannot write the checkpoints --checkpoint-dir asks for: {self.reason}"
        return f"training state lost: cannot resume from the checkpoint: {self.reason}"

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "CheckpointReport":
        what = "checkpoint message"
        event = _field(msg, "event", what, str, f"one of {CHECKPOINT_EVENTS}", lambda v: v in CHECKPOINT_EVENTS)
        if event == "failed":
            failure = None if msg.get("failure") is None else _field(
                msg, "failure", what, str, f"one of {CHECKPOINT_FAILURES}", lambda v: v in CHECKPOINT_FAILURES)
            return cls(event, reason=_field(msg, "reason", what, str, "a string")[:600], failure=failure)
        if event == "not_written":
            step = None if msg.get("step") is None else _field(msg, "step", what, int, "an integer")
            return cls(event, step, reason=_field(msg, "reason", what, str, "a string")[:600])
        if event == "writing":  # before the checkpoint of commit_seq is published (see Driver's control plane)
            return cls(event, _field(msg, "step", what, int, "an integer"),
                       commit_seq=_field(msg, "commit_seq", what, int, "a non-negative integer", lambda v: v >= 0))
        seq = None if msg.get("commit_seq") is None else _field(msg, "commit_seq", what, int, "an integer")
        step, path = _field(msg, "step", what, int, "an integer"), _field(msg, "path", what, str, "a string")
        duration, size = msg.get("duration_s"), msg.get("bytes")
        return cls(event, step, path[:1000], seq,
                   duration_s=duration if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None,
                   bytes=size if isinstance(size, int) and not isinstance(size, bool) else None,
                   trained=fingerprint_field(msg, what) or None)


@dataclass(frozen=True)
class StacksReport:
    """A worker's Python stacks, every thread, sent when the driver asked (``PollReply.stacks``)."""

    request: int
    text: str

    #: Room left for the text in a control message (64 KiB in all).
    MAX_TEXT = 48 * 1024
    #: Marks the main thread's block in the text: ``Thread 0x… (the main thread; most recent call first):``.
    MAIN_THREAD = "the main thread"

    def to_wire(self) -> dict[str, Any]:
        return {"request": self.request, "text": self.text[-self.MAX_TEXT:]}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "StacksReport":
        what = "stacks report"
        text = _field(msg, "text", what, str, "a string")
        return cls(_field(msg, "request", what, int, "a non-negative integer", lambda v: v >= 0), text[-cls.MAX_TEXT:])


@dataclass(frozen=True)
class ExitingReport:
    """A worker is past its exit hooks (kind ``exiting``): the exit code it is about to exit with, as far as it
    knows (1 after an uncaught exception, what it gave ``sys.exit``, else 0), and ``error``, that exception's
    first 300 characters. A driver that adopted the worker cannot reap it, so this is all it learns of how it
    ended. ``code`` None: an older worker that said nothing of it."""

    code: int | None = None
    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "error": self.error}

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> "ExitingReport":
        what = "exiting message"
        code = None if msg.get("code") is None else _field(msg, "code", what, int, "an integer or null",
                                                            lambda v: -256 < v < 256)
        error = None if msg.get("error") is None else _field(msg, "error", what, str, "a string or null")[:MAX_ERROR_LINE]
        return cls(code, error)
