"""Parsing ``host[:slots]`` entries, shared by ``-H`` and discovery scripts."""

from __future__ import annotations

import re
from typing import Iterable

__all__ = ["parse_host_list"]

# A hostname, an IPv4 address or a bracketed IPv6 address, then optional :slots.
_ENTRY = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(?::(?P<slots>-?\d+))?$")


def parse_host_list(
    entries: Iterable[str], *, default_slots: int, source: str, unit: str = "entry"
) -> dict[str, int]:
    """Parse ``host[:slots]`` entries into an ordered host -> slots mapping.

    Blank entries and ``#`` comments are ignored. Raises ValueError with a
    one-line message naming ``source`` and the entry number for garbage,
    zero/negative slots and duplicate hosts. Order is preserved: it is the
    order hosts are first seen in, which decides who gets the lower ranks.
    """
    hosts: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    for number, raw in enumerate(entries, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        match = _ENTRY.match(text)
        if not match:
            raise ValueError(f"{source}: {unit} {number} is not host[:slots]: {raw.strip()[:80]!r}")
        host = match.group("host").strip("[]")
        slots = int(match.group("slots")) if match.group("slots") is not None else default_slots
        if slots < 1:
            raise ValueError(f"{source}: {unit} {number} gives host {host!r} {slots} slots; slots must be >= 1")
        if host in hosts:
            raise ValueError(
                f"{source}: host {host!r} is listed twice ({unit} {first_seen[host]} and {number})"
            )
        hosts[host] = slots
        first_seen[host] = number
    return hosts
