"""Hosts and slots the driver knows about: ordering, draining and the blacklist.

Pure logic: no threads, no I/O. Time and randomness are passed in, so every
rule here is tested alone with a fake clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Collection, Hashable

from cloud_elastic.driver.job.repeats import REPEATS, Streak
from cloud_elastic.notices.api import MAX_NOTICE_LEAD_S, NOTICE_GRACE_S, SOFT_NOTICE_TTL_S, renewed
from cloud_elastic.providers.api import MAX_HOSTS, DiscoveredHosts, Drain

__all__ = ["Slot", "Blacklist", "HostChanges", "HostManager", "Keep", "MAX_MISSING", "blocked_for", "blocked_s",
           "some_hosts"]

#: Of the hosts missing past the grace, those to keep as missing a while longer (the job decides; see
#: :meth:`HostManager.expire`).
Keep = Callable[[tuple[str, ...]], Collection[str]]


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

    A slot blocked *for good* stays blocked for the rest of the job (for this instance
    of its host: only another instance at the address, :meth:`forget_host`, starts clean;
    the same host leaving discovery and coming back stays blocked): a worker that failed
    there of its own doing (:func:`.repeats.own_failure`: :meth:`record_failure` with
    ``at_commit``) :data:`.repeats.REPEATS` times in a row without progress, or under a range of
    ``(0, 0)`` a worker that failed there at all (``failed``: its own doing, killed from
    outside, given up), as Horovod blacklists a failed host by default. Other failures (a
    host out of reach) and other blocks (stragglers, drains, early returns, cut-off hosts)
    take the usual cooldown, and none under ``(0, 0)``.
    """

    def __init__(self, cooldown_range_s: tuple[float, float], rng: random.Random | None = None) -> None:
        self.lo, self.hi = cooldown_range_s
        self._rng = rng or random.Random()
        self._failures: dict[Slot, int] = {}
        self._until: dict[Slot, float] = {}  # math.inf: for good
        self._repeats: dict[Slot, Streak] = {}  # how far the job had trained when its workers failed, in a row

    def record_failure(self, slot: Slot, now: float, at_commit: Hashable | None = None, *,
                       failed: bool = False) -> float:
        """Count a failure of ``slot``; return how many seconds it is now blocked for (``math.inf``: for good).

        ``at_commit``: a worker failed there of its own doing with the job that far (:meth:`.repeats.Trained.at`:
        the states its commits held, or the highest commit the job had reached): the :data:`.repeats.REPEATS`-th
        such failure in a row at the same point blocks the slot for good. A failure without one (killed from outside, a host out of reach) neither counts toward that nor
        breaks the run. ``failed``: a worker failed there (however: its own doing, killed from outside, given
        up), which under a range of ``(0, 0)`` blocks the slot for good, as Horovod does. A slot blocked for good
        stays so.
        """
        count = self._failures.get(slot, 0) + 1
        self._failures[slot] = count
        if self.for_good(slot):
            return math.inf
        if at_commit is not None:
            again = self._repeats.setdefault(slot, Streak()).note(at_commit)
            if again >= REPEATS:
                self._until[slot] = math.inf
                return math.inf
        if self.hi <= 0 and (failed or at_commit is not None):
            self._until[slot] = math.inf
            return math.inf
        if self.hi <= 0:
            return 0.0
        base = min(self.hi, self.lo * (2 ** (count - 1)))
        delay = min(self.hi, base * (1.0 + 0.1 * self._rng.random()))
        self._until[slot] = now + delay
        return delay

    def retry_soon(self, slot: Slot, now: float) -> float:
        """Block ``slot`` for the shortest cooldown (``lo`` plus the jitter), counting no failure; return the delay.

        For a host not reachable yet (still booting): it is no worse for being tried again, and a count
        raised at every try would both space the tries past the time it answers and make its first real
        failure, later, cost the longest cooldowns. For a slot drained by hand: nothing failed there.
        """
        if self.for_good(slot):
            return math.inf
        # At least a second, even with --blacklist-cooldown-range 0 0: a host that refuses at once would
        # otherwise be relaunched in a tight loop.
        delay = max(1.0, min(self.hi, self.lo * (1.0 + 0.1 * self._rng.random())))
        self._until[slot] = now + delay
        return delay

    def forget_host(self, host: str, *, keep_for_good: bool = False) -> None:
        """Forget every failure of ``host``'s slots: another instance now holds the address, or (``keep_for_good``)
        the host left discovery: a slot blocked for good then stays so, as the host listed there again under the
        same identity is the same machine (a flapping host whose script fails would otherwise loop for ever);
        only another instance at the address starts clean."""
        for slot in [s for s in self._failures if s.host == host]:
            if keep_for_good and self.for_good(slot):
                continue
            del self._failures[slot]
            self._until.pop(slot, None)
            self._repeats.pop(slot, None)

    def hosts(self) -> set[str]:
        """Every host with a slot this blacklist knows: failures counted, cooling down or blocked for good."""
        return {s.host for s in self._failures} | {s.host for s in self._until}

    def failures(self, slot: Slot) -> int:
        """How many times ``slot`` has failed."""
        return self._failures.get(slot, 0)

    def blocked_slots(self, now: float) -> list[tuple[Slot, float, int]]:
        """(slot, seconds left, failures) of every slot still cooling down at ``now`` (not those blocked for good:
        see :meth:`for_good_slots`)."""
        return sorted((s, until - now, self._failures.get(s, 0)) for s, until in self._until.items()
                      if now < until < math.inf)

    def for_good(self, slot: Slot) -> bool:
        """Whether ``slot`` is blocked for the rest of the job."""
        return self._until.get(slot) == math.inf

    def for_good_slots(self) -> list[tuple[Slot, int]]:
        """(slot, failures) of every slot blocked for the rest of the job."""
        return sorted((s, self._failures.get(s, 0)) for s, until in self._until.items() if until == math.inf)

    def blocked(self, slot: Slot, now: float) -> bool:
        """Whether ``slot`` is still cooling down at ``now``."""
        return self._until.get(slot, float("-inf")) > now


