"""A fixed host list (``-H host1:2,host2:2``)."""

from __future__ import annotations

from typing import Mapping

from cloud_elastic.errors import ConfigError, DiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, ProviderOption
from cloud_elastic.providers.hostspec import parse_host_list

__all__ = ["StaticHosts", "never_enough", "never_grows"]


class StaticHosts(HostDiscovery):
    """Hosts given on the command line; the snapshot never changes."""

    name = "static"
    description = "a fixed list of hosts (what -H/--hosts uses)"
    options = (ProviderOption("hosts", "comma-separated host[:slots] list", required=True),)

    def __init__(self, hosts: Mapping[str, int]) -> None:
        if not hosts:
            raise ConfigError("the static host list is empty")
        try:
            self._snapshot = DiscoveredHosts(ready=dict(hosts))
        except DiscoveryError as exc:  # too many slots, an IPv6 address: the list is the user's flag
            raise ConfigError(f"--hosts: {exc}") from None

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


def never_enough(discovery: HostDiscovery, num_proc: int, whole_host_slots: int = 0) -> str | None:
    """Why a fixed host list can never start the job (None when it can, or when the hosts may change).

    A job starts once ``-np`` slots are free (``Capacity.plan_launches``). A list given with
    ``-H`` never grows, so with fewer slots than that the driver would only wait for
    ``--start-timeout`` and then fail; this says so before anything starts. Under
    ``--whole-hosts`` only hosts offering all ``--slots-per-host`` slots count, N slots each.
    """
    inner = _static_list(discovery)
    if inner is None:
        return None
    hosts = inner.find().ready
    if whole_host_slots:
        usable = sum(whole_host_slots for slots in hosts.values() if slots >= whole_host_slots)
        if usable >= num_proc:
            return None
        return (f"-np {num_proc} can never start: the host list offers {usable} slot(s) on hosts with all "
                f"--slots-per-host {whole_host_slots} slots (--whole-hosts), and a fixed list never grows")
    total = sum(hosts.values())
    if total >= num_proc:
        return None
    return (f"-np {num_proc} can never start: the host list offers {total} slot(s) in all, and a fixed list "
            "never grows (add hosts or host:slots, or lower -np)")


def never_grows(discovery: HostDiscovery) -> bool:
    """Whether ``discovery`` is a fixed host list (``-H``, perhaps behind ``--address-map``): it can never add a
    host or a slot, so a job whose usable slots fall below ``--min-np`` can end at once (``Policy.hosts_fixed``)."""
    return _static_list(discovery) is not None


def _static_list(discovery: HostDiscovery) -> StaticHosts | None:
    inner: HostDiscovery | None = discovery
    while not isinstance(inner, StaticHosts):
        inner = getattr(inner, "inner", None)  # an --address-map wrapper: the slots are the inner list's
        if inner is None:
            return None
    return inner
