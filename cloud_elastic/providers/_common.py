"""Pieces every cloud provider shares: lazy SDK modules, option parsing, snapshot
building, time parsing, slot caching and error classification.

Nothing here does I/O. Cloud modules import this; it imports no cloud SDK.
"""

from __future__ import annotations

import abc
import ipaddress
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, ClassVar, Hashable, Mapping

from cloud_elastic.errors import (
    ConfigError,
    DiscoveryError,
    FatalDiscoveryError,
    RetryableDiscoveryError,
    require_module,
)
from cloud_elastic.providers.api import DiscoveredHosts, Drain, HostDiscovery, ProviderOption

__all__ = [
    "OptionReader",
    "retry_options",
    "Verdict",
    "READY",
    "ABSENT",
    "draining",
    "absent",
    "parse_time",
    "OnceLog",
    "SnapshotBuilder",
    "SlotCache",
    "error_for_status",
    "one_line",
    "CloudGroupProvider",
]

_log = logging.getLogger(__name__)

#: The longest an option in seconds may be (a day: these are API timeouts and intervals).
_MAX_SECONDS = 86400.0


def one_line(text: object, limit: int = 300) -> str:
    """Collapse an SDK's or a script's message to one line of at most ``limit`` characters, control characters
    escaped (``\x1b``): a terminal shows the driver's log, and an escape sequence in it can clear the screen,
    retitle the window or paint a line the driver never wrote."""
    flat = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in " ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def error_for_status(status: int | None, message: str) -> DiscoveryError:
    """The error for an HTTP status that survived the SDK's own retries.

    408, 429 and 5xx are transient (RetryableDiscoveryError); every other
    status (401, 403, 404, 400...) is something retrying cannot fix.
    ``None`` (no response at all: connection refused, timeout) is transient.
    """
    if status is None or status in (408, 429) or status >= 500:
        return RetryableDiscoveryError(message)
    return FatalDiscoveryError(message)


def retry_options(default_attempts: int = 5, default_timeout_s: float = 10.0) -> tuple[ProviderOption, ...]:
    """The two options every SDK-retry-based provider exposes."""
    return (
        ProviderOption(
            "max_attempts",
            "attempts per API call, first one included, through the SDK's retry with back-off (1 = no retry)",
            default=str(default_attempts),
        ),
        ProviderOption("timeout_s", "connect/read timeout of one API request, seconds", default=f"{default_timeout_s:g}"),
    )


class OptionReader:
    """Typed access to ``-o key=value`` options with one-line ConfigErrors."""

    def __init__(self, provider: type[HostDiscovery], options: Mapping[str, str]) -> None:
        provider.check_options(options)
        self._provider = provider
        self._options = options
        self._defaults = {o.name: o.default for o in provider.options}

    def text(self, name: str) -> str | None:
        """The option's value, its declared default, or ``None``; blank counts as absent."""
        value = self._options.get(name)
        if value is None or not value.strip():
            value = self._defaults.get(name)
        return value.strip() if value else None

    def integer(self, name: str, *, minimum: int = 1, maximum: int | None = None) -> int:
        """An integer option within ``[minimum, maximum]``."""
        raw = self.text(name)
        try:
            value = int(raw or "")
        except ValueError:
            raise ConfigError(f"provider {self._provider.name!r}: option {name!r} must be an integer, got {raw!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise ConfigError(f"provider {self._provider.name!r}: option {name!r} must be {bound}, got {value}")
        return value

    def seconds(self, name: str) -> float:
        """A positive number of seconds."""
        raw = self.text(name)
        try:
            value = float(raw or "")
        except ValueError:
            raise ConfigError(f"provider {self._provider.name!r}: option {name!r} must be a number, got {raw!r}") from None
        if not value > 0:
            raise ConfigError(f"provider {self._provider.name!r}: option {name!r} must be > 0, got {raw}")
        if not value <= _MAX_SECONDS:  # inf, or a typo that would overflow an SDK's timeout
            raise ConfigError(f"provider {self._provider.name!r}: option {name!r} must be at most "
                              f"{_MAX_SECONDS:g} seconds, got {raw}")
        return value

    def endpoint(self, name: str) -> str | None:
        """An optional http(s) URL, trailing slash removed."""
        value = self.text(name)
        if value is None:
            return None
        if not value.startswith(("https://", "http://")):
            raise ConfigError(f"provider {self._provider.name!r}: option {name!r} must be an http(s) URL, got {value!r}")
        return value.rstrip("/")


@dataclass(frozen=True)
class Verdict:
    """What a cloud's state says about one instance: ``kind`` is ready, draining or absent.

    ``deadline`` (Unix seconds) is when the cloud will take a draining instance,
    where the cloud's state says so; ``None`` otherwise. An absent verdict with
    a ``reason`` is one worth telling the user about once (a stopped instance
    kept in a pool, an evicted Spot VM); a bare ``ABSENT`` is silent.
    """

    kind: str
    reason: str = ""
    deadline: float | None = None


READY = Verdict("ready")
ABSENT = Verdict("absent")


def draining(reason: str, deadline: float | None = None) -> Verdict:
    """A verdict for an instance that is leaving, with a human-readable reason and the cloud's deadline if any."""
    return Verdict("draining", reason, deadline)


def absent(reason: str) -> Verdict:
    """A verdict for an instance that exists but runs nothing for the job, logged once with ``reason``."""
    return Verdict("absent", reason)


def parse_time(value: object) -> float | None:
    """An RFC 3339 / ISO 8601 timestamp (or a datetime) as Unix seconds; ``None`` if absent or unreadable.

    Clouds write local offsets (GCP: ``2026-01-01T09:00:00.000-07:00``), ``Z``
    (IBM), seven fractional digits (Azure) or a space instead of ``T`` (a
    stringified datetime), so strings must be parsed before they are compared.
    A timestamp without an offset is taken as UTC.
    """
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "zZ" else text)
        except ValueError:
            return None
    else:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