def blocked_for(delay: float) -> str:
    """How long a block of ``delay`` seconds (:meth:`Blacklist.record_failure`) lasts, in words for the log."""
    return "for the rest of the job" if delay == math.inf else f"for {delay:.0f}s"


def blocked_s(delay: float) -> dict[str, float]:
    """An event's ``blacklisted_s`` for a block of ``delay`` seconds: none for a block for the rest of the job
    (JSON has no infinity: a slot already blocked for good, blocked again as a straggler or by a drain)."""
    return {} if delay == math.inf else {"blacklisted_s": round(delay, 1)}


def some_hosts(hosts: Collection[str], limit: int = 8) -> str:
    """``hosts`` for a log line: the first ``limit`` names, then how many more (a job may list 16,384 hosts, and
    discovery that names new ones at every poll made lines of megabytes)."""
    names = list(hosts)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


#: Hosts kept as missing from discovery at most, besides those that matter (see :meth:`HostManager.update`): as
#: many as one snapshot may list, so a snapshot that lost every host forgets none of them, while discovery naming
#: new hosts at every poll (a script listing replacements, a list API paging inconsistently) piled up 114,000 in
#: the default 10 s grace, and without bound under a longer one.
MAX_MISSING = MAX_HOSTS


#: How much longer the notice of a host given back lasts while the same instance is listed (see HostManager).
GIVEN_BACK_GRACE_S = 600.0



