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
  other starts beside it (its releases and capacity changes wait for its end), and its late answer is used. So do
  its price reads and capacity changes, on a thread of their own (:meth:`_side`): waited for up to the source's
  limit, a price read only in the find() that began it (its last prices kept until it answers).
* **No fallback raised on a partial first answer.** While a non-fallback source that has never answered fails
  (retryably), for up to :data:`UNHEARD_HOLD_S` (or ``stale_limit_s`` if shorter; well below the default
  ``--start-timeout``), a raise of a fallback group is kept pending (one INFO line): a spot group throttled at its
  first call would look empty. Once it answers, the raise waits for the next find(): the job sees that answer
  first, and a 0 it asks then drops the raise unsent.
* A source that fails *fatally on its first call* (no such group, no credentials) fails the job, naming the source:
  a typo must not run a job on fewer groups than the user meant. A fatal error at any later call (even when the
  earlier ones failed retryably: ExpiredToken after an hour) is a failure of that source only, as above.
* A host reported by two sources (two groups that share a subnet) counts for the first one given; one WARNING.
* Prices: a source's ``price`` (per slot-hour); else the provider's :meth:`~.api.HostDiscovery.hourly_prices` over
  the host's slots (when and how they are read again, failures and prices that are no price:
  :class:`~.sources.SourcePrices`; never failing the merged snapshot).
* :meth:`set_capacity` (``--manage-capacity``) goes to the source's group as its :class:`~.group_capacity.GroupCapacity`
  decides (:meth:`capacity_of`, :meth:`can_give`). AccessDenied: one WARNING, the group is left unmanaged for the
  rest of the job; other errors are retried at each later ``find()`` until a call succeeds or a newer value replaces it.
  A call its provider proves the cloud refused (``capacity_refused``: no attempt landed) is not the job's (taken back
  out of the sign of life, :meth:`on_raise`); one it cannot prove refused may have landed and stays the job's.
* **One provider call per source at a time**, whichever thread makes it: :meth:`wait_for` waits for any to end.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Mapping, Sequence

from cloud_elastic.config import MAX_DURATION_S
from cloud_elastic.errors import (CapacityDeniedError, CapacityError, DiscoveryError, FatalDiscoveryError,
                                  RetryableDiscoveryError)
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, cancel_find, lets_go
from cloud_elastic.providers.group_capacity import REASK_UNKNOWN_S, REFUSALS_TO_SPILL, SHORT_FOR_S, GroupCapacity, Room
from cloud_elastic.providers.sidecalls import Caller, SideCalls
from cloud_elastic.providers.sources import PRICE_RETRY_S, SourcePrices, SourceSpec, check_fallback_flags, is_price

__all__ = ["MultiSourceDiscovery", "SourceState", "Caller", "call_limit_s", "check_job_flags", "PRICE_RETRY_S",
           "MERGE_MARGIN_S", "UNHEARD_HOLD_S", "REASK_UNKNOWN_S", "REFUSALS_TO_SPILL", "SHORT_FOR_S"]

log = logging.getLogger(__name__)

#: The merged call is waited for this much longer than its slowest source (the poller's limit never fires first).
MERGE_MARGIN_S = 5.0
#: A fallback raise waits at most this long for a source that has never answered (three calls at the default
#: --discovery-timeout; well below the default --start-timeout and --elastic-timeout, 600 s).
UNHEARD_HOLD_S = 90.0
#: At close, releases put off beside the job's last calls wait this long for them (no find() comes after).
RELEASE_AT_CLOSE_S, CAPACITY_AT_CLOSE_S = 10.0, 120.0  # a capacity change under way at close: the job's 0
_TAKE_S = 5.0  # a side call that has ended puts its answer just after: waited for this long at most

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