class OnceLog:
    """Logs a condition the first time an instance shows it, and again only after it had cleared.

    A provider keeps one for its life; :class:`SnapshotBuilder` calls :meth:`note`
    for each absent-with-a-reason instance and :meth:`cycle` once per snapshot,
    so a stopped instance in a standby pool is reported once, not every second.
    """

    def __init__(self, logger: logging.Logger = _log, level: int = logging.INFO) -> None:
        self._logger = logger
        self._level = level
        self._seen: set[Hashable] = set()
        self._now: set[Hashable] = set()

    def note(self, key: Hashable, message: str, *args: object) -> None:
        """Log ``message % args`` unless ``key`` was already logged and seen in the previous snapshot."""
        self._now.add(key)
        if key not in self._seen:
            self._seen.add(key)
            self._logger.log(self._level, message, *args)

    def cycle(self) -> None:
        """End of one snapshot: keys not noted during it are forgotten (logged again if they return)."""
        self._seen, self._now = self._now, set()


#: (group, instance) pairs already warned of having no private IPv4: once per instance for the driver's life.
_NO_IPV4_WARNED: set[tuple[str, str]] = set()


class SnapshotBuilder:
    """Collects per-instance verdicts into a DiscoveredHosts, oldest instances first.

    An address seen twice keeps its first ready entry unless the second says
    draining (leaving wins: it is the safer reading). Ordering by creation
    time means hosts that have been around longest get the lower ranks; times
    are compared as instants (see :func:`parse_time`), never as strings.
    Absent verdicts with a reason go to ``once`` (an :class:`OnceLog`) if given.
    """

    def __init__(self, group: str, *, once: OnceLog | None = None) -> None:
        self._group = group
        self._once = once
        self._ready: dict[str, tuple[Hashable, int]] = {}
        self._draining: dict[str, tuple[Hashable, Drain]] = {}
        self._instances: dict[str, str] = {}

    def add(self, address: str | None, verdict: Verdict, slots: Callable[[], int], *, order: object = "",
            instance: str = "") -> None:
        """Record one instance. ``slots`` is only called for ready instances.

        ``order`` is the instance's creation time (an RFC 3339 string, a
        datetime or Unix seconds); ``instance`` the cloud's id for it.
        """
        if verdict.kind == "absent":
            if verdict.reason and self._once is not None:
                self._once.note((instance or address, verdict.reason), "%s: instance %s (%s) is %s; not counted",
                                self._group, instance or "?", address or "no address", verdict.reason)
            return
        if not address:
            # In service without a private IPv4 is an IPv6-only subnet, not a moment of set-up: said at DEBUG,
            # the job then failed "only 0 slot(s) available" with no hint why.
            if (self._group, instance) not in _NO_IPV4_WARNED:
                _NO_IPV4_WARNED.add((self._group, instance))
                _log.warning("%s: instance %s is in service but has no private IPv4 address (an IPv6-only "
                             "subnet?); cloud-elastic needs IPv4", self._group, instance or "?")
            return
        key = (_instant(order), address)
        if verdict.kind == "draining":
            if address in self._ready:
                self._ready.pop(address)
                self._instances.pop(address, None)
            if address not in self._draining:
                self._draining[address] = (key, Drain(deadline=verdict.deadline, reason=verdict.reason))
                if instance:
                    self._instances[address] = instance
            return
        if address in self._ready or address in self._draining:
            _log.warning("%s: address %s is reported by two instances; keeping the first", self._group, address)
            return
        self._ready[address] = (key, slots())
        if instance:
            self._instances[address] = instance

    def build(self) -> DiscoveredHosts:
        """The snapshot, each table ordered by (creation time, address in numeric order)."""
        if self._once is not None:
            self._once.cycle()
        ready = {h: s for h, (_, s) in sorted(self._ready.items(), key=lambda kv: _sort_key(kv[1][0]))}
        drain = {h: d for h, (_, d) in sorted(self._draining.items(), key=lambda kv: _sort_key(kv[1][0]))}
        return DiscoveredHosts(ready=ready, draining=drain, instances=self._instances)


