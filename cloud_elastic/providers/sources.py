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
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from cloud_elastic.errors import ConfigError

__all__ = ["SourceSpec", "SourceFlag", "parse_source_flag", "check_unique", "SOURCE_KEYS", "MAX_PRICE"]

#: Keys of ``--source`` that describe the source itself; any other key is an option of its provider.
SOURCE_KEYS = ("priority", "price", "on_demand_price", "fallback")
#: The highest price accepted, per slot-hour (dollars): beyond it a value is a typo (cents for dollars, say).
MAX_PRICE = 10_000.0


def check_price(what: str, value: float) -> float:
    """``value`` if it is a finite price >= 0 and at most :data:`MAX_PRICE`, else a one-line ConfigError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number of dollars, got {value!r}")
    if value < 0:
        raise ConfigError(f"{what} must be >= 0 dollars, got {value:g}")
    if value > MAX_PRICE:
        raise ConfigError(f"{what} must be at most {MAX_PRICE:g} dollars, got {value:g}")
    return float(value)


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
            try:
                values[key] = int(value)
            except ValueError:
                raise ConfigError(f"--source {text!r}: priority must be an integer, got {value!r}") from None
        elif key in ("price", "on_demand_price"):
            try:
                number = float(value)
            except ValueError:
                raise ConfigError(f"--source {text!r}: {key} must be a number of dollars, got {value!r}") from None
            values[key] = check_price(f"--source {name}: {key}", number)
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
