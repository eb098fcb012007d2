"""``--address-map FROM=TO``: rewrite the addresses any provider reports.

Why: a provider reports the addresses the cloud gives (private IPs in the
VPC). Two situations need other addresses for the same instances: a driver
that reaches the workers through a tunnel, NAT or port-forward, and tests and
demos on one machine, where a cloud emulator's subnet (say ``10.20.1.0/24``)
is mapped onto loopback (``127.0.1.0/24``) so the driver starts the "cloud"
workers as local processes. One generic option applied in one place (a
wrapper that :func:`cloud_elastic.providers.selection.build_discovery` puts
around the selected provider) serves every provider, third-party ones
included, instead of each growing its own.

Rules: ``FROM`` and ``TO`` are IPv4 networks of the same prefix length (a
bare address counts as /32; IPv6 is refused, as everywhere: the driver listens
and routes over IPv4 only). An address inside ``FROM`` is
replaced by the address at the same offset inside ``TO``; the first matching
rule wins; addresses matching no rule and host names pass through unchanged.
Two hosts mapped onto one address is a FatalDiscoveryError (the rules are
wrong, retrying cannot help).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from cloud_elastic.errors import CapacityError, ConfigError, FatalDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery

__all__ = ["AddressRule", "parse_address_map", "map_address", "AddressMappedDiscovery"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class AddressRule:
    """Addresses in ``source`` move to the same offset in ``target``."""

    source: Network
    target: Network


def parse_address_map(specs: Iterable[str]) -> tuple[AddressRule, ...]:
    """Parse ``FROM=TO`` strings; ConfigError with a one-line message for anything wrong."""
    rules = []
    for spec in specs:
        left, sep, right = spec.partition("=")
        if not sep:
            raise ConfigError(f"--address-map expects FROM=TO (networks such as 10.0.1.0/24=127.0.1.0/24), got {spec!r}")
        try:
            source = ipaddress.ip_network(left.strip(), strict=True)
            target = ipaddress.ip_network(right.strip(), strict=True)
        except ValueError as exc:
            raise ConfigError(f"--address-map {spec!r}: {exc}") from None
        if source.version != target.version or source.prefixlen != target.prefixlen:
            raise ConfigError(
                f"--address-map {spec!r}: both sides need the same IP version and prefix length "
                f"(/{source.prefixlen} vs /{target.prefixlen})"
            )
        if target.version == 6:  # every address it produced would be refused by the snapshot (see api)
            raise ConfigError(f"--address-map {spec!r}: IPv6 is not supported (the driver listens and routes "
                              "over IPv4 only)")
        rules.append(AddressRule(source, target))
    return tuple(rules)


def map_address(host: str, rules: Iterable[AddressRule]) -> str:
    """The address ``host`` maps to under ``rules`` (unchanged if none matches or it is a name)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    for rule in rules:
        if address.version == rule.source.version and address in rule.source:
            offset = int(address) - int(rule.source.network_address)
            return str(ipaddress.ip_address(int(rule.target.network_address) + offset))
    return host


class AddressMappedDiscovery(HostDiscovery):
    """Wraps a provider and rewrites every host it reports (ready and draining) by the rules.

    Not a registered provider: :func:`~cloud_elastic.providers.selection.build_discovery`
    builds it around the selected one. ``find`` raises whatever the inner
    provider raises, unchanged.
    """

    def __init__(self, inner: HostDiscovery, rules: Iterable[AddressRule]) -> None:
        self.inner = inner
        self.rules = tuple(rules)
        self.name = inner.name  # type: ignore[misc]  # reads like the provider it wraps
        self.description = inner.description  # type: ignore[misc]
        self._origin: dict[str, str] = {}  # mapped address -> the inner provider's address

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "HostDiscovery":
        raise ConfigError("the address map wraps a provider; it is built by --address-map, not by --provider")

    def find(self) -> DiscoveredHosts:
        snapshot = self.inner.find()
        ready: dict[str, int] = {}
        draining = {}
        origin: dict[str, str] = {}
        for table, out in ((snapshot.ready, ready), (snapshot.draining, draining)):
            for host, value in table.items():
                mapped = map_address(host, self.rules)
                if mapped in origin:
                    raise FatalDiscoveryError(
                        f"--address-map sends both {origin[mapped]} and {host} to {mapped}; fix the rules"
                    )
                origin[mapped] = host
                out[mapped] = value
        self._origin = origin
        instances = {map_address(h, self.rules): i for h, i in snapshot.instances.items()}
        soft = {map_address(h, self.rules): r for h, r in snapshot.soft.items()}
        sources = {map_address(h, self.rules): s for h, s in snapshot.sources.items()}
        prices = {map_address(h, self.rules): p for h, p in snapshot.prices.items()}
        return DiscoveredHosts(ready=ready, draining=draining, instances=instances, soft=soft, sources=sources,
                               prices=prices)

    @property
    def can_set_capacity(self) -> bool:  # type: ignore[override]
        return self.inner.can_set_capacity

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        self.inner.set_capacity(hosts, source=source)

    def capacity_refused(self, exc: CapacityError) -> bool:
        return self.inner.capacity_refused(exc)

    def capacity_limits(self) -> tuple[int, int] | tuple[int, int, int] | None:
        return self.inner.capacity_limits()

    def hourly_prices(self, snapshot: DiscoveredHosts) -> Mapping[str, float]:
        back = {mapped: self._origin.get(mapped, mapped) for mapped in (*snapshot.ready, *snapshot.draining)}
        inner = DiscoveredHosts(ready={back[h]: n for h, n in snapshot.ready.items()},
                                draining={back[h]: d for h, d in snapshot.draining.items()},
                                instances={back[h]: i for h, i in snapshot.instances.items()})
        return {map_address(h, self.rules): p for h, p in self.inner.hourly_prices(inner).items()}

    def release(self, host: str, instance: str | None) -> None:
        self.inner.release(self._origin.get(host, host), instance)

    def releases(self, host: str) -> bool:
        return self.inner.releases(self._origin.get(host, host))

    def wake_on_news(self, wake: Callable[[], None]) -> None:
        self.inner.wake_on_news(wake)

    def find_limit_s(self, timeout_s: float) -> float:
        return self.inner.find_limit_s(timeout_s)

    def cancel_find(self) -> None:
        self.inner.cancel_find()

    def close(self) -> None:
        self.inner.close()
