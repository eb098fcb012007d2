"""Parsing ``host[:slots]`` entries, shared by ``-H`` and discovery scripts."""

from __future__ import annotations

import ipaddress
import re
from typing import Iterable

from cloud_elastic.providers.api import MAX_SLOTS_PER_HOST, host_name_refusal, ipv6_refusal

__all__ = ["parse_host_list"]

# A hostname or an IPv4 address, then optional :slots (at most 12 digits: no int() of a huge number).
_ENTRY = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+)(?::(?P<slots>-?\d{1,12}))?$")
_HUGE = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+):\d{13,}$")


def parse_host_list(
    entries: Iterable[str], *, default_slots: int, source: str, unit: str = "entry"
) -> dict[str, int]:
    """Parse ``host[:slots]`` entries into an ordered host -> slots mapping.

    Blank entries and ``#`` comments are ignored. Raises ValueError with a
    one-line message naming ``source`` and the entry number for garbage,
    zero/negative slots, more than :data:`~cloud_elastic.providers.api.MAX_SLOTS_PER_HOST`
    slots, IPv6 addresses (the driver speaks IPv4 only), host names over 253 characters or with a
    label over 63 (``api.host_name_refusal``) and duplicate hosts. Order is
    preserved: it is the order hosts are first seen in, which decides who gets the lower ranks.
    """
    hosts: dict[str, int] = {}
    first_seen: dict[str, int] = {}
    for number, raw in enumerate(entries, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        match = _ENTRY.match(text)
        if not match:
            if text.startswith("[") or text.count(":") >= 2:  # [2001:db8::1]:2, or a bare IPv6 address
                host = text[1:].split("]", 1)[0] if text.startswith("[") else text
                if _is_ipv6(host):  # not "localhost:2:" or "10.0.0.5:2:1": those are typos, said below
                    raise ValueError(f"{source}: {unit} {number}: {ipv6_refusal(host[:80])}")
            huge = _HUGE.match(text)
            if huge:
                raise ValueError(f"{source}: {unit} {number} gives host {huge.group('host')[:80]!r} a slot count of "
                                 f"{len(text) - len(huge.group('host')) - 1} digits; at most "
                                 f"{MAX_SLOTS_PER_HOST} slots per host are allowed")
            raise ValueError(f"{source}: {unit} {number} is not host[:slots]: {raw.strip()[:80]!r}")
        host = match.group("host")
        refusal = host_name_refusal(host)  # before any line below quotes the name
        if refusal:
            raise ValueError(f"{source}: {unit} {number}: {refusal}")
        slots = int(match.group("slots")) if match.group("slots") is not None else default_slots
        if slots < 1:
            raise ValueError(f"{source}: {unit} {number} gives host {host!r} {slots} slots; slots must be >= 1")
        if slots > MAX_SLOTS_PER_HOST:
            raise ValueError(f"{source}: {unit} {number} gives host {host!r} {slots} slots; at most "
                             f"{MAX_SLOTS_PER_HOST} per host are allowed")
        if host in hosts:
            raise ValueError(
                f"{source}: host {host!r} is listed twice ({unit} {first_seen[host]} and {number})"
            )
        hosts[host] = slots
        first_seen[host] = number
    return hosts


def _is_ipv6(text: str) -> bool:
    """Whether ``text`` is an IPv6 address (a scope such as ``%eth0`` included)."""
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False
