"""A scripted in-memory provider: the contract suite's fake, and a timeline for other tests.

``ScriptedDiscovery(timeline)`` returns the snapshots of ``timeline`` one
per call and then repeats the last one; an entry that is an exception
instance is raised instead. It is not registered as an entry point.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, ProviderOption

__all__ = ["ScriptedDiscovery"]


class ScriptedDiscovery(HostDiscovery):
    """Plays back a timeline of snapshots (or exceptions), then repeats the last entry."""

    name = "scripted"
    description = "plays back a scripted timeline of snapshots (tests only)"
    options = (ProviderOption("hosts", "comma-separated host:slots list for a one-entry timeline", required=True),)

    def __init__(self, timeline: Sequence[DiscoveredHosts | Exception], *, slots_per_host: int | None = None) -> None:
        if not timeline:
            raise ConfigError("a scripted timeline needs at least one entry")
        self.timeline = list(timeline)
        self.slots_per_host = slots_per_host
        self.calls = 0
        self.closed = 0

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "ScriptedDiscovery":
        cls.check_options(options)
        ready = {}
        for entry in options["hosts"].split(","):
            host, _, slots = entry.partition(":")
            ready[host] = int(slots or 1)
        return cls([DiscoveredHosts(ready=ready)], slots_per_host=slots_per_host)

    def find(self) -> DiscoveredHosts:
        entry = self.timeline[min(self.calls, len(self.timeline) - 1)]
        self.calls += 1
        if isinstance(entry, Exception):
            raise entry
        if self.slots_per_host is not None:
            return DiscoveredHosts(ready={h: self.slots_per_host for h in entry.ready}, draining=entry.draining,
                                   instances=entry.instances)
        return entry

    def close(self) -> None:
        self.closed += 1
