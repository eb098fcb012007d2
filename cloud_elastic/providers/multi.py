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
  (retryably), for up to :data:`UNHEARD_HOLD_S` (or ``stale_limit_s`` if shorter), a request to raise a fallback
  group is kept pending (one INFO line): the job starts on what answered, but a spot group throttled at its first
  call would otherwise look empty and the fallback's paid instances would be raised. The hold is well below the
  default ``--start-timeout`` and ``--elastic-timeout``, so a source down from the start does not hold the job back.
  Once it answers, the raise waits for the next find(): the job sees that answer first, and a 0 it asks then drops
  the raise unsent (a group whose raise was never sent gets no 0 either).
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
  failure, saying how to give the price by hand.
* :meth:`set_capacity` (``--manage-capacity``) goes to the named source, held within the group's MinSize..MaxSize
  where its provider reports them (:meth:`~.api.HostDiscovery.capacity_limits`): more than MaxSize asks MaxSize,
  with one WARNING, and :meth:`capacity_of` says MaxSize (the job asks the rest again once the group shows fewer
  hosts than it needs); less than MinSize asks MinSize. A raise is made only while the group's desired capacity as
  last read (``capacity_limits``' third value) is below it, or is the job's own raise it now lowers (one skipped so, the job having set none, is not set back
  to 0 either); a value asked again not while MaxSize holds it and the limits are unchanged, nor, where the desired
  capacity is unknown, more often than :data:`REASK_UNKNOWN_S` or while it shows more hosts than when last asked or
  last lowered. When the credentials may not change the group (AccessDenied), one WARNING says so and the source is
  left unmanaged for the rest of the job; other errors are retried at each later ``find()`` until a call succeeds or
  a newer value replaces it. :meth:`can_give` tells the job what each group can give (a
  :class:`~.sources.Room`: its MaxSize; what it has where unmanaged, refused :data:`REFUSALS_TO_SPILL` times in a
  row, or short of the hosts the job, or a predecessor it took over, set for :data:`SHORT_FOR_S`), so the next
  fallback is asked for the rest; the group's own value stays as asked. A 0 goes only to a group the job sent a
  raise (a call made, whatever its answer: one that timed out may have landed) or adopted one of (:meth:`adopt`: a
  crashed predecessor's raise), :meth:`owned`: a group whose raise was held back or skipped is an operator's, and is
  left as it is, mid-job, at the end, and by a driver restarted after a crash (not carried in the sign of life).
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

from cloud_elastic.errors import (CapacityDeniedError, CapacityError, DiscoveryError, FatalDiscoveryError,
                                  RetryableDiscoveryError)
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, cancel_find
from cloud_elastic.providers.sidecalls import Caller, SideCalls
from cloud_elastic.providers.sources import Room, SourceSpec

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
#: A value asked again reaches a group whose desired capacity the provider cannot read at most this often.
REASK_UNKNOWN_S = 300.0
#: At close, releases put off beside the job's last calls wait this long for them (no find() comes after).
RELEASE_AT_CLOSE_S = 10.0
#: A raise refused this many calls in a row (not AccessDenied) counts as one its group cannot give (:meth:`can_give`)
#: until a call to it succeeds; the refused value is tried again at each find() meanwhile.
REFUSALS_TO_SPILL = 3
#: A group that shows fewer hosts than the job set for this long counts as unable to give the rest (:meth:`can_give`):
#: AWS takes SetDesiredCapacity and then fails to launch (InsufficientInstanceCapacity, the usual case for GPUs). A
#: GPU instance normally shows within 1-3 minutes: a shorter wait would pay a second group for hosts still booting.
SHORT_FOR_S = 180.0

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
    return max(timeout_s, own) if math.isfinite(own) else timeout_s


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
    #: Host -> its slots when last reported ready (a draining host's price per slot divides by them).
    slots: dict[str, int] = field(default_factory=dict)
    #: The desired capacity still to be set (None: nothing pending) and whether the group may be managed.
    pending_capacity: int | None = None
    managed: bool = True
    capacity_set: int | None = None
    #: A raise skipped because the group was already higher while the job had set nothing: its 0 is not sent.
    left: bool = False
    #: What a crashed predecessor of the job had set (:meth:`MultiSourceDiscovery.adopt`); calls refused in a row
    #: since the last that succeeded; whether the job ever sent it a raise (only then, or adopted, is a 0 sent).
    adopted: int | None = None
    refusals: int = 0
    sent: bool = False
    #: Since when (the clock) it shows fewer hosts than the job last set; None: it shows them all.
    short_since: float | None = None
    #: Its group's capacity limits as the last good find() read them (:meth:`MultiSourceDiscovery.can_give`).
    limits: tuple | None = None
    above_max_warned: bool = False
    #: Whether any call of it has ended (only an error at its first call can be fatal to the job).
    called: bool = False
    #: Fallback sources told that a raise waits for this source's first answer (logged once each).
    held_back: set[str] = field(default_factory=set)
    #: Its find() on a thread of its own, when the call under way was asked (time.monotonic), and the releases
    #: held back while a call given up on runs (the provider takes one call at a time).
    caller: Caller = field(init=False)
    asked_at: float = 0.0
    releases: list[tuple[str, str | None]] = field(default_factory=list)
    #: The last value the cloud took, when (the clock), the (MinSize, MaxSize) read, the hosts shown then or at a drop.
    took: tuple[int | None, float, tuple | None, int] = (None, 0.0, None, 0)
    #: Its provider calls on other threads than its find()'s (set_capacity, release, hourly_prices).
    calls: SideCalls = field(default_factory=SideCalls)

    def __post_init__(self) -> None:
        self.caller = Caller(partial(_outcome, self.discovery.find), name=f"discovery-{self.spec.name}")

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every provider call under way, its find() included; whether none runs."""
        deadline = time.monotonic() + timeout_s
        return self.caller.wait_ended(timeout_s) and self.calls.wait_ended(deadline - time.monotonic())

    def shown(self) -> int:
        return 0 if self.last is None else len(self.last.ready) + len(self.last.draining)

    def owned(self) -> bool:
        """Whether the job set the group: a raise sent or taken over, not one held back or skipped."""
        return (self.sent or bool(self.adopted)) and not self.left


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
            shown = source.shown()
            source.last, source.failing_since, source.error = snapshot, None, ""
            if source.shown() < shown:  # lowered by its own scaling: a value asked again may raise it back
                source.took = (*source.took[:3], source.shown())
            present = set(snapshot.ready) | set(snapshot.draining)
            source.slots = {h: n for h, n in source.slots.items() if h in present}
            source.slots.update(snapshot.ready)
            try:  # read here, for can_give() on the driver's thread: a plugin's may not be a plain read
                source.limits = source.discovery.capacity_limits()
            except Exception:  # noqa: BLE001 (no bound known: the job asks as if it had none)
                source.limits = None
            own = source.capacity_set if source.capacity_set is not None else source.adopted  # a taken-over raise
            short = (own or 0) > source.shown()
            source.short_since = (source.short_since if source.short_since is not None else now) if short else None
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
            return snap.prices[host]
        hourly = source.hourly.get(host)
        if hourly is None:
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
        if not target.managed:
            return
        target.pending_capacity = hosts
        self._apply_capacity(target)

    def _apply_capacity(self, source: SourceState, *, held: bool = False) -> None:
        asked = source.pending_capacity
        if asked is None or not source.managed or source.caller.running or source.calls.count:
            return  # kept pending until its call under way has ended (one call at a time)
        if source.spec.fallback and asked > (source.capacity_set or 0) and (held or self._unheard(source)):
            return  # kept pending: asked again at every discovery (held: until the job saw the answer)
        limits = source.discovery.capacity_limits()
        hosts = self._within_limits(source, asked, limits)
        if not self._changes(source, asked, hosts, limits):
            source.pending_capacity = None
            return
        try:
            with source.calls.start(lambda: not source.caller.running, hosts) as started:
                if started:
                    source.sent = source.sent or hosts > 0
                    source.discovery.set_capacity(hosts, source=source.spec.name)
        except CapacityDeniedError as exc:
            source.managed = False
            source.pending_capacity = None
            log.warning("--manage-capacity: the job may not change host source %r (%s); it goes on without "
                        "managing the group: set its desired capacity yourself", source.spec.name, exc)
            return
        except CapacityError as exc:
            source.refusals += 1
            log.warning("--manage-capacity: could not set the desired capacity of host source %r to %d (%s); "
                        "retrying at the next discovery", source.spec.name, hosts, exc)
            return
        if not started:
            return  # another thread's call to it started first: kept pending
        source.pending_capacity, source.left, source.refusals = None, False, 0
        source.capacity_set = min(asked, hosts)  # held at MaxSize: that is what was set (held at MinSize: as asked)
        source.took = (hosts, self._clock(), limits and tuple(limits[:2]), source.shown())
        log.info("--manage-capacity: host source %r: desired capacity set to %d", source.spec.name, hosts)

    def _changes(self, source: SourceState, asked: int, hosts: int, limits: tuple | None) -> bool:
        """Whether ``hosts`` (``asked``, held within ``limits``) goes to the cloud: a raise never lowers a group,
        a value asked again goes only where it may change the group (module docstring)."""
        desired = limits[2] if limits is not None and len(limits) > 2 else None
        # Nothing to change, or a group raised beyond it by someone else (the job lowers its own raise itself).
        if asked > 0 and desired is not None and (desired == hosts or desired > hosts and desired != source.capacity_set):
            source.left = source.left or not (source.capacity_set or source.adopted)  # not the job's: kept
            if desired == hosts and source.adopted and source.capacity_set is None:
                source.capacity_set = min(asked, hosts)  # a group taken over at the job's value: its own (SHORT_FOR_S)
            return False
        took, took_at, took_limits, took_shown = source.took
        if asked == 0 and not source.owned():
            return False  # the job's value is not the group's (held back, skipped): an operator's, left as it is
        if hosts != took or asked == 0 or desired is not None:
            return True
        if hosts < asked:  # MaxSize holds it: again only once the limits read have changed
            return (limits and tuple(limits[:2])) != took_limits
        return self._clock() - took_at >= REASK_UNKNOWN_S and source.shown() <= took_shown

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

    def _within_limits(self, source: SourceState, hosts: int, limits: tuple | None) -> int:
        """``hosts`` held within the group's MinSize..MaxSize (the cloud refuses a value outside them)."""
        if limits is None:
            return hosts
        low, high = limits[:2]
        if hosts > high:
            if not source.above_max_warned:
                source.above_max_warned = True
                log.warning("--manage-capacity: the job wants %d host(s) of host source %r, but its group's maximum "
                            "size is %d: it is set to %d (raise the group's maximum to give the job more)", hosts,
                            source.spec.name, high, high)
            return high
        source.above_max_warned = False
        return max(hosts, low)

    def capacity_of(self, source: str) -> int | None:
        """The desired capacity this job last had set on ``source``'s group: as the job asked it, or the
        group's MaxSize where it held the request there (0 where MinSize held a lowering above it); None: none
        set, or not a source."""
        state = self._by_name.get(source)
        if state is not None and (setting := state.calls.setting) is not None:  # a call under way may still set it
            return max(setting, state.capacity_set or 0)
        return None if state is None else state.adopted if state.capacity_set is None else state.capacity_set

    def adopt(self, source: str, hosts: int) -> None:
        """``source``'s group was set to ``hosts`` by a crashed predecessor of the job: the job lowers it as its
        own (a raise it skips there, the group being as high already, does not make it an operator's)."""
        state = self._by_name.get(source)
        if state is not None:
            state.adopted = hosts

    def owned(self, source: str) -> bool:
        """Whether the job set ``source``'s group: a raise sent (a call under way or made, whatever its answer) or
        taken over (:meth:`adopt`), not one held back or skipped; only such a group gets a 0, from this driver or,
        carried in its sign of life, from the one restarted after a crash."""
        state = self._by_name.get(source)
        return state is not None and state.owned()

    def can_give(self, source: str) -> Room | None:
        """What ``source``'s group can give the job now (None: not a source): the most it is asked (its MaxSize as
        last read), and where it cannot give all of it, what it counts for: what it has where the job may not change
        it (AccessDenied) or its raise was refused :data:`REFUSALS_TO_SPILL` times in a row, what it shows where it
        has shown fewer hosts than the job set for :data:`SHORT_FOR_S`. The job asks the next group for the rest."""
        state = self._by_name.get(source)
        if state is None:
            return None
        limits = state.limits
        has = limits[2] if limits is not None and len(limits) > 2 else state.shown()
        counts = [has] if not state.managed or state.refusals >= REFUSALS_TO_SPILL else []
        if state.short_since is not None and self._clock() - state.short_since >= SHORT_FOR_S:
            counts.append(state.shown())
        return Room(None if limits is None else limits[1], min(counts, default=None), state.managed)

    def wait_for(self, source: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every call to ``source`` under way, if any, to end (its find(), or its
        set_capacity() on the discovery thread: its group may be set then, whatever the other sources' calls
        do); whether they ended."""
        state = self._by_name.get(source)
        return state is None or state.wait_ended(timeout_s)

    def managed(self, source: str) -> bool:
        """Whether the driver still manages ``source``'s group (False after AccessDenied)."""
        state = self._by_name.get(source)
        return state is not None and state.managed

    # ----------------------------------------------------------- the others
    def release(self, host: str, instance: str | None) -> None:
        owner = self._owner(host)
        if owner is not None:
            with owner.calls.start(lambda: not owner.caller.busy) as started:
                if started:
                    owner.discovery.release(host, instance)
            if not started:  # another call to it runs (its find() given up on): released once it has ended
                owner.releases.append((host, instance))

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
