"""``host[:slots]`` parsing shared by -H and discovery scripts (cloud_elastic.providers.hostspec)."""

from __future__ import annotations

import pytest

from cloud_elastic.providers.hostspec import parse_host_list

pytestmark = pytest.mark.timeout(10)


def parse(*entries: str, default_slots: int = 1) -> dict[str, int]:
    return parse_host_list(entries, default_slots=default_slots, source="--hosts")


def test_order_is_the_order_given_and_default_slots_fill_in() -> None:
    hosts = parse("zeta:4", "10.0.0.2", "alpha.example.com:2", default_slots=3)
    assert list(hosts.items()) == [("zeta", 4), ("10.0.0.2", 3), ("alpha.example.com", 2)]


def test_blank_entries_and_comments_are_ignored() -> None:
    assert parse("", "  # a comment", "a:2  # trailing comment", "   ") == {"a": 2}


@pytest.mark.parametrize("entry", ["[::1]:2", "[fe80::1]", "fe80::1", "[2001:db8::1]:1"])
def test_ipv6_is_refused_by_name(entry: str) -> None:
    # The driver listens and routes over IPv4 only: an IPv6 host is refused in one line, not half run.
    with pytest.raises(ValueError) as info:
        parse("a:1", entry)
    assert "entry 2: host" in str(info.value) and "IPv6" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (("a:2", "b:two"), "--hosts: entry 2 is not host[:slots]: 'b:two'"),
        (("a b",), "entry 1 is not host[:slots]"),
        (("a:",), "entry 1 is not host[:slots]"),
        (("fe80::1",), "entry 1: host 'fe80::1' is an IPv6 address"),
        # two colons make a typo, not an IPv6 address, unless the host parses as one (review s60 rvS)
        (("localhost:2:",), "entry 1 is not host[:slots]: 'localhost:2:'"),
        (("10.0.0.5:2:1",), "entry 1 is not host[:slots]: '10.0.0.5:2:1'"),
        (("[host]:2",), "entry 1 is not host[:slots]: '[host]:2'"),
        (("a:0",), "entry 1 gives host 'a' 0 slots; slots must be >= 1"),
        (("a:1", "b:-2"), "entry 2 gives host 'b' -2 slots; slots must be >= 1"),
        (("a:1", "b", "a:2"), "host 'a' is listed twice (entry 1 and 3)"),
    ],
    ids=["word-slots", "space", "empty-slots", "bare-ipv6", "stray-colon", "ipv4-two-colons", "bracketed-name",
         "zero", "negative", "duplicate"],
)
def test_bad_entries_raise_one_line_naming_source_and_entry(entries: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse(*entries)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_garbage_is_quoted_at_most_80_characters() -> None:
    with pytest.raises(ValueError) as info:
        parse("!" * 500)
    assert "!" * 80 in str(info.value) and "!" * 81 not in str(info.value)


def test_unit_names_lines_for_scripts() -> None:
    with pytest.raises(ValueError, match="^discover.sh: line 1 is not host"):
        parse_host_list(["?"], default_slots=1, source="discover.sh", unit="line")


@pytest.mark.parametrize(("host", "why"), [
    ("127.0.0.300", "Octet 300 (> 255) not permitted"),
    ("10.1", "Expected 4 octets"),
    ("10.0.0.1.", "Expected 4 octets"),
    ("010.0.0.1", "Leading zeros are not permitted"),  # octal to inet_aton: 8.0.0.1
    ("12345", "Expected 4 octets"),
])
def test_digits_and_dots_that_are_no_ipv4_address_are_refused_in_one_line(host: str, why: str) -> None:
    # 127.0.0.300 was started as a local host whose every round failed for --elastic-timeout (review s63 rvU 3).
    with pytest.raises(ValueError) as info:
        parse("127.0.0.2:1", f"{host}:1")
    message = str(info.value)
    assert message.startswith(f"--hosts: entry 2: host {host!r} is not an IPv4 address (") and why in message
    assert "give four numbers from 0 to 255 separated by dots, or a host name" in message and "\n" not in message


def test_names_with_digits_and_addresses_are_kept() -> None:
    assert parse("10.0.0.5:2", "255.255.255.255", "node-01.example", "1a.2b") == {
        "10.0.0.5": 2, "255.255.255.255": 1, "node-01.example": 1, "1a.2b": 1}


def test_a_provider_snapshot_with_such_a_host_is_refused_as_fatal() -> None:
    from cloud_elastic.errors import FatalDiscoveryError
    from cloud_elastic.providers.api import DiscoveredHosts

    with pytest.raises(FatalDiscoveryError, match="host '10.0.0.256' is not an IPv4 address"):
        DiscoveredHosts(ready={"10.0.0.5": 1, "10.0.0.256": 1})