@dataclass(frozen=True)
class HostChanges:
    """What one discovery snapshot changed."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    resized: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # newly missing from discovery, kept for the grace
    dropped: tuple[str, ...] = ()  # of ``removed``: missing hosts forgotten within the grace, past ``max_missing``
    lapsed: tuple[str, ...] = ()  # hosts whose notice lapsed (see HostManager); a hard one's host is also added

    def __bool__(self) -> bool:
        """Whether the set of hosts changed (a lapsed soft notice alone changes only where workers may go)."""
        return bool(self.added or self.removed or self.draining or self.resized or self.missing)


@dataclass
class HostManager:
    """The current view of the group, in the order hosts were first seen.

    Older hosts sort first, so their workers keep the lower ranks. A host that
    leaves and later returns counts as new: its blacklisting is forgotten, but a
    block for the rest of the job only when it returns as another instance (its
    instance id changed: :meth:`Blacklist.forget_host`).

    Cloud list APIs are eventually consistent and discovery scripts glitch, so a
    ready host that vanishes from a snapshot *without* a draining state is kept
    as ``missing`` for ``missing_grace_s``: its running workers stay, nothing new
    is launched on it, and only when it is still missing after the grace does it
    count as removed, unless the caller's ``keep`` holds it longer (the job keeps the last
    holders of its state; see :mod:`.discovery_edge`). A draining state acts at once, and so does
    the loss of a host that was already draining (the cloud took it).

    At most ``max_missing`` hosts (:data:`MAX_MISSING`) are kept missing, besides those that matter: a host where
    the caller's workers are (``in_use``), one whose slots the blacklist knows (failures counted, cooling down,
    blocked for good) and one with a soft notice; hosts with a hard notice or an operator's drain are draining,
    not missing. Past it the hosts missing longest are forgotten first (the newest among those missing since the
    same snapshot), as if their grace had run out: they count as ``removed`` (and ``dropped``). Such a host listed
    again is new (added, and last in the order), as after its grace; it had no worker and no blacklisting to lose.

    A hard notice lapses (:meth:`_lapse`) when the host is still reported ready
    ``notice_grace_s`` past its deadline: the cloud did not take it. A host
    :meth:`given_back` to the cloud, while discovery lists the same instance there,
    waits :data:`GIVEN_BACK_GRACE_S` longer (a Kubernetes pod whose SIGTERM drained
    it may be listed ready until it is gone, its sshd ended with its workers), but
    not for good: a VM whose guest rebooted (systemd's SIGTERM reached the worker)
    comes back as the same instance, and must take workers again.

    A maintenance notice (:func:`~cloud_elastic.notices.api.renewed`) its host's metadata watcher reports again
    (GCP re-sends ``TERMINATE_ON_HOST_MAINTENANCE`` while it lasts; a watcher on a worker placed there after a
    lapse reports it anew) is still pending: once the host's workers have left (:meth:`given_back`), taking
    their watcher with them, it does not lapse while the host stays listed, up to :data:`MAX_NOTICE_LEAD_S`
    (the longest notice GCE gives) past its latest report, with or without an instance id; without that, a
    static host under an hour's maintenance took a worker and drained it again every few minutes. Only the
    same watcher's report counts as a re-send while the notice lasts (the host's next watcher, taking over
    from a worker that left, reports it anew), and other notices (Spot, preemption, Azure) never do. Another
    instance at the address starts afresh: the notice it inherits lapses as usual.

    An operator's drain (:meth:`hold`, ``cloud-elastic drain JOB HOST``) is a decision, not a forecast: it never
    lapses, and lasts until the host leaves discovery (a cloud's notice for the same host still lapses as above,
    quietly: the host stays drained).
    """

    blacklist: Blacklist
    missing_grace_s: float = 0.0
    ready: dict[str, int] = field(default_factory=dict)
    draining: dict[str, Drain] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # host -> cloud instance id, where known
    missing: dict[str, tuple[int, float]] = field(default_factory=dict)  # host -> (slots it had, missing since)
    #: Hosts a notice (metadata watcher, notice queue) says are leaving, until they leave discovery.
    notices: dict[str, Drain] = field(default_factory=dict)
    #: Hosts an operator drained (:meth:`hold`): no new workers there until they leave discovery.
    held: dict[str, Drain] = field(default_factory=dict)
    #: Hosts with a soft notice (rebalance recommendation, maintenance): no new workers there.
    soft: dict[str, str] = field(default_factory=dict)
    #: Soft notices the provider itself reports (``DiscoveredHosts.soft``), as of the last snapshot.
    provider_soft: dict[str, str] = field(default_factory=dict)
    notice_grace_s: float = NOTICE_GRACE_S
    soft_notice_ttl_s: float = SOFT_NOTICE_TTL_S
    #: ``--drain-on-rebalance``: soft notices (the provider's too) drain their hosts like hard ones.
    drain_soft: bool = False
    _notice_until: dict[str, float] = field(default_factory=dict)  # host -> when its hard notice may lapse
    _soft_until: dict[str, float] = field(default_factory=dict)  # host -> when its soft notice lapses
    _given_back: dict[str, str] = field(default_factory=dict)  # host -> the instance released for its hard notice
    #: Host -> (source, reason, watcher) of every maintenance report for it, until it leaves discovery (or
    #: another instance holds the address): the same watcher's again, or any after a lapse, is a re-send.
    _heard: dict[str, set[tuple[str, str, str | None]]] = field(default_factory=dict)
    _resent: set[str] = field(default_factory=set)  # hosts whose hard notice a watcher re-sent
    _reported_at: dict[str, float] = field(default_factory=dict)  # host -> its hard notice's latest report
    _pending: set[str] = field(default_factory=set)  # hosts given back while their watcher still re-sent it
    _order: dict[str, int] = field(default_factory=dict)
    _seq: int = 0
    #: The last instance seen at each address, kept after the host is forgotten (addresses are reused).
    _last_instance: dict[str, str] = field(default_factory=dict)
    #: Host -> the name of its source and its price per slot-hour, as discovery last said (several sources).
    sources: dict[str, str] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)
    #: Hosts missing past the grace that the caller's ``keep`` holds (see :meth:`expire`): leaving hosts for
    #: placement (:meth:`stays`), though their workers train on.
    kept: frozenset[str] = frozenset()
    #: Raised by every call that may change which slots are usable (update, notices, expiry), so a
    #: caller can skip re-checking its workers' hosts while it stays the same.
    version: int = 0
    #: Hosts kept missing at most, besides those that matter (see the class docstring).
    max_missing: int = MAX_MISSING
    #: Host -> its slots as last seen ready or missing, until it is forgotten: a draining host leaves ``ready``, and
    #: discovery gives it no count, though its workers still train there (:meth:`slots_of`).
    _slots_seen: dict[str, int] = field(default_factory=dict)

    def update(self, snapshot: DiscoveredHosts, now: float = 0.0, keep: Keep | None = None,
               in_use: Collection[str] = ()) -> HostChanges:
        """Adopt a complete snapshot; return what changed (``keep``: see :meth:`expire`; ``in_use``: the hosts where
        the caller has workers, never forgotten for ``max_missing``)."""
        self.version += 1
        old_ready, old_draining, was_missing = dict(self.ready), dict(self.draining), set(self.missing)
        present = set(snapshot.ready) | set(snapshot.draining)
        for host in list(snapshot.ready) + list(snapshot.draining):
            if host not in self._order:
                self._order[host] = self._seq
                self._seq += 1
        for host in present:
            self.missing.pop(host, None)
        if self.missing_grace_s > 0:
            for host, slots in old_ready.items():
                if host not in present:
                    self.missing.setdefault(host, (slots, now))
        dropped = self._drop_missing(in_use) if len(self.missing) > self.max_missing else ()
        self.ready = dict(snapshot.ready)
        self.draining = dict(snapshot.draining)
        self._slots_seen.update(self.ready)
        for host, instance in snapshot.instances.items():
            if self._last_instance.setdefault(host, instance) != instance:
                # A recycled IP, a recreated or restarted pod: the new instance inherits no blacklisting.
                self._last_instance[host] = instance
                self.blacklist.forget_host(host)
                self._given_back.pop(host, None)
                self._heard.pop(host, None)  # its notice now lapses as usual, whatever the old one's watcher re-sent
                if host not in self.ready:
                    self._slots_seen.pop(host, None)  # the old instance's count is not the new one's
                self._forget_resends(host)
        self.instances.update(snapshot.instances)
        self.sources.update(snapshot.sources)  # a missing host keeps its source and price until it is forgotten
        self.prices.update(snapshot.prices)
        for host in present:
            if host not in snapshot.prices:
                self.prices.pop(host, None)
        self.provider_soft = dict(snapshot.soft)
        if self.drain_soft:
            for host, reason in snapshot.soft.items():
                if self.ready.pop(host, None) is not None:
                    self.draining[host] = Drain(None, reason)
        for host in list(self.notices):
            if host not in present and host not in self.missing:
                self._drop_notice(host)
        for host in list(self.soft):
            if host not in present and host not in self.missing:
                self._drop_soft(host)
        for host in [h for h in self.held if h not in present and h not in self.missing]:
            del self.held[host]
        lapsed = self._lapse(snapshot, now)
        self._apply_notices()
        removed = self._forget_absent(present, now, keep)
        return HostChanges(
            added=tuple(h for h in self.ready if h not in old_ready and h not in was_missing),
            removed=removed,
            draining=tuple(h for h in self.draining if h not in old_draining),
            resized=tuple(h for h in self.ready if h in old_ready and old_ready[h] != self.ready[h]),
            missing=tuple(h for h in self.missing if h in old_ready),
            lapsed=lapsed,
            dropped=dropped,
        )

    def _drop_missing(self, in_use: Collection[str]) -> tuple[str, ...]:
        """Forget missing hosts beyond ``max_missing`` that do not matter, longest missing first (see the class
        docstring); return them."""
        matter = set(in_use) | self.blacklist.hosts() | set(self.soft) | self.kept
        free = [h for h in self.missing if h not in matter]
        free.sort(key=lambda h: (self.missing[h][1], -self._order.get(h, 0)))
        dropped = free[:len(self.missing) - self.max_missing]
        for host in dropped:
            del self.missing[host]
        return tuple(dropped)

    def _lapse(self, snapshot: DiscoveredHosts, now: float) -> tuple[str, ...]:
        """Drop hard notices past their grace for hosts the snapshot reports ready, and soft ones past their TTL.

        Later for a host given back whose instance discovery still lists, or given back while its watcher still
        re-sent the notice (see the class docstring).
        """
        hard = [h for h in self.notices if h in snapshot.ready and now >= self._lapses_at(h, now)]
        soft = [h for h in self.soft if now >= self._soft_until.get(h, now)]
        for host in hard:
            self._drop_notice(host)
        for host in soft:
            self._drop_soft(host)
        # A held host stays drained: its cloud notice went, but nothing changed for the job.
        return tuple(h for h in dict.fromkeys(hard + soft) if h not in self.held)

    def _lapses_at(self, host: str, now: float) -> float:
        until = self._notice_until.get(host, now)
        if self._given_back.get(host, "") == self.instances.get(host):
            until += GIVEN_BACK_GRACE_S
        if host in self._pending:  # still reported when its watcher left with the host's workers
            until = max(until, self._reported_at.get(host, now) + MAX_NOTICE_LEAD_S + self.notice_grace_s)
        return until

    def notice_lapses_in(self, host: str, now: float) -> float | None:
        """Seconds until ``host``'s hard notice may lapse (if discovery still reports it ready then), or None when
        it has none."""
        return max(0.0, self._lapses_at(host, now) - now) if host in self.notices else None

    def _drop_notice(self, host: str) -> None:
        del self.notices[host]
        self._notice_until.pop(host, None)
        self._given_back.pop(host, None)
        self._forget_resends(host)

    def _forget_resends(self, host: str) -> None:
        """Whatever made ``host``'s notice still pending (see the class docstring) is gone with it."""
        self._resent.discard(host)
        self._pending.discard(host)
        self._reported_at.pop(host, None)

    def given_back(self, host: str) -> None:
        """``host``, drained for a hard notice, was released to the cloud: while discovery lists the same instance
        there, its notice lapses :data:`GIVEN_BACK_GRACE_S` later than usual. A host without an instance id lapses
        as before (a static list or a script cannot tell it from a successor at the same address), unless its
        watcher was still re-sending the notice: that one stays pending (see the class docstring)."""
        instance = self.instances.get(host)
        if host in self.notices and instance:
            self._given_back[host] = instance
        if host in self.notices and host in self._resent:
            self._pending.add(host)

    def _drop_soft(self, host: str) -> None:
        del self.soft[host]
        self._soft_until.pop(host, None)

    def notice(self, host: str, drain: Drain, now: float = 0.0, wall_now: float | None = None,
               source: str | None = None, watcher: str | None = None) -> bool:
        """A notice says ``host`` is leaving; True if that is news (the host is known and was not draining).

        ``now`` is the manager's clock; ``wall_now`` the Unix time at that moment
        (deadlines are Unix times; None: the two clocks agree). The notice lasts
        until the host leaves discovery, or lapses (see the class docstring).
        ``source``: who reported it, and ``watcher``: the worker whose metadata watcher
        did (None: a caller that does not tell them apart); a maintenance report this
        watcher sent before for the notice, or any heard before it lapsed, is a re-send
        of a notice still pending.
        """
        known = host in self.ready or host in self.draining or host in self.missing
        if not known:
            return False
        self.version += 1
        if source is not None and renewed(source, drain.reason):
            heard = self._heard.setdefault(host, set())
            if (source, drain.reason, watcher) in heard or (
                    host not in self.notices and any(h[:2] == (source, drain.reason) for h in heard)):
                self._resent.add(host)
            heard.add((source, drain.reason, watcher))
        self._reported_at[host] = now
        news = host not in self.draining
        old = self.notices.get(host)
        if old is None or (drain.deadline is not None and (old.deadline is None or drain.deadline < old.deadline)):
            self.notices[host] = drain
        wall = now if wall_now is None else wall_now
        # A deadline far ahead is a garbled time (a Spot notice for the year 9999), not a notice for ever.
        lead = 0.0 if drain.deadline is None else min(max(0.0, drain.deadline - wall), MAX_NOTICE_LEAD_S)
        until = now + lead + self.notice_grace_s
        self._notice_until[host] = max(until, self._notice_until.get(host, until))
        self._apply_notices()
        return news

    def hold(self, host: str, drain: Drain) -> bool:
        """An operator drains ``host`` (``cloud-elastic drain``): no new worker is placed there until it leaves
        discovery; it never lapses. True if that is news (the host is known and was not draining)."""
        known = host in self.ready or host in self.draining or host in self.missing
        if not known:
            return False
        self.version += 1
        news = host not in self.draining
        self.held.setdefault(host, drain)
        self._apply_notices()
        return news

    def soft_notice(self, host: str, reason: str, now: float = 0.0) -> bool:
        """A soft notice (rebalance, maintenance): no new worker is placed on ``host`` until it lapses. True if news.

        The caller turns soft notices into hard ones (:meth:`notice`) under ``drain_soft``.
        """
        news = host not in self.soft
        self.version += 1
        self.soft[host] = reason
        self._soft_until[host] = now + self.soft_notice_ttl_s
        return news

    def _apply_notices(self) -> None:
        for host, drain in [*self.held.items(), *self.notices.items()]:
            if host in self.ready:
                del self.ready[host]
                self.draining[host] = drain
            elif host in self.draining:
                known = self.draining[host]
                if known.deadline is None or (drain.deadline is not None and drain.deadline < known.deadline):
                    self.draining[host] = Drain(deadline=drain.deadline, reason=drain.reason)
            elif host in self.missing:
                del self.missing[host]
                self.draining[host] = drain

    def expire(self, now: float, keep: Keep | None = None) -> tuple[str, ...]:
        """Remove hosts missing for longer than the grace; return them (call on every tick).

        ``keep(hosts)``, given the hosts past the grace, names those that stay missing (:attr:`kept`: their
        slots usable by the workers already there, who hold no place: see :meth:`stays`) until a later call
        lets them go or discovery lists them again.
        """
        present = set(self.ready) | set(self.draining)
        missing, kept = len(self.missing), self.kept
        gone = self._forget_absent(present, now, keep)
        if gone or len(self.missing) != missing or self.kept != kept:
            self.version += 1
        return gone

    def _forget_absent(self, present: set[str], now: float, keep: Keep | None) -> tuple[str, ...]:
        expired = tuple(h for h, (_, since) in self.missing.items() if now - since >= self.missing_grace_s)
        kept = keep(expired) if keep is not None and expired else ()
        for host in expired:
            if host not in kept:
                del self.missing[host]
        self.kept = frozenset(h for h in expired if h in kept)
        gone = [h for h in self._order if h not in present and h not in self.missing]
        for host in gone:
            del self._order[host]
            self._heard.pop(host, None)
            self.blacklist.forget_host(host, keep_for_good=True)
            self.instances.pop(host, None)
            self._slots_seen.pop(host, None)
            self.sources.pop(host, None)
            self.prices.pop(host, None)
        if len(self._last_instance) > len(self._order) + self.max_missing:
            # Instances of forgotten addresses matter only to a blacklisting there: discovery naming new hosts at
            # every poll would grow this without bound (the oldest addresses go first).
            known = self.blacklist.hosts()
            old = [h for h in self._last_instance if h not in self._order and h not in known]
            for host in old[:len(self._last_instance) - len(self._order) - self.max_missing]:
                del self._last_instance[host]
        return tuple(gone)

    def slots_of(self, host: str) -> int | None:
        """``host``'s slots: as discovery lists them while it is ready, as last seen ready while it is missing or
        draining; None for a host never seen ready (listed draining from the first)."""
        if host in self.ready:
            return self.ready[host]
        if host in self.missing:
            return self.missing[host][0]
        return self._slots_seen.get(host)

    def order_of(self, host: str) -> int:
        """Sort key of ``host``: lower for hosts seen earlier; unknown hosts last."""
        return self._order.get(host, 1 << 30)

    def is_usable(self, slot: Slot) -> bool:
        """Whether ``slot`` exists on a ready (or briefly missing) host, ignoring the blacklist."""
        if slot.host in self.missing:
            return slot.index < self.missing[slot.host][0]
        return slot.index < self.ready.get(slot.host, 0)

    def stays(self, slot: Slot) -> bool:
        """Whether a worker on ``slot`` holds its place: a usable slot, not on a host :attr:`kept` past the grace
        (its workers train on, but leave once others hold the state: a new worker is placed in their stead)."""
        return slot.host not in self.kept and self.is_usable(slot)

    def available_slots(self, now: float) -> list[Slot]:
        """Ready, not blacklisted slots, oldest host first, then by slot index.

        Never on a host that is missing from discovery or has a soft notice.
        """
        slots = [
            Slot(host, i)
            for host in sorted(self.ready, key=self.order_of)
            if host not in self.soft and host not in self.provider_soft
            for i in range(self.ready[host])
        ]
        return [s for s in slots if not self.blacklist.blocked(s, now)]
