"""Hosts and slots the driver knows about: ordering, draining and the blacklist.

Pure logic: no threads, no I/O. Time and randomness are passed in, so every
rule here is tested alone with a fake clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from cloud_elastic.providers.api import DiscoveredHosts, Drain

__all__ = ["Slot", "Blacklist", "HostChanges", "HostManager"]


@dataclass(frozen=True, order=True)
class Slot:
    """One worker position: the ``index``-th slot of ``host``."""

    host: str
    index: int

    def __str__(self) -> str:
        return f"{self.host}[{self.index}]"


class Blacklist:
    """Per-slot blacklist with exponential back-off inside ``cooldown_range_s``.

    The n-th failure of a slot blocks it for ``min(hi, lo * 2**(n-1))`` seconds
    plus up to 10 % jitter (capped at ``hi``), so slots failing together do not
    all come back in the same instant. Blacklisting is per slot, not per host:
    one crashing GPU does not take its healthy siblings down with it.
    A range of ``(0, 0)`` disables the blacklist.
    """

    def __init__(self, cooldown_range_s: tuple[float, float], rng: random.Random | None = None) -> None:
        self.lo, self.hi = cooldown_range_s
        self._rng = rng or random.Random()
        self._failures: dict[Slot, int] = {}
        self._until: dict[Slot, float] = {}

    def record_failure(self, slot: Slot, now: float) -> float:
        """Count a failure of ``slot``; return how many seconds it is now blocked for."""
        count = self._failures.get(slot, 0) + 1
        self._failures[slot] = count
        if self.hi <= 0:
            return 0.0
        base = min(self.hi, self.lo * (2 ** (count - 1)))
        delay = min(self.hi, base * (1.0 + 0.1 * self._rng.random()))
        self._until[slot] = now + delay
        return delay

    def failures(self, slot: Slot) -> int:
        """How many times ``slot`` has failed."""
        return self._failures.get(slot, 0)

    def blocked(self, slot: Slot, now: float) -> bool:
        """Whether ``slot`` is still cooling down at ``now``."""
        return self._until.get(slot, float("-inf")) > now


@dataclass(frozen=True)
class HostChanges:
    """What one discovery snapshot changed."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    resized: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.draining or self.resized)


@dataclass
class HostManager:
    """The current view of the group, in the order hosts were first seen.

    Older hosts sort first, so their workers keep the lower ranks. A host that
    leaves and later returns counts as new.
    """

    blacklist: Blacklist
    ready: dict[str, int] = field(default_factory=dict)
    draining: dict[str, Drain] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # host -> cloud instance id, where known
    _order: dict[str, int] = field(default_factory=dict)
    _seq: int = 0

    def update(self, snapshot: DiscoveredHosts) -> HostChanges:
        """Adopt a complete snapshot; return what changed."""
        old_ready, old_draining = dict(self.ready), dict(self.draining)
        for host in list(snapshot.ready) + list(snapshot.draining):
            if host not in self._order:
                self._order[host] = self._seq
                self._seq += 1
        gone = [h for h in self._order if h not in snapshot.ready and h not in snapshot.draining]
        for host in gone:
            del self._order[host]
        self.ready = dict(snapshot.ready)
        self.draining = dict(snapshot.draining)
        self.instances = dict(snapshot.instances)
        return HostChanges(
            added=tuple(h for h in self.ready if h not in old_ready),
            removed=tuple(h for h in (set(old_ready) | set(old_draining)) if h not in self._order),
            draining=tuple(h for h in self.draining if h not in old_draining),
            resized=tuple(h for h in self.ready if h in old_ready and old_ready[h] != self.ready[h]),
        )

    def order_of(self, host: str) -> int:
        """Sort key of ``host``: lower for hosts seen earlier; unknown hosts last."""
        return self._order.get(host, 1 << 30)

    def is_usable(self, slot: Slot) -> bool:
        """Whether ``slot`` exists on a ready host (ignoring the blacklist)."""
        return slot.index < self.ready.get(slot.host, 0)

    def available_slots(self, now: float) -> list[Slot]:
        """Ready, not blacklisted slots, oldest host first, then by slot index."""
        slots = [
            Slot(host, i)
            for host in sorted(self.ready, key=self.order_of)
            for i in range(self.ready[host])
        ]
        return [s for s in slots if not self.blacklist.blocked(s, now)]
