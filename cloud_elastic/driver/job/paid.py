"""What a job with several host sources pays for at a moment: the figures its cost meter
(:class:`~cloud_elastic.cost.CostMeter`) integrates.

* **Workers**: each live worker's slot, at its host's last known price (a host gone from discovery keeps the
  price it had while its worker runs there).
* **Raised fallback hosts**: the hosts of a fallback group the job raised (``--manage-capacity``, the groups of
  :meth:`.sourcing.Sourcing.raised` whose raise was sent) are the job's: it asked for them. Of those listed
  ready, up to the desired capacity it asked for (its workers' hosts first, then the oldest), each slot no worker
  uses is paid too, at its host's price. A group keeps the hosts the start-up raise sized to the fewest Spot slots
  seen for as long as Spot stays short of ``-np`` (a group is not lowered while a worker runs on it), so left out
  they made the job's cost a fraction of the bill (review s62 rvS finding 2: $0.019 reported, $0.044 of
  on-demand hosts alone).

Not counted: instances still booting (not listed ready yet) and those the cloud shuts down once the job set
their group back to 0 (discovery no longer ties them to a raise of the job's); free slots of any group the job
did not raise (not the job's).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from cloud_elastic.driver.job.hosts import HostManager
from cloud_elastic.driver.job.workers import WorkerRecord

__all__ = ["Paid", "paid", "IdleWatch", "SAY_IDLE_S"]

log = logging.getLogger(__name__)

#: Raised hosts with slots no worker uses are named (a WARNING) once they have been so this long: a host listed
#: is idle for the moment it takes the job to launch its worker.
SAY_IDLE_S = 30.0


@dataclass(frozen=True)
class Paid:
    """``held``: source -> (slots paid, dollars per hour of them, slots of them without a price), the meter's
    input; ``idle``: raised fallback source -> its hosts with slots no worker uses (oldest first);
    ``idle_slots``: how many such slots ``held`` counts."""

    held: Mapping[str, tuple[int, float, int]]
    idle: Mapping[str, tuple[str, ...]]
    idle_slots: int


def paid(alive: Iterable[WorkerRecord], hosts: HostManager, known: Mapping[str, tuple[str, float | None]],
         raised: Mapping[str, int]) -> Paid:
    """What is paid now: the ``alive`` workers' slots, priced by ``known`` (host -> (source, price per slot-hour)),
    and the free slots of the ``raised`` groups' hosts (source -> the desired capacity the job asked for)."""
    held: dict[str, list] = {}

    def add(source: str, slots: int, price: float | None) -> None:
        entry = held.setdefault(source, [0, 0.0, 0])
        entry[0] += slots
        if price is None:
            entry[2] += slots
        else:
            entry[1] += price * slots

    on_host: Counter[str] = Counter()
    for w in alive:
        on_host[w.slot.host] += 1
        source, price = known.get(w.slot.host, ("", None))
        add(source, 1, price)
    idle: dict[str, tuple[str, ...]] = {}
    idle_slots = 0
    for source, asked in raised.items():
        # Hosts of the group its workers use that discovery does not list ready (missing) fill part of the ask too.
        unlisted = sum(1 for h in on_host if h not in hosts.ready and known.get(h, ("", None))[0] == source)
        group = sorted((h for h in hosts.ready if hosts.sources.get(h) == source),
                       key=lambda h: (h not in on_host, hosts.order_of(h)))[:max(0, asked - unlisted)]
        free = [(h, hosts.ready[h] - on_host[h]) for h in group if hosts.ready[h] > on_host[h]]
        for h, slots in free:
            add(source, slots, hosts.prices.get(h))
            idle_slots += slots
        if free:
            idle[source] = tuple(h for h, _ in free)
    return Paid({s: (n, rate, unpriced) for s, (n, rate, unpriced) in held.items()}, idle, idle_slots)


class IdleWatch:
    """Says, once per spell, which raised hosts have run no worker for :data:`SAY_IDLE_S`: one WARNING per group
    (they are paid for), and one INFO line once none of the group's is left."""

    def __init__(self) -> None:
        self.idle: Mapping[str, tuple[str, ...]] = {}  # as :attr:`Paid.idle` last said
        self._since: dict[str, float] = {}
        self._said: set[str] = set()

    def say(self, job_id: str, now: float) -> None:
        """Log what is due at ``now``."""
        for source in [s for s in self._since if s not in self.idle]:
            del self._since[source]
            if source in self._said:
                self._said.discard(source)
                log.info("job %s: the hosts of host source %r the job raised run workers again, or are no longer "
                         "the job's", job_id, source)
        for source, hosts in self.idle.items():
            since = self._since.setdefault(source, now)
            if source not in self._said and now - since >= SAY_IDLE_S:
                self._said.add(source)
                more = f" and {len(hosts) - 4} more" if len(hosts) > 4 else ""
                log.warning("job %s: --manage-capacity: %d host(s) of host source %r, which the job raised, have run "
                            "no worker on some or all of their slots for %gs (%s%s): they are paid for, and the job's "
                            "cost counts them, until the group is set back (the fallback is no longer wanted, or the "
                            "job ends)", job_id, len(hosts), source, SAY_IDLE_S, ", ".join(hosts[:4]), more)