def _instant(order: object) -> tuple[int, float, str]:
    """A sortable creation time: parsed instants first, then unreadable values by text, then none."""
    if isinstance(order, (int, float)) and not isinstance(order, bool):
        return (0, float(order), "")
    when = parse_time(order)
    if when is not None:
        return (0, when, "")
    return (1, 0.0, str(order or ""))


def _sort_key(key: tuple[tuple[int, float, str], str]) -> tuple[tuple[int, float, str], int, int, str]:
    order, address = key
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return (order, 1, 0, address)
    return (order, 0, int(ip) + (ip.version << 128), address)


class SlotCache:
    """Instance type -> GPU count, looked up once per type (types never change).

    ``lookup`` returns the GPU count of one type (0 for CPU-only); a CPU-only
    type gives 1 slot. ``fixed`` (the user's ``--slots-per-host``) wins and
    skips every lookup.
    """

    def __init__(self, lookup: Callable[[Hashable], int], *, fixed: int | None) -> None:
        self._lookup = lookup
        self._fixed = fixed
        self._cache: dict[Hashable, int] = {}

    def slots(self, instance_type: Hashable) -> int:
        """Slots for one instance of ``instance_type``."""
        if self._fixed is not None:
            return self._fixed
        if instance_type not in self._cache:
            self._cache[instance_type] = max(1, int(self._lookup(instance_type) or 0))
            _log.debug("instance type %s has %d slot(s)", instance_type, self._cache[instance_type])
        return self._cache[instance_type]

    def prime(self, instance_type: Hashable, gpus: int) -> None:
        """Record a count learnt as a side effect (for example from a batch lookup)."""
        self._cache.setdefault(instance_type, max(1, int(gpus or 0)))

    def known(self, instance_type: Hashable) -> bool:
        """Whether ``instance_type`` needs no lookup."""
        return self._fixed is not None or instance_type in self._cache


class CloudGroupProvider(HostDiscovery, abc.ABC):
    """Base of the cloud providers: lazy SDK modules and one translation point for SDK errors.

    Subclasses declare ``sdk_modules`` (short name -> module path, imported
    together on first use through :attr:`sdk`), implement :meth:`_discover`
    (build clients once, return a snapshot) and :meth:`_translate` (map an SDK
    exception to a DiscoveryError, or ``None`` for "not an SDK error").
    ``find`` lets DiscoveryErrors through, translates the rest and re-raises
    anything untranslated unchanged (the driver treats that as a bug, retryable).
    """

    #: Modules the provider imports lazily, by short name, and the pip package
    #: and extra that provide them.
    sdk_modules: ClassVar[Mapping[str, str]] = {}
    sdk_package: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    #: Modules ``cloud-elastic providers`` checks for (without importing them).
    requires: ClassVar[tuple[str, ...]] = ()
    #: Human name of the group in messages, e.g. "AWS Auto Scaling group 'gpus'".
    label: str = ""

    @property
    def sdk(self) -> dict[str, Any]:
        """The SDK modules by short name, imported on first use (MissingDependencyError names the extra)."""
        loaded = self.__dict__.get("_sdk_loaded")
        if loaded is None:
            loaded = {name: require_module(path, package=self.sdk_package, extra=self.extra)
                      for name, path in self.sdk_modules.items()}
            self.__dict__["_sdk_loaded"] = loaded
        return loaded

    def _sdk_if_loaded(self) -> dict[str, Any] | None:
        """The SDK modules if already imported (translation must not import anything)."""
        return self.__dict__.get("_sdk_loaded")

    def find(self) -> DiscoveredHosts:
        try:
            return self._discover()
        except DiscoveryError:
            raise
        except Exception as exc:  # translated below, or re-raised as is
            modules = self._sdk_if_loaded()
            error = None if modules is None else self._translate(exc, modules)
            if error is None:
                raise
            _log.debug("%s: %s", self.label, error, exc_info=True)
            raise error from exc

    @abc.abstractmethod
    def _discover(self) -> DiscoveredHosts:
        """Talk to the cloud and build one snapshot."""

    @abc.abstractmethod
    def _translate(self, exc: Exception, sdk: Mapping[str, Any]) -> DiscoveryError | None:
        """The DiscoveryError for an SDK exception, or ``None`` if ``exc`` is not one."""
