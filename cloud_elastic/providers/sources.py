"""Host sources of a job with several of them: names, priorities, prices, the fallback.

A job may draw hosts from several groups at once (``--aws-asg spot-a --aws-asg
spot-b --gcp-mig od``). Each group is one *source*, described by a
:class:`SourceSpec`: its name (the group's name), the provider and options that
build it, and what the driver weighs when it chooses slots:

* ``priority`` (an integer, default 0): a higher one is preferred, whatever the prices;
* ``price`` (dollars per slot-hour, default unknown): among equal priorities the cheaper is preferred;
* ``fallback``: used only while the other sources give too few slots (see ``docs/multi-source.md``).

``--source NAME:KEY=VALUE,...`` sets these for the source named ``NAME``
(:func:`parse_source_flag`); keys other than the four here are options of the
source's provider (``region=us-west-2``), so two sources of one cloud may live in
different regions. Pure: no I/O, nothing imported that does any.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from cloud_elastic.errors import ConfigError

__all__ = ["SourceSpec", "SourceFlag", "SourcePrices", "parse_source_flag", "parse_price", "check_price", "is_price",
           "check_unique", "check_fallback_flags", "SOURCE_KEYS", "MAX_PRICE", "PRICE_RETRY_S"]

#: Keys of ``--source`` that describe the source itself; any other key is an option of its provider.
SOURCE_KEYS = ("priority", "price", "on_demand_price", "fallback")
#: The highest price accepted, per slot-hour (dollars): beyond it a value is a typo (cents for dollars, say).
MAX_PRICE = 10_000.0
#: A failed price look-up is tried again after this long, then twice as long each time, up to the refresh interval.
PRICE_RETRY_S = 30.0


#: A price as the command line takes it: ASCII digits with at most one point (Python's float() also takes
#: ``1_000``, ``1e3`` and other scripts' digits, which no price list writes).
_PLAIN = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")  # int() refuses past 4,300 digits with a ValueError of its own


def check_price(what: str, value: float, given: str | None = None) -> float:
    """``value`` if it is a finite price >= 0 and at most :data:`MAX_PRICE`, else a one-line ConfigError that quotes
    it as ``given`` (the text it was read from) where there is one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number of dollars, got {value!r}")
    shown = given if given is not None else repr(value)  # :g showed 10000.000001 as 10000
    if value < 0:
        raise ConfigError(f"{what} must be >= 0 dollars, got {shown}")
    if value > MAX_PRICE:
        raise ConfigError(f"{what} must be at most {MAX_PRICE:g} dollars, got {shown}")
    return float(value) + 0.0  # -0 is 0: shown as "$-0.00" otherwise


