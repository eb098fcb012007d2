"""A fixed host list (``-H host1:2,host2:2``)."""

from __future__ import annotations

from typing import Mapping

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, ProviderOption
from cloud_elastic.providers.hostspec import parse_host_list

__all__ = ["StaticHosts"]


class StaticHosts(HostDiscovery):
    """Hosts given on the command line; the snapshot never changes."""

    name = "static"
    description = "a fixed list of hosts (what -H/--hosts uses)"
    options = (ProviderOption("hosts", "comma-separated host[:slots] list", required=True),)

    def __init__(self, hosts: Mapping[str, int]) -> None:
        if not hosts:
            raise ConfigError("the static host list is empty")
        self._snapshot = DiscoveredHosts(ready=dict(hosts))

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "StaticHosts":
        cls.check_options(options)
        entries = [e for e in options["hosts"].split(",") if e.strip()]
        try:
            hosts = parse_host_list(entries, default_slots=slots_per_host or 1, source="--hosts")
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        return cls(hosts)

    def find(self) -> DiscoveredHosts:
        return self._snapshot