def _outcome(find: Callable[[], object]) -> object:
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
    #: What its provider said its hosts cost, and when to ask again (``price_refresh_s``: set by the multi).
    prices: SourcePrices = field(default_factory=SourcePrices)
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
    #: Its price reads and capacity changes, on a thread of their own (:meth:`MultiSourceDiscovery._side`).
    side: Caller = field(init=False)
    side_lock: threading.Lock = field(default_factory=threading.Lock)
    side_call: Callable[[], object] | None = None
    side_done: Callable[[object], None] | None = None
    side_what: str = ""
    side_at: float = 0.0
    asks: int = 0  # the job's capacity values so far (one asked during a call outlives that call's answer)
    #: Its group's capacity as --manage-capacity sets it: what to send, who set it, what it can give.
    group: GroupCapacity = field(init=False)

    def __post_init__(self) -> None:
        self.caller = Caller(partial(_outcome, self.discovery.find), name=f"discovery-{self.spec.name}")
        self.side = Caller(partial(_outcome, self._side_call), name=f"calls-{self.spec.name}")
        self.group = GroupCapacity(self.spec.name)

    def _side_call(self) -> object:  # boxed: set_capacity's None is an answer too
        call, self.side_call = self.side_call, None
        return (call() if call is not None else None,)

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every provider call under way, its find() included; whether none runs."""
        deadline = time.monotonic() + timeout_s
        return (self.caller.wait_ended(timeout_s) and self.calls.wait_ended(deadline - time.monotonic())
                and self.side.wait_ended(max(0.0, deadline - time.monotonic())))

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
        for state in self.sources:
            state.prices.refresh_s = price_refresh_s
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
        began, fatal = time.monotonic(), []
        for source in self.sources:  # all asked at once: a source that hangs holds none of the others up
            self._take_side(source, 0.0)  # what a price read or capacity change ended with since: taken first
            if not source.caller.busy:
                self._release_held(source)
                with source.side_lock:  # no find() beside another call of it (one call at a time)
                    if not source.side.busy and not source.calls.count:
                        source.asked_at = time.monotonic()
                        source.caller.ask()
        for source in self.sources:
            limit = call_limit_s(source.discovery, self.call_timeout_s)
            if not source.caller.busy:  # not asked: a price read or capacity change of it runs
                if source.side.busy and time.monotonic() - source.side_at > limit:
                    self._failed(source, self._late(f"its {source.side_what} gave no", limit), now, fatal)
                continue
            snapshot = source.caller.answer(source.asked_at + limit - time.monotonic())
            if snapshot is None:
                self._failed(source, self._late("no", limit), now, fatal)
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
            self._refresh_prices(source, snapshot, now)  # begun now, on the source's side thread
        for source in self.sources:  # once every answer is in: a fallback's raise sees what the others answered
            # A source asked now is waited for up to its own limit, its side calls included; no other one.
            deadline = source.asked_at + call_limit_s(source.discovery, self.call_timeout_s) \
                if source.asked_at >= began else 0.0
            self._take_side(source, deadline - time.monotonic())
            self._apply_capacity(source, held=heard_now, wait_s=deadline - time.monotonic())
        if fatal:
            raise FatalDiscoveryError("; ".join(fatal))
        usable = [s for s in self.sources if s.last is not None and
                  (s.failing_since is None or now - s.failing_since <= self.stale_limit_s)]
        if not usable:
            raise RetryableDiscoveryError("every host source failed: " +
                                          "; ".join(f"{s.spec.name}: {s.error}" for s in self.sources))
        return self._merge(usable)

    def _late(self, what: str, limit: float) -> RetryableDiscoveryError:
        return RetryableDiscoveryError(f"{what} answer within {limit:g}s (--discovery-timeout {self.call_timeout_s:g}s)"
                                       "; no other call to it starts until that one ends")

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
            return snap.prices[host] if is_price(snap.prices[host]) else None
        hourly = source.prices.hourly.get(host)
        if hourly is None or not is_price(hourly):
            return None
        # A draining host's slots are no longer reported: those it had, else its group's (its hosts are alike).
        slots = snap.ready.get(host) or source.slots.get(host) or max(source.slots.values(), default=0)
        return hourly / slots if slots else None

    def _refresh_prices(self, source: SourceState, snapshot: DiscoveredHosts, now: float) -> None:
        hosts = frozenset(snapshot.ready) | frozenset(snapshot.draining)
        if source.spec.price is None and source.prices.due(hosts, now):
            self._side(source, "price read (hourly_prices)", partial(source.discovery.hourly_prices, snapshot),
                       partial(self._priced, source, now, hosts), 0.0)

    def _priced(self, source: SourceState, asked: float, hosts: frozenset[str], outcome: object) -> None:
        """The outcome of a price read begun at ``asked`` (the clock's) for ``hosts``: prices, or a failure."""
        name, prices = source.spec.name, source.prices
        if isinstance(outcome, Exception):
            if prices.failed(_failure_kind(outcome), self._clock()):
                log.warning("host source %r: could not read prices (the cost shown leaves its hosts out; tried "
                            "again after %gs, then less often): %s; to give the price by hand: --source %s:price=D "
                            "(dollars per slot-hour)", name, prices.backoff_s, outcome, name)
            return
        wrong, recovered = prices.took(outcome, asked, hosts)  # type: ignore[arg-type]
        if wrong:
            log.warning("host source %r: its provider gave %d host(s) a price that is no price (%s): their cost is "
                        "left out, as an unknown price; to give the price by hand: --source %s:price=D (dollars per "
                        "slot-hour)", name, len(wrong), ", ".join(f"{h} {prices.hourly[h]!r}" for h in wrong[:3])
                        + (", ..." if len(wrong) > 3 else ""), name)
        if recovered:
            log.info("host source %r: prices read again", name)

    # ------------------------------------------------------------ side calls
    def _side(self, source: SourceState, what: str, call: Callable[[], object], done: Callable[[object], None],
              wait_s: float, before: Callable[[], None] | None = None) -> bool:
        """Start ``call`` (``what``) on ``source``'s side thread if no other call of it runs, ``before`` it on this
        thread, and wait up to ``wait_s``; its outcome (value or exception) goes to ``done`` when taken, now or at a
        later :meth:`_take_side`, on whichever thread. Whether it started (if not, the caller keeps its work)."""
        with source.side_lock:
            self._took(source)
            if source.side.busy:
                return False
            count = ExitStack()  # counted among its calls until it ends, on the side thread
            if not count.enter_context(source.calls.start(lambda: not source.caller.running)):
                count.close()
                return False
            if before is not None:
                before()

            def counted() -> object:
                with count:
                    return call()

            source.side_call, source.side_done, source.side_what, source.side_at = counted, done, what, time.monotonic()
            source.side.ask()
        self._take_side(source, wait_s)
        return True

    def _take_side(self, source: SourceState, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for ``source``'s side call, take its outcome if it ended; whether none is under way."""
        if wait_s > 0 and source.side.busy:
            source.side.wait_ended(wait_s)
        with source.side_lock:
            self._took(source)
            return not source.side.busy

    def _took(self, source: SourceState) -> None:
        """Hand the outcome of ``source``'s side call to its ``done``, if the call has ended (the side lock held)."""
        outcome = source.side.answer(_TAKE_S) if source.side.busy and not source.side.running else None
        if outcome is not None and source.side_done is not None:
            done, source.side_done = source.side_done, None
            try:
                done(outcome[0] if isinstance(outcome, tuple) else outcome)
            except Exception:  # a plugin's odd answer (prices not a mapping): that call's outcome only is lost
                log.exception("host source %r: the answer of its %s is no answer", source.spec.name, source.side_what)

    # -------------------------------------------------------------- capacity
    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        """Set the desired capacity of ``source``'s group (see module docstring); never raises for the cloud."""
        target = self._by_name.get(source or "")
        if target is None:
            log.warning("--manage-capacity: no host source named %r", source)
            return
        target.group.ask(hosts)
        target.asks += 1
        self._apply_capacity(target, wait_s=call_limit_s(target.discovery, self.call_timeout_s))

    def _apply_capacity(self, source: SourceState, *, held: bool = False, wait_s: float = 0.0) -> None:
        group = source.group
        if group.asked is None or not self._take_side(source, 0.0) or source.caller.running or source.calls.count:
            return  # kept pending until its call under way has ended (one call at a time)
        if source.spec.fallback and group.asked > (group.value or 0) and (held or self._unheard(source)):
            return  # kept pending: asked again at every discovery (held: until the job saw the answer)
        limits = source.discovery.capacity_limits()
        asked, asks, hosts = group.asked, source.asks, group.decide(self._clock(), limits)  # asks: read with asked
        if asked is None or hosts is None:  # nothing to send (it would not change the group)
            return

        def before() -> None:
            group.started(hosts)  # the job's from here on: the sign of life says so before it is sent
            if hosts > 0 and self._on_raise is not None:
                self._before_raise(source.spec.name, hosts)

        self._side(source, "capacity change (set_capacity)",
                   partial(source.discovery.set_capacity, hosts, source=source.spec.name),
                   partial(self._capacity_set, source, asked, hosts, limits, asks), wait_s, before)

    def _capacity_set(self, source: SourceState, asked: int, hosts: int, limits: tuple | None, asks: int,
                      outcome: object) -> None:
        """The outcome of the call setting ``source``'s group to ``hosts`` (``asked`` within ``limits``; ``asks``: the
        job's values counted then): a newer value asked meanwhile stays to be sent."""
        group = source.group
        group.sending = None  # ended: capacity_of no longer counts it as under way
        newer = group.asked if source.asks != asks else None
        if isinstance(outcome, CapacityDeniedError):
            group.denied(proven=self._proven_refused(source, outcome))
            self._undo_raise(source, hosts)
            log.warning("--manage-capacity: the job may not change host source %r (%s); it goes on without "
                        "managing the group: set its desired capacity yourself", source.spec.name, outcome)
            return
        if isinstance(outcome, Exception):  # a plugin's other error too: the group keeps what it had
            group.refused(proven=isinstance(outcome, CapacityError) and self._proven_refused(source, outcome))
            self._undo_raise(source, hosts)
            log.warning("--manage-capacity: could not set the desired capacity of host source %r to %d (%s); "
                        "retrying at the next discovery", source.spec.name, hosts, outcome)
            return
        group.taken(asked, hosts, self._clock(), limits)
        if newer is not None:
            group.asked = newer
        log.info("--manage-capacity: host source %r: desired capacity set to %d", source.spec.name, hosts)

    def on_raise(self, callback: Callable[[str, int], object] | None,
                 undo: Callable[[str, int], object] | None = None) -> None:
        """Call ``callback(source, hosts)`` before each call setting a group to ``hosts`` > 0, on the thread asking
        it, which waits (the driver records the raise in its sign of life first: a driver killed during the call
        leaves the group to its successor); ``undo(source, hosts)`` once its provider proves the cloud refused it (no
        attempt landed: ``HostDiscovery.capacity_refused``) on a group the job had not set (the record is taken
        back). A callback that raises is logged; the call goes on."""
        self._on_raise, self._on_undo = callback, undo

    def _proven_refused(self, source: SourceState, exc: CapacityError) -> bool:
        """Whether ``source``'s provider proves the cloud refused the call (no attempt landed); unsure: no."""
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
        """Wait up to ``timeout_s`` for every call to ``source`` under way to end (its group may be set then, whatever
        the other sources' calls do); whether they ended."""
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
        """Whether ``host``'s source lets it go, and :meth:`release` did now: one put off (its source busy) is said by
        :meth:`_release_held` when made, not by the poller too (the line came twice, the first before it was)."""
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
            if source.side.busy and source.side_what.startswith("capacity") and \
                    not source.side.wait_ended(CAPACITY_AT_CLOSE_S):  # the job's 0 at its end, cut at exit else
                log.warning("host source %r: its capacity change still ran %gs after the job ended: check its "
                            "group's desired capacity yourself", source.spec.name, CAPACITY_AT_CLOSE_S)
            self._take_side(source, 0.0)  # a capacity change ended since: its line, its group's state
            source.caller.close()
            source.side.close()
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
    check_fallback_flags(discovery.sources if isinstance(discovery, MultiSourceDiscovery) else (),
                         manage_capacity=manage_capacity, fallback_after_s=fallback_after_s)