def is_price(value: object) -> bool:
    """Whether a provider's price is a number of dollars an hour the cost can count: 0 to :data:`MAX_PRICE`."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_PRICE


def parse_price(what: str, text: str) -> float:
    """The price ``text`` gives (a plain decimal number of dollars, :data:`_PLAIN`), checked as :func:`check_price`
    does; else a one-line ConfigError."""
    given = text.strip()
    if _PLAIN.fullmatch(given):
        return check_price(what, float(given), given)
    if given.lower().lstrip("+-") in ("nan", "inf", "infinity"):
        raise ConfigError(f"{what} must be a finite number of dollars, got {text!r}")
    raise ConfigError(f"{what} must be a number of dollars in digits 0-9 with at most one point (such as 0.9), "
                      f"got {text!r}")


@dataclass(frozen=True)
class SourceSpec:
    """One host source of a job: what builds it, and how the driver weighs its slots.

    ``price`` is in dollars per slot-hour (None: unknown, or read from the cloud
    where the provider can: AWS spot prices). ``on_demand_price`` (AWS only, dollars
    per *instance*-hour, as AWS lists it) prices the group's on-demand instances.
    """

    name: str
    provider: str
    options: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    price: float | None = None
    on_demand_price: float | None = None
    fallback: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ConfigError("a host source needs a non-empty name")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool) or abs(self.priority) > 1_000_000:
            raise ConfigError(f"source {self.name!r}: priority must be an integer (-1000000..1000000), "
                              f"got {self.priority!r}")
        if self.price is not None:
            check_price(f"source {self.name!r}: price", self.price)
        if self.on_demand_price is not None:
            check_price(f"source {self.name!r}: on_demand_price", self.on_demand_price)
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


@dataclass
class SourcePrices:
    """What a source's provider said its hosts cost (``HostDiscovery.hourly_prices``: host -> dollars per
    instance-hour), and when to ask again: every ``refresh_s``, and for hosts no read covered (a host it gave no
    price is not asked again before the refresh); after a failed read, :data:`PRICE_RETRY_S` later, doubling up to
    ``refresh_s`` (one WARNING per kind of failure, saying how to give the price by hand). A price that is no number
    of dollars from 0 to :data:`MAX_PRICE` an hour (NaN, 1e300) leaves its host unpriced (one WARNING naming the
    hosts new to it). Pure: its caller makes the reads and says what each method returns."""

    refresh_s: float = 300.0
    hourly: Mapping[str, float] = field(default_factory=dict)
    read_at: float = float("-inf")
    hosts: frozenset[str] = frozenset()  # the hosts the last good read covered
    retry_at: float | None = None  # after a failed read: when to try again, and the wait before the one after
    backoff_s: float = 0.0
    warned: set[str] = field(default_factory=set)  # kinds of failure said since the last good read
    wrong: set[str] = field(default_factory=set)  # hosts given a price that is no price (:func:`is_price`)

    def due(self, hosts: frozenset[str], now: float) -> bool:
        """Whether to read the prices of ``hosts`` (a snapshot's) at ``now``."""
        if self.retry_at is not None:
            return now >= self.retry_at
        return now - self.read_at >= self.refresh_s or not hosts <= self.hosts

    def failed(self, kind: str, now: float) -> bool:
        """A read failed with an error of ``kind`` at ``now``; whether that kind is new (to be said)."""
        self.backoff_s = min(max(2 * self.backoff_s, PRICE_RETRY_S), self.refresh_s)
        self.retry_at = now + self.backoff_s
        new = kind not in self.warned
        self.warned.add(kind)
        return new

    def took(self, hourly: Mapping[str, float], read_at: float, hosts: frozenset[str]) -> tuple[list[str], bool]:
        """A read begun at ``read_at`` for ``hosts`` gave ``hourly``: (the hosts newly given a price that is no
        price, kept as known and read as none; whether it follows failed ones)."""
        self.hourly, self.read_at, self.hosts = dict(hourly), read_at, hosts
        wrong = {host for host, price in self.hourly.items() if not is_price(price)}
        fresh, self.wrong = sorted(wrong - self.wrong), wrong
        recovered, self.retry_at, self.backoff_s = self.retry_at is not None, None, 0.0
        self.warned.clear()
        return fresh, recovered


@dataclass(frozen=True)
class SourceFlag:
    """One ``--source NAME:KEY=VALUE,...`` as given: the source's name, its attributes and provider options."""

    name: str
    priority: int | None = None
    price: float | None = None
    on_demand_price: float | None = None
    fallback: bool | None = None
    options: Mapping[str, str] = field(default_factory=dict)


def parse_source_flag(text: str, names: Sequence[str] = ()) -> SourceFlag:
    """Parse ``NAME:KEY=VALUE,...`` (``fallback`` alone means ``fallback=true``); ConfigError naming the flag.

    ``NAME`` is the longest of ``names`` that ``text`` starts with (followed by a colon), else
    everything before the first colon: a value may hold colons (``notice_queue=https://...``).
    """
    from cloud_elastic.providers.api import parse_bool

    known = [n for n in names if text.startswith(n + ":")]
    if known:
        name = max(known, key=len)
        sep, rest = ":", text[len(name) + 1:]
    else:
        name, sep, rest = text.partition(":")
    if not sep or not name.strip():
        raise ConfigError(f"--source {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...], "
                          "e.g. --source spot-a:price=0.9,priority=1")
    values: dict[str, object] = {}
    options: dict[str, str] = {}
    for item in (i.strip() for i in rest.split(",")):
        if not item:
            continue
        key, has_value, value = item.partition("=")
        key = key.strip()
        if key == "fallback" and not has_value:
            value = "true"
        elif not has_value or not key:
            raise ConfigError(f"--source {text!r}: {item!r} is not KEY=VALUE")
        if key in values or key in options:
            raise ConfigError(f"--source {text!r}: {key!r} is given twice")
        if key == "priority":
            if not _INTEGER.fullmatch(value.strip()):  # int() also takes 1_0 and other scripts' digits
                raise ConfigError(f"--source {text[:200]!r}: priority must be an integer of at most 18 digits 0-9, "
                                  f"got {value[:40]!r}")
            values[key] = int(value)
        elif key in ("price", "on_demand_price"):
            values[key] = parse_price(f"--source {name}: {key}", value)
        elif key == "fallback":
            values[key] = parse_bool("fallback", value)
        else:
            options[key] = value
    return SourceFlag(name=name.strip(), options=MappingProxyType(options), **values)  # type: ignore[arg-type]


def check_unique(names: Sequence[tuple[str, str]]) -> None:
    """ConfigError when two sources share a name; ``names`` is (name, the flag that gave it) per source."""
    seen: dict[str, str] = {}
    for name, flag in names:
        if name in seen:
            raise ConfigError(f"two host sources are named {name!r} ({seen[name]} and {flag}): each group may be "
                              "given once, and sources of different clouds need different group names")
        seen[name] = flag


def check_fallback_flags(sources: Sequence, *, manage_capacity: bool, fallback_after_s: float | None) -> None:
    """ConfigError for ``--manage-capacity`` / ``--fallback-after`` on a job that cannot use them (before it starts);
    ``sources``: a multi-source provider's (each with its ``spec`` and ``discovery``), none for one source."""
    fallbacks = [s for s in sources if s.spec.fallback]
    for flag, given in (("--manage-capacity", manage_capacity), ("--fallback-after", fallback_after_s is not None)):
        if given and not fallbacks:
            raise ConfigError(f"{flag} needs a fallback host source: mark one with --source NAME:fallback")
    for source in fallbacks if manage_capacity else ():
        if not source.discovery.can_set_capacity:
            raise ConfigError(f"--manage-capacity: host source {source.spec.name!r} ({source.spec.provider}) "
                              "cannot set a group's desired capacity (AWS, GCP and Azure groups can)")
