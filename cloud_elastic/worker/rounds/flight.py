"""A worker's flight record: its last collectives, in a fixed ring, for the driver to compare across ranks.

In the spirit of NCCL's flight recorder, every collective the training thread
waits for (``RoundGroupsMixin.wait``) is written into a ring of
:data:`RING_SIZE` slots: the round, its sequence number in the round (1, 2, ...
reset when a round forms, so that every rank numbers the same collective the
same way), what it is ("gradient allreduce", "membership check", ...), whether
it was *entered* (the thread waits in it), *completed* or *failed*, and when.

Point-to-point sends and receives (a broadcast to some ranks only) are not
numbered: their ranks do not all take part, and numbering them would set the
ranks' sequence numbers apart for the rest of the round.

Nothing is allocated per collective beyond what the caller already holds: the
slots are preallocated ``array`` columns written in place, and ``op`` is a
reference to the caller's string.

One thread writes (the training thread), another reads (the heartbeat thread,
for :meth:`latest`; the stacks report, for :meth:`format`). A slot is filled
before :attr:`_last` points at it, and it is overwritten only
``RING_SIZE`` collectives later, so a reader sees one whole entry, give or
take the state a concurrent completion has just written.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

__all__ = ["FlightRecorder", "RING_SIZE"]

#: Collectives kept; the newest overwrites the oldest.
RING_SIZE = 64

_EMPTY, _ENTERED, _COMPLETED, _FAILED = 0, 1, 2, 3
_STATES = ("empty", "entered", "completed", "failed")
#: Longest ``op`` sent to the driver (the wire carries one entry per heartbeat).
_OP_CHARS = 60


class FlightRecorder:
    """The ring of a worker's last collectives (see module docstring)."""

    def __init__(self, size: int = RING_SIZE) -> None:
        self._size = size
        self._round = array("q", bytes(8 * size))
        self._seq = array("q", bytes(8 * size))
        self._state = array("b", bytes(size))
        self._entered = array("d", bytes(8 * size))
        self._ended = array("d", bytes(8 * size))
        self._op: list[str] = [""] * size
        self._last = -1  # slot of the newest entry; -1 before the first
        self._count = 0  # entries ever written (slot = count % size)
        self._current_round = 0
        self._next_seq = 1

    def new_round(self, round_: int) -> None:
        """A round formed: its collectives are numbered from 1."""
        self._current_round, self._next_seq = round_, 1

    def entered(self, op: str, now: float | None = None) -> int:
        """The training thread starts waiting in a collective; returns the slot to complete."""
        i = self._count % self._size
        self._round[i] = self._current_round
        self._seq[i] = self._next_seq
        self._op[i] = op
        self._entered[i] = time.monotonic() if now is None else now
        self._ended[i] = 0.0
        self._state[i] = _ENTERED
        self._next_seq += 1
        self._count += 1
        self._last = i
        return i

    def completed(self, slot: int, ok: bool = True, now: float | None = None) -> None:
        """The collective in ``slot`` completed (``ok``) or failed."""
        if slot < 0:
            return
        self._ended[slot] = time.monotonic() if now is None else now
        self._state[slot] = _COMPLETED if ok else _FAILED

    def latest(self, now: float | None = None) -> dict[str, Any] | None:
        """The newest entry for a heartbeat, with its age (seconds since it was entered, or since it ended);
        None before the first collective."""
        i = self._last
        if i < 0:
            return None
        state = self._state[i]
        at = self._entered[i] if state == _ENTERED else self._ended[i]
        now = time.monotonic() if now is None else now
        return {"round": self._round[i], "seq": self._seq[i], "op": self._op[i][:_OP_CHARS],
                "state": _STATES[state], "age_s": round(max(0.0, now - at), 3)}

    def format(self, now: float | None = None) -> str:
        """The whole ring, oldest first, one line per collective (for the stacks the driver asks for)."""
        now = time.monotonic() if now is None else now
        n = min(self._count, self._size)
        lines = [f"Flight record (last {n} collectives, newest last):"]
        for k in range(self._count - n, self._count):
            i = k % self._size
            state = self._state[i]
            ended = "" if state == _ENTERED else f", {_STATES[state]} {now - self._ended[i]:.3f}s ago"
            lines.append(f"  round {self._round[i]} #{self._seq[i]} {self._op[i]}: entered "
                         f"{now - self._entered[i]:.3f}s ago{ended}")
        return "\n".join(lines)
