"""Several host sources as one :class:`~.api.HostDiscovery`: merged snapshots, prices, capacity.

:class:`MultiSourceDiscovery` asks every source's ``find()`` at once, each on a
thread of its own (a :class:`Caller`), and merges the snapshots; each host is tagged with
its source's name (``DiscoveredHosts.sources``) and, where known, its price per
slot-hour (``DiscoveredHosts.prices``).

Guarantees, beyond :class:`~.api.HostDiscovery`'s:

* **A failing source does not stop the others.** Its last good snapshot is kept (its hosts keep their workers, as
  when a job's one source fails today) for up to ``stale_limit_s``; after that its hosts are left out, so the
  driver's ``--host-missing-grace`` applies to them. One WARNING when a source starts failing, one INFO when it
  recovers. ``find()`` raises only when every source failed and none has a snapshot left to report.
* **A hanging source does not hold the others up.** Each source's call is waited for ``--discovery-timeout`` at most
  (:func:`call_limit_s`); past it the source counts as failing, as above, named in the message. Its call runs on: no
  other starts beside it (its releases and capacity changes wait for its end), and its late answer is used.
* **No fallback raised on a partial first answer.** While a non-fallback source that has never answered fails
  (retryably), for up to :data:`UNHEARD_HOLD_S` (or ``stale_limit_s`` if shorter; well below the default
  ``--start-timeout``), a raise of a fallback group is kept pending (one INFO line): a spot group throttled at its
  first call would look empty. Once it answers, the raise waits for the next find(): the job sees that answer
  first, and a 0 it asks then drops the raise unsent.
* A source that fails *fatally on its first call* (no such group, no credentials) fails the job, naming the source:
  a typo must not run a job on fewer groups than the user meant. A fatal error at any later call (even when the
  earlier ones failed retryably: ExpiredToken after an hour) is a failure of that source only, as above.
* A host reported by two sources (two groups that share a subnet) counts for the first one given; one WARNING.
* Prices: a source's ``price`` (per slot-hour) for each of its hosts; else the provider's
  :meth:`~.api.HostDiscovery.hourly_prices` (per instance-hour, AWS spot prices, refreshed every
  ``price_refresh_s``) divided by the host's slots. A draining host is no longer reported with its slots: it is
  divided by the slots it had when last ready (else those of its source's other hosts; else its price is unknown,
  never its whole instance price per slot). A price look-up that fails (AccessDenied, throttling) is tried again
  after ``PRICE_RETRY_S``, doubling up to ``price_refresh_s``, not at every ``find()``; one WARNING per kind of
  failure, saying how to give the price by hand. A price the provider gives that is no number of dollars from 0
  to ``sources.MAX_PRICE`` an hour (NaN, negative, 1e300) leaves that host unpriced, as an unknown price, with
  one WARNING per host: it must not fail the merged snapshot, and with it every source's hosts.
* :meth:`set_capacity` (``--manage-capacity``) goes to the source's group as its :class:`~.group_capacity.GroupCapacity`
  decides (:meth:`capacity_of`, :meth:`can_give`). AccessDenied: one WARNING, the group is left unmanaged for the
  rest of the job; other errors are retried at each later ``find()`` until a call succeeds or a newer value replaces it.
  A call its provider proves the cloud refused (``capacity_refused``: no attempt landed) is not the job's (taken back
  out of the sign of life, :meth:`on_raise`); one it cannot prove refused may have landed and stays the job's.
* **One provider call per source at a time**, whichever thread makes it: :meth:`wait_for` waits for any of them
  (find, set_capacity, release, hourly_prices) to end. The one exception: a find() does not wait for a call that
  another thread (the driver's, at the job's end) began; its answer is then one read just before or after that
  call, not a wrong one (a DesiredCapacity read before a raise landed only has the raise sent again).
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Mapping, Sequence

from cloud_elastic.config import MAX_DURATION_S
from cloud_elastic.errors import (CapacityDeniedError, CapacityError, DiscoveryError, FatalDiscoveryError,
                                  RetryableDiscoveryError)
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, cancel_find, lets_go
from cloud_elastic.providers.group_capacity import REASK_UNKNOWN_S, REFUSALS_TO_SPILL, SHORT_FOR_S, GroupCapacity, Room
from cloud_elastic.providers.sidecalls import Caller, SideCalls
from cloud_elastic.providers.sources import MAX_PRICE, SourceSpec

__all__ = ["MultiSourceDiscovery", "SourceState", "Caller", "call_limit_s", "check_job_flags", "PRICE_RETRY_S",
           "MERGE_MARGIN_S", "UNHEARD_HOLD_S", "REASK_UNKNOWN_S", "REFUSALS_TO_SPILL", "SHORT_FOR_S"]

log = logging.getLogger(__name__)

#: A failed price look-up is tried again after this long, then twice as long each time, up to the refresh interval.
PRICE_RETRY_S = 30.0
#: The merged call is waited for this much longer than its slowest source (the poller's limit never fires first).
MERGE_MARGIN_S = 5.0
#: A fallback raise waits at most this long for a source that has never answered (three calls at the default
#: --discovery-timeout; well below the default --start-timeout and --elastic-timeout, 600 s).
UNHEARD_HOLD_S = 90.0
#: At close, releases put off beside the job's last calls wait this long for them (no find() comes after).
RELEASE_AT_CLOSE_S = 10.0

def call_limit_s(discovery: HostDiscovery, timeout_s: float) -> float:
    """How long one find() of ``discovery`` is waited for under ``--discovery-timeout`` ``timeout_s``: never less,
    longer where the provider bounds its calls itself and says so (``find_limit_s(timeout_s)``: the script provider
    kills its script at its own ``timeout_s``; a multi-source provider waits for each source this long)."""
    find_limit_s = getattr(discovery, "find_limit_s", None)
    if find_limit_s is None:
        return timeout_s
    try:
        own = float(find_limit_s(timeout_s))
    except Exception as exc:  # a plugin's: its bug must not stop the job from discovering
        log.warning("discovery provider %s: find_limit_s(%g) failed (%s): using --discovery-timeout",
                    type(discovery).__name__, timeout_s, exc)
        return timeout_s
    # At most a year, as every duration: a plugin's 1e12 overflowed the driver's wait for the call
    return max(timeout_s, min(own, MAX_DURATION_S)) if math.isfinite(own) else timeout_s


def _outcome(find: Callable[[], DiscoveredHosts]) -> DiscoveredHosts | Exception:
    try:
        return find()
    except Exception as exc:  # handed to the waiting find(), which counts it against this source only
        return exc


@dataclass
class SourceState:
    """One source and what its edge remembers: the last good snapshot, failures, prices, capacity."""

    spec: SourceSpec
    discovery: HostDiscovery
    last: DiscoveredHosts | None = None
    failing_since: float | None = None
    error: str = ""
    #: host -> dollars per instance-hour from the provider, and when they were read.
    hourly: Mapping[str, float] = field(default_factory=dict)
    priced_at: float = float("-inf")
    #: After a failed look-up: when to try again, the wait before the one after, the kinds already warned of.
    price_retry_at: float | None = None
    price_backoff_s: float = 0.0
    price_warned: set[str] = field(default_factory=set)
    #: Hosts the provider gave a price that is no price (:func:`_a_price`), already warned of.
    unpriced: set[str] = field(default_factory=set)
    #: Host -> its slots when last reported ready (a draining host's price per slot divides by them).
    slots: dict[str, int] = field(default_factory=dict)
    #: Whether any call of it has ended (only an error at its first call can be fatal to the job).
    called: bool = False
    #: Fallback sources told that a raise waits for this source's first answer (logged once each).
    held_back: set[str] = field(default_factory=set)
    #: Its find() on a thread of its own, when the call under way was asked (time.monotonic), and the releases
    #: held back while a call given up on runs (the provider takes one call at a time).
    caller: Caller = field(init=False)
    asked_at: float = 0.0
    releases: list[tuple[str, str | None]] = field(default_factory=list)
    #: Its provider calls on other threads than its find()'s (set_capacity, release, hourly_prices).
    calls: SideCalls = field(default_factory=SideCalls)
    #: Its group's capacity as --manage-capacity sets it: what to send, who set it, what it can give.
    group: GroupCapacity = field(init=False)

    def __post_init__(self) -> None:
        self.caller = Caller(partial(_outcome, self.discovery.find), name=f"discovery-{self.spec.name}")
        self.group = GroupCapacity(self.spec.name)

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every provider call under way, its find() included; whether none runs."""
        deadline = time.monotonic() + timeout_s
        return self.caller.wait_ended(timeout_s) and self.calls.wait_ended(deadline - time.monotonic())

    def shown(self) -> int:
        return 0 if self.last is None else len(self.last.ready) + len(self.last.draining)


