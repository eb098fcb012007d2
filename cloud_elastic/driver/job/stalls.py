"""Who a stalled collective waits for: the members' flight records compared (pure, no I/O).

Every heartbeat carries the worker's newest collective (its flight record's
latest entry, see ``worker.rounds.flight``): round, sequence number, op, and
whether it is waiting in it (``entered``), left it, or failed. Collectives of a
round are numbered alike on every rank, so the driver can line them up.

A collective *stalls* when members of the round have been waiting in it for at
least ``min_wait_s``: :func:`find_stall` names it (the highest sequence number
waited in), the ranks waiting, and the members that have not completed it: they
never arrived (their newest entry is an earlier one) or are inside it and
silent. Those are the collective's culprits; the liveness rule gives one up
only when it is also silent (see :mod:`.liveness`), and the log and the events
file name them first (:func:`describe`, :func:`stall_event`).

A stuck member's stacks (sent when the no-progress watch asks, or printed on
the driver's signal as a silent one is stopped) say where its script is:
:func:`main_frame` picks its main thread's innermost Python frame, which a job
ended for making no progress names (see :mod:`.repeats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from cloud_elastic.driver.job.workers import WorkerRecord
from cloud_elastic.protocol import FlightEntry
from cloud_elastic.protocol_reports import StacksReport

__all__ = ["Heard", "Missing", "Stall", "find_stall", "describe", "stall_event", "main_frame"]


@dataclass(slots=True)
class Heard:
    """What the driver last heard from a worker: when (running time), and its newest collective.

    ``flight_at`` is the running time at which that collective's state began (the
    heartbeat's arrival less the entry's age). The inter-arrival statistics are
    :mod:`.liveness`'s.
    """

    at: float
    flight: FlightEntry | None = None
    flight_at: float = 0.0
    arrivals: int = 0
    mean: float = 0.0
    var: float = 0.0
    peak: float = 0.0
    #: The longest garbage-collector pause it says to expect (see ``worker.link.pauses``).
    pause: float = 0.0
    #: Its silence limit as of its last heartbeat (see ``liveness.silence_limit``; None: too few heard yet).
    limit: float | None = None


@dataclass(frozen=True)
class Missing:
    """A member the stalled collective waits for."""

    worker: str
    rank: int | None
    host: str
    slot: int
    #: Its newest collective as the driver last heard it, in words.
    last: str
    #: Seconds since its last heartbeat (running time).
    silent_s: float


@dataclass(frozen=True)
class Stall:
    """A collective of ``round`` (number ``seq``, ``op``) that ``waiting`` ranks wait in, for ``missing``."""

    round: int
    seq: int
    op: str
    #: Running time at which the first of the waiting ranks entered it.
    since: float
    waiting: tuple[int, ...]
    missing: tuple[Missing, ...]

    def waited_s(self, running_now: float) -> float:
        return max(0.0, running_now - self.since)

    def blames(self, worker_id: str) -> bool:
        return any(m.worker == worker_id for m in self.missing)


def _last(heard: Heard | None, running_now: float) -> str:
    f = None if heard is None else heard.flight
    if f is None:
        return "no collective yet"
    return f"#{f.seq} {f.op} of round {f.round} {f.state} {running_now - heard.flight_at:.1f}s ago"


def find_stall(members: Iterable[WorkerRecord], heard: Mapping[str, Heard], round_: int, running_now: float,
               min_wait_s: float) -> Stall | None:
    """The collective of round ``round_`` that members have waited in for at least ``min_wait_s``, with
    the members that have not completed it; None when nobody waits that long (or nobody is missing:
    every member is inside and heartbeating, the collective is merely slow).

    A *waiting* member heartbeats (within two ``min_wait_s``) from inside a collective. Waiting ranks
    may be one collective apart (a broadcast's root can still be sending while a receiver has moved
    on), so the stalled collective is the earliest they wait in. A member is *missing* unless it is
    past it (a later one entered, or it ended) or inside it and heartbeating.
    """
    members = list(members)
    seq, op, since, waiting = 0, "", float("inf"), []
    for w in members:
        h = heard.get(w.worker_id)
        f = None if h is None else h.flight
        if (f is None or f.round != round_ or f.state != "entered" or running_now - h.flight_at < min_wait_s
                or running_now - h.at > 2 * min_wait_s):
            continue
        if not waiting or f.seq < seq:
            seq, op = f.seq, f.op
        since = min(since, h.flight_at)
        waiting.append(w)
    if not waiting:
        return None
    missing, waiters = [], {w.worker_id for w in waiting}
    for w in members:
        if w.worker_id in waiters:
            continue
        h = heard.get(w.worker_id)
        f = None if h is None else h.flight
        past = f is not None and f.round == round_ and (f.seq > seq or f.seq == seq and f.state != "entered")
        inside = f is not None and f.round == round_ and f.seq == seq and running_now - h.at <= 2 * min_wait_s
        if not (past or inside):
            missing.append(Missing(w.worker_id, w.rank, w.slot.host, w.slot.index, _last(h, running_now),
                                   running_now - (h.at if h is not None else w.last_seen)))
    ranks = tuple(sorted(w.rank for w in waiting if w.rank is not None))
    return Stall(round_, seq, op, since, ranks, tuple(missing)) if missing else None


def describe(stall: Stall, running_now: float) -> str:
    """One line for the log: the collective, who waits, and who it waits for (rank, worker, host, last entry)."""
    who = "; ".join(
        f"rank {m.rank} (worker {m.worker} on host {m.host}, slot {m.slot}): its last collective {m.last}, "
        f"silent {m.silent_s:.1f}s" for m in stall.missing)
    waiting = ", ".join(str(r) for r in stall.waiting)
    return (f"collective #{stall.seq} ({stall.op}) of round {stall.round} stalled: rank(s) {waiting} have waited "
            f"{stall.waited_s(running_now):.1f}s in it; not arrived or not finished: {who}")


def stall_event(stall: Stall, running_now: float, verdict: str) -> dict:
    """The fields of a ``collective_stalled`` event (see ``event_schema``); ``verdict`` says what follows."""
    return {"round": stall.round, "seq": stall.seq, "op": stall.op, "waited_s": round(stall.waited_s(running_now), 3),
            "waiting": list(stall.waiting), "verdict": verdict,
            "missing": [{"rank": m.rank, "worker": m.worker, "host": m.host, "slot": m.slot, "last": m.last,
                         "silent_s": round(m.silent_s, 3)} for m in stall.missing]}


#: ``faulthandler``'s header of the thread that printed the stacks, and its last line past 100 threads.
_CURRENT_THREAD = "Current thread "
_MORE_THREADS = "..."


def main_frame(stacks: str, *, on_signal: bool = False) -> str:
    """The innermost Python frame of the main thread in ``stacks`` (``faulthandler``'s text: one block per thread,
    most recent call first), as ``"path", line N in function``; "" when it cannot be told which block is the main
    thread's, or that block has no frame.

    A block starts at its thread's header (the one unindented line) or after a blank line: the stacks a worker
    prints on the driver's signal come without the blank lines (``SignalStacks`` keeps only ``faulthandler``'s
    lines). The main thread's block is the one its header marks (``StacksReport.MAIN_THREAD``: the worker's
    ``format_stacks``). Text without the mark (an older worker's, or ``faulthandler``'s own) tells nothing, except
    what a worker printed on the driver's signal (``on_signal``): its ``Current thread`` block is the thread that
    ran the handler, which for a signal sent to the process is the main thread (the kernel hands it to the
    process's first thread unless that one blocks it or has another pending), so that block is taken, but only
    when every thread was listed (past 100, ``faulthandler`` ends with a ``...`` line, and the current thread may
    be among those left out). A ``<module>`` frame says nothing: another thread inside a lazy import runs one, and
    a main thread deeper than 100 frames shows none. Linear in the text (at most 48 KiB, see ``StacksReport``)."""
    blocks: list[list[str]] = []
    fresh = True
    for line in stacks.splitlines():
        if not line.strip():
            fresh = True
            continue
        if fresh or not line.startswith(" "):
            blocks.append([])
        blocks[-1].append(line)
        fresh = False
    marked = [lines for lines in blocks if f"({StacksReport.MAIN_THREAD};" in lines[0]]
    if not marked:
        if not on_signal or any(lines[0].strip() == _MORE_THREADS for lines in blocks):
            return ""
        marked = [lines for lines in blocks if lines[0].startswith(_CURRENT_THREAD)]
    for lines in marked[:1]:
        frames = [line.strip()[len("File "):] for line in lines if line.strip().startswith("File ")]
        if frames:
            return frames[0]
    return ""

