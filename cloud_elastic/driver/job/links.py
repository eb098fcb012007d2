"""Slow links: the host whose network is slow, named from pairwise probes (issue 42, part 3).

The straggler rule (:mod:`.health`) sees compute time only. A host whose NIC is
degraded computes at the usual speed but makes every peer wait in collectives;
in a ring allreduce every rank then waits about as long, so per-rank collective
time cannot name it. Pairwise measurements can: every link of the slow host is
slow, and the links between the other hosts are not.

**Measurements.** Every worker runs a small probe (``worker.link.link_probe``)
and reports its port with its heartbeats. :class:`LinkWatch` orders one worker at
a time (never two at once, so probes do not share the wire with each other) to
measure its links to :data:`PEERS_PER_PROBE` peers on other hosts, the next
hosts in name order after its own (a ring, so each host is in two pairs or
more). It orders

* a newcomer as soon as its port is known, unless a worker of its host has
  probed already (usually while it waits for admission; one found slow before
  it is admitted is sent away unadmitted);
* a sweep of every host (one worker of each) every :data:`SWEEP_EVERY_S`, and
  sooner, at most every :data:`HIGH_COMM_SWEEP_S`, when the round's median share
  of time in collectives rises: to :data:`HIGH_COMM_SHARE` or more, or to
  :data:`RISE_FACTOR` times its value at the last sweep (and at least
  :data:`RISE_MIN_SHARE`);
* a worker of a suspect host again, to confirm (below).

A probe costs its two ends at most 4 MiB each way, or about a quarter of a
second, whichever comes first, on a side connection: nothing runs per step, and
the round's process group is not touched.

**The rule** (:func:`slow_host`, pure): keep the newest figure per host pair. A
host is slow when it was measured with at least two different peers and even its
fastest link is at least ``factor`` times slower than the median of the pairs it
is not part of. One slow pair (a bad cable between two hosts) names nobody: each
of its hosts has a fast pair elsewhere. Hosts of unequal but healthy NICs are
not named either, since the median of the other pairs is as slow. When several
hosts qualify the slowest, relative to its reference, is named (ties: by name).

**Worth it?** As for a straggler, the host is drained only if the job would
do more work per second without it (:func:`faster_without_host`): a step of
``compute + comm`` becomes at best ``compute + comm x ratio`` (the slow link's
share of the time in collectives gone), for fewer workers.

**Noise.** One low figure (a host descheduled during its probe) does not drain
anyone: a host named for the first time becomes a *suspect* and one of its
workers probes again; it is named only when the rule still names it once that
probe's figures are in (:meth:`LinkWatch.verdict`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping

from cloud_elastic.protocol import LinkReport, ProbeOrder

__all__ = ["SlowHost", "slow_host", "faster_without_host", "LinkWatch", "LINK_FACTOR", "SWEEP_EVERY_S", "HIGH_COMM_SHARE"]

#: A host whose fastest link is this many times slower than the other pairs' median is slow.
LINK_FACTOR = 4.0
#: Peers each probe measures.
PEERS_PER_PROBE = 2
#: Every host's links are measured again this often (running seconds).
SWEEP_EVERY_S = 600.0
#: A round whose members' median share of time in collectives is at least this is swept sooner,
HIGH_COMM_SHARE = 0.5
#: and so is one whose share grew this many times since the last sweep, to at least RISE_MIN_SHARE,
RISE_FACTOR = 2.0
RISE_MIN_SHARE = 0.2
#: but not more often than this.
HIGH_COMM_SWEEP_S = 60.0
#: A probe not answered within this is forgotten (its worker may be gone or busy forming a round).
ORDER_TIMEOUT_S = 30.0
#: Figures older than this are not used (hosts change; a link may have healed).
STALE_S = 3 * SWEEP_EVERY_S


@dataclass(frozen=True)
class SlowHost:
    """A host named by :func:`slow_host`: its fastest measured link, the reference it was held to, its peers."""

    host: str
    #: Its fastest measured link (MB/s).
    mb_s: float
    #: The median of the pairs it is not part of (MB/s).
    peers_mb_s: float
    #: The peer hosts it was measured with.
    peers: tuple[str, ...]


def slow_host(pairs: Mapping[tuple[str, str], float], factor: float = LINK_FACTOR) -> SlowHost | None:
    """The host whose links are all slow, from one figure (MB/s) per host pair; None when none stands out.

    See the module docstring for the rule. Pure: same figures, same answer.
    """
    if factor <= 1:
        return None
    found: list[SlowHost] = []
    for host in sorted({h for pair in pairs for h in pair}):
        inner = {(b if a == host else a): mb for (a, b), mb in pairs.items() if host in (a, b)}
        outer = [mb for (a, b), mb in pairs.items() if host not in (a, b)]
        if len(inner) < 2 or not outer:
            continue
        fastest, reference = max(inner.values()), statistics.median(outer)
        if fastest * factor <= reference:
            found.append(SlowHost(host, fastest, reference, tuple(sorted(inner))))
    # The worst relative to its reference; a tie goes to the first by name (found is in name order).
    return min(found, key=lambda s: s.mb_s / s.peers_mb_s) if found else None


def faster_without_host(workers: int, leaving: int, compute_s: float, comm_s: float, ratio: float) -> bool:
    """Would ``workers - leaving`` workers do more work per second than ``workers``, once the slow host's links
    no longer hold the collectives up? Times per step (the round's medians); ``ratio``: its links' speed over
    the others' (:attr:`SlowHost.mb_s` / :attr:`SlowHost.peers_mb_s`), so the collectives would take
    ``comm_s x ratio`` at best without it."""
    step = compute_s + comm_s
    staying = workers - leaving
    if staying <= 0 or step <= 0:
        return False
    return staying / (compute_s + comm_s * ratio) > workers / step


@dataclass
class _Order:
    worker: str
    host: str
    order: ProbeOrder
    asked_at: float


class LinkWatch:
    """When which worker probes which peers, what they measured, and which host is slow (see module docstring).

    Pure: fed by heartbeats (:meth:`heard`) and a periodic :meth:`plan`, all with
    the job's running time; it decides, the caller drains.
    """

    def __init__(self, factor: float = LINK_FACTOR, sweep_every_s: float = SWEEP_EVERY_S) -> None:
        self.factor = factor
        self.sweep_every_s = sweep_every_s
        self._ports: dict[str, tuple[str, int]] = {}  # worker id -> (host, probe port)
        self._probed: set[str] = set()  # workers that have been asked once (newcomers are asked first)
        self._queue: deque[str] = deque()
        self._order: _Order | None = None
        self._seq = 0
        self._pairs: dict[tuple[str, str], tuple[float, float]] = {}  # (host, host) sorted -> (MB/s, running time)
        self._next_sweep: float | None = None
        self._last_sweep = float("-inf")
        self._share_at_sweep: float | None = None  # the comm share the last sweep was made at (or first seen)
        self._suspect: tuple[str, int] | None = None  # host, and the last order before it was suspected
        self._answered: dict[str, int] = {}  # host -> the last order whose figures touch it

    # ------------------------------------------------------------ heartbeats
    def heard(self, worker: str, host: str, report: LinkReport | None, running: float) -> ProbeOrder | None:
        """A heartbeat of ``worker`` on ``host``: note its port and figures; the probe it is to run, if any."""
        if report is not None and report.port:
            self._ports[worker] = (host, report.port)
        order = self._order
        if order is None or order.worker != worker:
            return None
        if report is not None and report.probed == order.order.seq:
            self._record(order, report, running)
            self._order = None
            self._ask_next(running)  # the next one now, not at the next scan
            return None
        return order.order

    def _record(self, order: _Order, report: LinkReport, running: float) -> None:
        for peer, mb_s in report.mb_s:
            known = self._ports.get(peer)
            if known is None or known[0] == order.host or mb_s <= 0:
                continue
            pair = (min(order.host, known[0]), max(order.host, known[0]))
            self._pairs[pair] = (mb_s, running)
            for h in pair:
                self._answered[h] = order.order.seq

    # -------------------------------------------------------------- schedule
    def plan(self, present: Iterable[tuple[str, str]], running: float, comm_share: float | None = None) -> None:
        """Decide the next probe. ``present``: (worker id, host) of the workers that may probe or be probed
        (staying workers, newcomers included); ``comm_share``: the round's median share of time in collectives."""
        here = dict(present)
        for wid in [w for w in self._ports if w not in here]:
            del self._ports[wid]
        self._probed &= set(here)
        if self._order is not None and (self._order.worker not in here
                                        or running - self._order.asked_at > ORDER_TIMEOUT_S):
            self._order = None
        covered = {self._ports[wid][0] for wid in [*self._probed, *self._queue] if wid in self._ports}
        for wid in sorted(self._ports):
            if wid in self._probed or wid in self._queue:
                continue
            if self._ports[wid][0] in covered:
                self._probed.add(wid)  # its host's links are (to be) measured by another slot's worker
            else:
                covered.add(self._ports[wid][0])
                self._queue.append(wid)  # a newcomer (or the job's first workers)
        if self._next_sweep is None:
            self._next_sweep = running + self.sweep_every_s
        if comm_share is not None and self._share_at_sweep is None:
            self._share_at_sweep = comm_share
        risen = comm_share is not None and (
            comm_share >= HIGH_COMM_SHARE
            or comm_share >= max(RISE_MIN_SHARE, RISE_FACTOR * (self._share_at_sweep or 0.0)))
        if running >= self._next_sweep or (risen and running - self._last_sweep >= HIGH_COMM_SWEEP_S):
            self._sweep(running, comm_share)
        if self._order is None:
            self._ask_next(running)

    def _sweep(self, running: float, comm_share: float | None) -> None:
        self._last_sweep, self._next_sweep = running, running + self.sweep_every_s
        if comm_share is not None:
            self._share_at_sweep = comm_share
        for wid in self._one_per_host().values():
            if wid not in self._queue:
                self._queue.append(wid)

    def _one_per_host(self) -> dict[str, str]:
        hosts: dict[str, str] = {}
        for wid in sorted(self._ports):
            hosts.setdefault(self._ports[wid][0], wid)
        return hosts

    def _ask_next(self, running: float) -> None:
        while self._queue:
            wid = self._queue[0]
            if wid not in self._ports:
                self._queue.popleft()
                continue
            host = self._ports[wid][0]
            others = self._one_per_host()
            others.pop(host, None)
            if not others:
                return  # nobody to measure against yet: it waits in the queue
            ring = sorted(others, key=lambda h: (h <= host, h))  # the hosts after its own, then from the start
            peers = tuple(f"{others[h]}@{h}:{self._ports[others[h]][1]}" for h in ring[:PEERS_PER_PROBE])
            self._queue.popleft()
            self._probed.add(wid)
            self._seq += 1
            self._order = _Order(wid, host, ProbeOrder(self._seq, peers), running)
            return

    # --------------------------------------------------------------- verdict
    def figures(self, running: float) -> dict[tuple[str, str], float]:
        """The newest figure of every host pair whose two hosts are still here, not older than :data:`STALE_S`."""
        hosts = {h for h, _ in self._ports.values()}
        return {pair: mb for pair, (mb, at) in self._pairs.items()
                if pair[0] in hosts and pair[1] in hosts and running - at <= STALE_S}

    def verdict(self, running: float) -> SlowHost | None:
        """A slow host, once a probe run after it was first named still names it (then its figures are forgotten,
        so that it is named once); None otherwise."""
        found = slow_host(self.figures(running), self.factor)
        if found is None:
            self._suspect = None
            return None
        if self._suspect is None or self._suspect[0] != found.host:
            self._suspect = (found.host, self._seq)
            self._confirm(found.host)
            return None
        if self._answered.get(found.host, 0) <= self._suspect[1]:
            return None  # the confirming figures are not in yet
        self._suspect = None
        self._pairs = {pair: v for pair, v in self._pairs.items() if found.host not in pair}
        return found

    def _confirm(self, host: str) -> None:
        wid = self._one_per_host().get(host)
        if wid is not None:
            if wid in self._queue:
                self._queue.remove(wid)
            self._queue.appendleft(wid)