class MultiSourceDiscovery(HostDiscovery):
    """Merged discovery over named sources (see module docstring)."""

    name = "multi"
    description = "several host sources in one job (repeat --aws-asg, --gcp-mig...; see docs/multi-source.md)"

    def __init__(self, sources: Sequence[tuple[SourceSpec, HostDiscovery]], *, stale_limit_s: float = 600.0,
                 price_refresh_s: float = 300.0, call_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not sources:
            raise ValueError("MultiSourceDiscovery needs at least one source")
        self.sources = [SourceState(spec, discovery) for spec, discovery in sources]
        self._by_name = {s.spec.name: s for s in self.sources}
        if len(self._by_name) != len(self.sources):
            raise ValueError("source names must be unique")
        self.stale_limit_s = stale_limit_s
        self.price_refresh_s = price_refresh_s
        #: Each source's call is waited for this long at most (:func:`call_limit_s`); the poller sets it.
        self.call_timeout_s = call_timeout_s
        self._clock = clock
        self._doubled: set[str] = set()  # hosts already warned about (reported by two sources)
        self._put_off: set[str] = set()  # hosts whose last release() was put off (see releases())
        self._on_raise: Callable[[str, int], object] | None = None  # see on_raise()
        self._on_undo: Callable[[str, int], object] | None = None
        clouds = self.provider_names()
        # Reads like its provider when every source is of one cloud (the notice watcher follows it).
        self.name = clouds[0] if len(clouds) == 1 else "multi"  # type: ignore[misc]

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "HostDiscovery":
        raise FatalDiscoveryError("the 'multi' source is built from the command line (repeat the group flags)")

    @property
    def can_set_capacity(self) -> bool:  # type: ignore[override]
        return any(s.discovery.can_set_capacity for s in self.sources)

    @property
    def specs(self) -> tuple[SourceSpec, ...]:
        """The sources, in the order given."""
        return tuple(s.spec for s in self.sources)

    def provider_names(self) -> tuple[str, ...]:
        """The providers of the sources (for the notice watcher), in order, without repeats."""
        return tuple(dict.fromkeys(getattr(s.discovery, "name", "") for s in self.sources))

    def find_limit_s(self, timeout_s: float) -> float:
        """Wait for each source's call up to ``timeout_s`` (``--discovery-timeout``; longer for a source that
        bounds its own calls); returns how long a whole find() may then take: its slowest source, and a margin."""
        self.call_timeout_s = timeout_s
        return max(call_limit_s(s.discovery, timeout_s) for s in self.sources) + MERGE_MARGIN_S

    # ------------------------------------------------------------------ find
    def find(self) -> DiscoveredHosts:
        now, heard_now = self._clock(), False  # heard_now: a source that failed from the start answers at last
        fatal: list[str] = []
        for source in self.sources:  # all asked at once: a source that hangs holds none of the others up
            if not source.caller.busy:
                self._release_held(source)
                source.asked_at = time.monotonic()
                source.caller.ask()
        for source in self.sources:
            limit = call_limit_s(source.discovery, self.call_timeout_s)
            snapshot = source.caller.answer(source.asked_at + limit - time.monotonic())
            if snapshot is None:
                self._failed(source, RetryableDiscoveryError(
                    f"no answer within {limit:g}s (--discovery-timeout {self.call_timeout_s:g}s); no other call to "
                    "it starts until that one ends"), now, fatal)
                continue
            if isinstance(snapshot, Exception):
                if not isinstance(snapshot, DiscoveryError):  # a provider bug: a failure of this source only
                    log.error("host source %r raised an unexpected error", source.spec.name, exc_info=snapshot)
                    snapshot = RetryableDiscoveryError(f"{type(snapshot).__name__}: {snapshot}")
                self._failed(source, snapshot, now, fatal)
                source.called = True
                continue
            source.called, failed = True, source.failing_since is not None
            heard_now = heard_now or (not source.spec.fallback and source.last is None and failed)
            if source.failing_since is not None:
                log.info("host source %r answers again (it failed for %.0fs)", source.spec.name,
                         now - source.failing_since)
            source.last, source.failing_since, source.error = snapshot, None, ""
            present = set(snapshot.ready) | set(snapshot.draining)
            source.slots = {h: n for h, n in source.slots.items() if h in present}
            source.slots.update(snapshot.ready)
            try:  # read here, for can_give() on the driver's thread: a plugin's may not be a plain read
                limits = source.discovery.capacity_limits()
            except Exception:  # noqa: BLE001 (no bound known: the job asks as if it had none)
                limits = None
            source.group.seen(now, source.shown(), limits)
            self._refresh_prices(source, snapshot, now)
        for source in self.sources:  # once every answer is in: a fallback's raise sees what the others answered
            self._apply_capacity(source, held=heard_now)
        if fatal:
            raise FatalDiscoveryError("; ".join(fatal))
        usable = [s for s in self.sources if s.last is not None and
                  (s.failing_since is None or now - s.failing_since <= self.stale_limit_s)]
        if not usable:
            raise RetryableDiscoveryError("every host source failed: " +
                                          "; ".join(f"{s.spec.name}: {s.error}" for s in self.sources))
        return self._merge(usable)

    def _failed(self, source: SourceState, exc: DiscoveryError, now: float, fatal: list[str]) -> None:
        message = f"host source {source.spec.name!r}: {exc}"
        if isinstance(exc, FatalDiscoveryError) and not source.called:
            fatal.append(message)
            return
        if source.failing_since is None:
            source.failing_since = now
            kept = "its hosts are kept as last seen" if source.last is not None else "it has no hosts yet"
            log.warning("%s; the other sources go on, %s (for up to %gs)", message, kept, self.stale_limit_s)
        elif source.last is not None and now - source.failing_since > self.stale_limit_s >= 0 and \
                source.error != "stale":
            log.warning("host source %r has failed for %.0fs; its hosts are no longer reported", source.spec.name,
                        now - source.failing_since)
            message = "stale"
        source.error = message if message == "stale" else str(exc)

    def _merge(self, usable: list[SourceState]) -> DiscoveredHosts:
        ready: dict[str, int] = {}
        draining: dict = {}
        instances: dict[str, str] = {}
        soft: dict[str, str] = {}
        sources: dict[str, str] = {}
        prices: dict[str, float] = {}
        for source in usable:
            snap = source.last
            assert snap is not None
            for host in (*snap.ready, *snap.draining):
                if host in sources:
                    if host not in self._doubled:
                        self._doubled.add(host)
                        log.warning("host %s is reported by sources %r and %r; it counts for %r", host,
                                    sources[host], source.spec.name, sources[host])
                    continue
                sources[host] = source.spec.name
                if host in snap.ready:
                    ready[host] = snap.ready[host]
                else:
                    draining[host] = snap.draining[host]
                if host in snap.instances:
                    instances[host] = snap.instances[host]
                if host in snap.soft:
                    soft[host] = snap.soft[host]
                price = self._price(source, snap, host)
                if price is not None:
                    prices[host] = price
        return DiscoveredHosts(ready=ready, draining=draining, instances=instances, soft=soft, sources=sources,
                               prices=prices)

    # ---------------------------------------------------------------- prices
    def _price(self, source: SourceState, snap: DiscoveredHosts, host: str) -> float | None:
        if source.spec.price is not None:
            return source.spec.price
        if host in snap.prices:
            return snap.prices[host] if _a_price(snap.prices[host]) else None
        hourly = source.hourly.get(host)
        if hourly is None or not _a_price(hourly):
            return None
        # A draining host's slots are no longer reported: those it had, else its group's (its hosts are alike).
        slots = snap.ready.get(host) or source.slots.get(host) or max(source.slots.values(), default=0)
        return hourly / slots if slots else None

    def _refresh_prices(self, source: SourceState, snapshot: DiscoveredHosts, now: float) -> None:
        if source.spec.price is not None:
            return
        if source.price_retry_at is not None:
            if now < source.price_retry_at:
                return  # the last look-up failed: not again at every find()
        else:
            unknown = (set(snapshot.ready) | set(snapshot.draining)) - set(source.hourly)
            if now - source.priced_at < self.price_refresh_s and not unknown:
                return
        try:
            with source.calls.start(lambda: not source.caller.busy) as started:
                hourly = source.discovery.hourly_prices(snapshot) if started else None
        except DiscoveryError as exc:
            source.price_backoff_s = min(max(2 * source.price_backoff_s, PRICE_RETRY_S), self.price_refresh_s)
            source.price_retry_at = now + source.price_backoff_s
            kind = _failure_kind(exc)
            if kind not in source.price_warned:
                source.price_warned.add(kind)
                log.warning("host source %r: could not read prices (the cost shown leaves its hosts out; tried "
                            "again after %gs, then less often): %s; to give the price by hand: --source %s:price=D "
                            "(dollars per slot-hour)", source.spec.name, source.price_backoff_s, exc, source.spec.name)
            return
        if hourly is None:
            return  # another thread's call to it runs (one at a time): read at the next find()
        source.priced_at, source.hourly = now, dict(hourly)
        wrong = {host: price for host, price in source.hourly.items() if not _a_price(price)}
        fresh = sorted(set(wrong) - source.unpriced)
        if fresh:  # kept in ``hourly`` (as known, so not looked up again at every find), read as no price
            log.warning("host source %r: its provider gave %d host(s) a price that is no price (%s): their cost is "
                        "left out, as an unknown price; to give the price by hand: --source %s:price=D (dollars per "
                        "slot-hour)", source.spec.name, len(fresh), ", ".join(f"{h} {wrong[h]!r}" for h in fresh[:3])
                        + (", ..." if len(fresh) > 3 else ""), source.spec.name)
        source.unpriced = set(wrong)
        if source.price_retry_at is not None:
            log.info("host source %r: prices read again", source.spec.name)
        source.price_retry_at, source.price_backoff_s = None, 0.0
        source.price_warned.clear()

    # -------------------------------------------------------------- capacity
    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        """Set the desired capacity of ``source``'s group (see module docstring); never raises for the cloud."""
        target = self._by_name.get(source or "")
        if target is None:
            log.warning("--manage-capacity: no host source named %r", source)
            return
        target.group.ask(hosts)
        self._apply_capacity(target)

    def _apply_capacity(self, source: SourceState, *, held: bool = False) -> None:
        group = source.group
        if group.asked is None or source.caller.running or source.calls.count:
            return  # kept pending until its call under way has ended (one call at a time)
        if source.spec.fallback and group.asked > (group.value or 0) and (held or self._unheard(source)):
            return  # kept pending: asked again at every discovery (held: until the job saw the answer)
        limits = source.discovery.capacity_limits()
        asked, hosts = group.asked, group.decide(self._clock(), limits)
        if asked is None or hosts is None:  # nothing to send (it would not change the group)
            return
        try:
            with source.calls.start(lambda: not source.caller.running) as started:
                if started:
                    group.started(hosts)  # the job's from here on: the sign of life says so before it is sent
                    if hosts > 0 and self._on_raise is not None:
                        self._before_raise(source.spec.name, hosts)
                    try:
                        source.discovery.set_capacity(hosts, source=source.spec.name)
                    finally:  # ended, whatever its outcome: capacity_of no longer counts it as under way
                        group.sending = None
        except CapacityDeniedError as exc:
            group.denied(proven=self._proven_refused(source, exc))
            self._undo_raise(source, hosts)
            log.warning("--manage-capacity: the job may not change host source %r (%s); it goes on without "
                        "managing the group: set its desired capacity yourself", source.spec.name, exc)
            return
        except CapacityError as exc:
            group.refused(proven=self._proven_refused(source, exc))
            self._undo_raise(source, hosts)
            log.warning("--manage-capacity: could not set the desired capacity of host source %r to %d (%s); "
                        "retrying at the next discovery", source.spec.name, hosts, exc)
            return
        if started:  # else another thread's call to it started first: kept pending
            group.taken(asked, hosts, self._clock(), limits)
            log.info("--manage-capacity: host source %r: desired capacity set to %d", source.spec.name, hosts)

    def on_raise(self, callback: Callable[[str, int], object] | None,
                 undo: Callable[[str, int], object] | None = None) -> None:
        """Call ``callback(source, hosts)`` before each call that sets a group to ``hosts`` > 0, on the thread that
        makes it, which waits for it (the driver records the raise in its sign of life first: a driver killed during
        the call leaves the group to the one restarted for the job); ``undo(source, hosts)`` once its provider
        proves the cloud refused that call, no attempt of it landed (``HostDiscovery.capacity_refused``), on a group
        the job had not set before it (the record is taken back; one the job had set stays the job's). A callback
        that raises is logged; the call goes on."""
        self._on_raise, self._on_undo = callback, undo

    def _proven_refused(self, source: SourceState, exc: CapacityError) -> bool:
        """Whether ``source``'s provider proves the cloud refused the call (no attempt landed). A provider that
        cannot tell, or fails to: no."""
        try:
            proven = getattr(source.discovery, "capacity_refused", None)
            return proven is not None and proven(exc) is True
        except Exception:  # noqa: BLE001 (a plugin's bug: the raise stays the job's, the cost-safe side)
            log.debug("host source %r: capacity_refused failed", source.spec.name, exc_info=True)
            return False

    def _undo_raise(self, source: SourceState, hosts: int) -> None:
        """A failed raise to ``hosts`` that left the group not the job's (only one proven refused can: its owner
        before it, not the job, is again: GroupCapacity.refused) is taken back out of the sign of life. Called once
        the owner is set back: a driver tick before it would put the group back in as the job's."""
        if hosts <= 0 or source.group.owned or self._on_undo is None:
            return
        try:
            self._on_undo(source.spec.name, hosts)
        except Exception:  # noqa: BLE001 (the record stays: a successor sets the group back, the safe side)
            log.warning("--manage-capacity: host source %r: the refused raise to %d is still recorded",
                        source.spec.name, hosts, exc_info=True)

    def _before_raise(self, name: str, hosts: int) -> None:
        try:
            self._on_raise(name, hosts)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 (the raise is still wanted; only its record beside the checkpoints is late)
            log.warning("--manage-capacity: host source %r: the raise to %d could not be recorded before it was sent",
                        name, hosts, exc_info=True)

    def _unheard(self, fallback: SourceState) -> bool:
        """Whether a non-fallback source that has never answered is still failing within the stale limit (a
        fallback raised now would be paid for what may be a throttled first call); logs it once per source."""
        now, hold_s = self._clock(), min(self.stale_limit_s, UNHEARD_HOLD_S)
        unheard = [s for s in self.sources if not s.spec.fallback and s.last is None and s.failing_since is not None
                   and now - s.failing_since <= hold_s]
        for s in unheard:
            if fallback.spec.name not in s.held_back:
                s.held_back.add(fallback.spec.name)
                log.info("--manage-capacity: not raising host source %r while host source %r has not answered yet "
                         "(%s); for up to %gs", fallback.spec.name, s.spec.name, s.error, hold_s)
        return bool(unheard)

    def capacity_of(self, source: str) -> int | None:
        """The desired capacity this job last had set on ``source``'s group (or MaxSize where it held it there; a
        call under way may still set it; 0 where MinSize held a lowering); None: none set, or not a source."""
        state = self._by_name.get(source)
        return None if state is None else state.group.capacity_of()

    def adopt(self, source: str, hosts: int) -> None:
        """``source``'s group was set to ``hosts`` by a crashed predecessor of the job: the job's own to lower."""
        if source in self._by_name:
            self._by_name[source].group.adopt(hosts)

    def can_give(self, source: str) -> Room | None:
        """What ``source``'s group can give the job now (None: not a source), as its
        :meth:`.group_capacity.GroupCapacity.room` says: the job asks the next group for the rest."""
        state = self._by_name.get(source)
        return None if state is None else state.group.room(self._clock())

    def wait_for(self, source: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every call to ``source`` under way, if any, to end (its find(), or its
        set_capacity() on the discovery thread: its group may be set then, whatever the other sources' calls
        do); whether they ended."""
        state = self._by_name.get(source)
        return state is None or state.wait_ended(timeout_s)

    # ----------------------------------------------------------- the others
    def release(self, host: str, instance: str | None) -> None:
        owner = self._owner(host)
        if owner is not None and lets_go(owner.discovery, host):  # a script's or a -H list's: nothing to let go
            with owner.calls.start(lambda: not owner.caller.busy) as started:
                if started:
                    self._put_off.discard(host)
                    owner.discovery.release(host, instance)
            if not started:  # another call to it runs (its find() given up on): released once it has ended
                self._put_off.add(host)
                owner.releases.append((host, instance))

    def releases(self, host: str) -> bool:
        """Whether ``host``'s source lets it go, and :meth:`release` did now: one put off (its source busy with a
        call given up on) is said by :meth:`_release_held` when it is made, not by the poller as well (the line
        came twice, the first before anything was let go)."""
        owner = self._owner(host)
        return owner is not None and host not in self._put_off and lets_go(owner.discovery, host)

    def _release_held(self, source: SourceState) -> None:
        while source.releases:
            host, instance = source.releases[0]
            try:
                with source.calls.start(lambda: True) as started:
                    if not started:
                        return  # another thread's call to it runs: at the next find()
                    source.releases.pop(0)
                    source.discovery.release(host, instance)
                log.info("released drained host %s%s to the cloud", host, f" ({instance})" if instance else "")
            except Exception as exc:  # the instance then waits out the cloud's own timeout; the job goes on
                log.warning("could not release drained host %s: %s", host, exc)

    def wake_on_news(self, wake: Callable[[], None]) -> None:
        for source in self.sources:
            try:
                source.discovery.wake_on_news(wake)
            except Exception:  # that source is polled at the interval only; the others keep their receivers
                log.exception("host source %r could not set up its news receiver", source.spec.name)

    def cancel_find(self) -> None:
        for source in self.sources:
            cancel_find(source.discovery)

    def close(self) -> None:
        for source in self.sources:
            if source.releases and source.calls.wait_ended(RELEASE_AT_CLOSE_S) and not source.caller.busy:
                self._release_held(source)  # put off beside the job's last calls: no find() comes after
            for host, _ in source.releases:
                log.warning("could not release drained host %s to the cloud as the job ended: a call to host source "
                            "%r still ran; it waits out the cloud's own timeout", host, source.spec.name)
            source.caller.close()
            try:
                source.discovery.close()
            except Exception:  # closing is best effort
                log.debug("host source %r: close failed", source.spec.name, exc_info=True)

    def _owner(self, host: str) -> SourceState | None:
        for source in self.sources:
            if source.last is not None and (host in source.last.ready or host in source.last.draining):
                return source
        return None


def _failure_kind(exc: Exception) -> str:
    """The kind of a cloud error (its code, such as ``UnauthorizedOperation`` or ``Throttling``), else its type."""
    code = re.search(r"\(([A-Za-z.]+)\)", str(exc))
    return code.group(1) if code else type(exc).__name__


def check_job_flags(discovery: HostDiscovery, *, manage_capacity: bool, fallback_after_s: float | None) -> None:
    """ConfigError for ``--manage-capacity`` / ``--fallback-after`` on a job that cannot use them (before it starts)."""
    from cloud_elastic.errors import ConfigError

    specs = discovery.specs if isinstance(discovery, MultiSourceDiscovery) else ()
    fallbacks = [s for s in specs if s.fallback]
    for flag, given in (("--manage-capacity", manage_capacity), ("--fallback-after", fallback_after_s is not None)):
        if given and not fallbacks:
            raise ConfigError(f"{flag} needs a fallback host source: mark one with --source NAME:fallback")
    states = discovery.sources if isinstance(discovery, MultiSourceDiscovery) else []
    if manage_capacity:
        for source in states:
            if source.spec.fallback and not source.discovery.can_set_capacity:
                raise ConfigError(f"--manage-capacity: host source {source.spec.name!r} ({source.spec.provider}) "
                                  "cannot set a group's desired capacity (AWS, GCP and Azure groups can)")


def _a_price(value: object) -> bool:
    """Whether a provider's price is a number of dollars an hour the cost can count: 0 to ``MAX_PRICE``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_PRICE
