"""What a job costs: dollars integrated over the slot-hours it pays for (its workers', and free ones it raised).

:class:`CostMeter` is pure (time is passed in): at each call of :meth:`CostMeter.advance`
the job says, per source, how many slots it holds and at what price
per slot-hour; the meter charges the time since the previous call at the previous
rates (rates change only at those calls, so the integral is exact for a job whose
workers start and stop at them).

What counts: a slot counts from its worker's launch to its exit, at its host's
price; a slot whose host has no known price counts in ``unpriced_slot_hours``,
never as free: it is in no source's ``by_source`` and not in ``fallback_only``. Idle
capacity of a group (hosts no worker uses) is not the job's cost, but for the groups the job raised
(``--manage-capacity``): their free slots are charged too, and counted apart in ``idle_slot_hours``
(which slots: :mod:`cloud_elastic.driver.job.paid`).
``fallback_only`` is what the same priced slot-hours would have cost at the fallback
source's price (so ``dollars`` and ``fallback_only`` compare like with like).

A driver restarted after a crash starts its meter from what its predecessor's meter
said at its last sign of life (:meth:`CostMeter.carry` of a :class:`CostSoFar`, kept
beside the checkpoints by :mod:`cloud_elastic.checkpoint.alive`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["CostMeter", "CostSoFar", "CostSummary", "format_dollars"]


@dataclass(frozen=True)
class CostSummary:
    """The running figures of a :class:`CostMeter`."""

    dollars: float
    dollars_per_hour: float
    slot_hours: float
    unpriced_slot_hours: float
    #: What the same priced slot-hours (``slot_hours - unpriced_slot_hours``) would have cost at the fallback's
    #: price; None if unknown.
    fallback_only: float | None
    #: Dollars spent per source name (a source none of whose slots had a price is not in it).
    by_source: Mapping[str, float] = field(default_factory=dict)
    #: Of ``slot_hours``, those of slots no worker used on hosts of a group the job raised (a crashed
    #: predecessor's carried ones included, as for the other figures).
    idle_slot_hours: float = 0.0


@dataclass(frozen=True)
class CostSoFar:
    """What a job has cost up to a moment, without its rate: what a driver's sign of life carries for the
    driver restarted after it."""

    dollars: float = 0.0
    slot_hours: float = 0.0
    unpriced_slot_hours: float = 0.0
    #: (source name, dollars spent on it), sorted by name.
    by_source: tuple[tuple[str, float], ...] = ()
    #: Of ``slot_hours``, those of free slots on hosts of a fallback group the job raised (:class:`CostSummary`).
    idle_slot_hours: float = 0.0

    def plus(self, other: "CostSoFar") -> "CostSoFar":
        meter = CostMeter()
        meter.carry(self)
        meter.carry(other)
        return meter.so_far()


class CostMeter:
    """Integrates the job's cost over time (see module docstring)."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._rates: dict[str, float] = {}  # source -> dollars per hour now
        self._slots = 0  # slots held now
        self._unpriced = 0  # of them, without a price
        self._idle = 0  # of them, no worker's
        self._idle_unpriced = 0  # of those, without a price
        self.idle_slot_hours = 0.0
        #: Of ``idle_slot_hours``, those without a price (counted in ``unpriced_slot_hours`` too).
        self.idle_unpriced_slot_hours = 0.0
        self.dollars = 0.0
        self.slot_hours = 0.0
        self.unpriced_slot_hours = 0.0
        self.by_source: dict[str, float] = {}
        #: The fallback source's price per slot-hour, as last known (None: never known).
        self.fallback_price: float | None = None
        #: When the job's last worker had stopped (None: running): nothing is charged past it, whoever asks later
        #: (a ``status`` answered while shutdown lowers the raised groups).
        self.until: float | None = None

    def advance(self, now: float, held: Mapping[str, tuple[int, float, int]], idle: int = 0,
                idle_unpriced: int = 0) -> None:
        """Charge up to ``now`` at the old rates, then take ``held``: source -> (slots held, dollars per hour of
        them, slots of them without a price); ``idle``: how many of the slots held no worker uses, and
        ``idle_unpriced`` of those, how many have no price."""
        if self.until is not None:
            now = min(now, self.until)
        if self._last is not None and now > self._last:
            hours = (now - self._last) / 3600.0
            for source, rate in self._rates.items():
                spent = rate * hours
                self.dollars += spent
                self.by_source[source] = self.by_source.get(source, 0.0) + spent
            self.slot_hours += self._slots * hours
            self.unpriced_slot_hours += self._unpriced * hours
            self.idle_slot_hours += self._idle * hours
            self.idle_unpriced_slot_hours += self._idle_unpriced * hours
        if self._last is None or now >= self._last:
            self._last = now
        self._rates = {source: rate for source, (slots, rate, unpriced) in held.items() if slots > unpriced}
        self._slots = sum(slots for slots, _, _ in held.values())
        self._unpriced = sum(unpriced for _, _, unpriced in held.values())
        self._idle, self._idle_unpriced = idle, idle_unpriced

    def carry(self, before: CostSoFar) -> None:
        """Count ``before`` (what the job cost under an earlier driver) as spent: the figures go on from it."""
        self.dollars += before.dollars
        self.slot_hours += before.slot_hours
        self.unpriced_slot_hours += before.unpriced_slot_hours
        # Which of its idle slot-hours had no price is not carried: counted as priced (the "fallback alone" figure
        # leaves them out once, as before the split was kept).
        self.idle_slot_hours += before.idle_slot_hours
        for source, dollars in before.by_source:  # $0 too: a source priced at 0 (unpriced ones are never in it)
            self.by_source[source] = self.by_source.get(source, 0.0) + dollars

    def so_far(self) -> CostSoFar:
        return CostSoFar(self.dollars, self.slot_hours, self.unpriced_slot_hours, tuple(sorted(self.by_source.items())),
                         self.idle_slot_hours)

    @property
    def dollars_per_hour(self) -> float:
        return sum(self._rates.values(), 0.0)

    def summary(self) -> CostSummary:
        # A job on the fallback alone holds the job's slots, not the fallback hosts this job raised and left idle
        # (the price of the fallback policy, counted in ``dollars``): they are left out of what it would have cost.
        # An idle slot without a price is counted once, among the unpriced ones.
        idle_priced = self.idle_slot_hours - self.idle_unpriced_slot_hours
        priced = max(0.0, self.slot_hours - self.unpriced_slot_hours - idle_priced)
        fallback = None if self.fallback_price is None else self.fallback_price * priced
        return CostSummary(dollars=self.dollars, dollars_per_hour=self.dollars_per_hour, slot_hours=self.slot_hours,
                           unpriced_slot_hours=self.unpriced_slot_hours, fallback_only=fallback,
                           by_source=dict(self.by_source), idle_slot_hours=self.idle_slot_hours)


def format_dollars(value: float) -> str:
    """``$12.34``, or ``$0.0042`` for sums below a cent (a short test job costs fractions of one)."""
    return f"${value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"${value:.4f}"
