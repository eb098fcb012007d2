"""Which discovery provider a command line selects, and with what options.

``add_discovery_arguments`` adds the discovery flags to a parser (shared by
``run`` and ``discover``); ``build_discovery`` turns parsed arguments into a
provider instance. Dedicated flags (``-H``, ``--host-discovery-script``, the
cloud flags) are shorthands for ``--provider NAME -o key=value``.
"""

from __future__ import annotations

import argparse

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers import registry
from cloud_elastic.providers.api import HostDiscovery

__all__ = ["add_discovery_arguments", "selected_provider", "build_discovery"]


def add_discovery_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every discovery flag to ``parser``."""
    group = parser.add_argument_group("host discovery (choose one)")
    group.add_argument("-H", "--hosts", metavar="HOST[:SLOTS],...", help="a fixed list of hosts")
    group.add_argument(
        "--host-discovery-script", metavar="PATH", help="executable printing host[:slots] per line"
    )
    group.add_argument("--provider", metavar="NAME", help="any installed provider (see 'cloud-elastic providers')")
    group.add_argument(
        "-o", "--provider-option", metavar="KEY=VALUE", action="append", default=[],
        help="an option for --provider (repeatable)",
    )
    group.add_argument(
        "--slots-per-host", type=int, metavar="N",
        help="slots on each host; wins over what the provider reports (default 1 for -H/scripts)",
    )
    group.add_argument(
        "--discovery-timeout", type=float, metavar="SECONDS", default=30.0,
        help="kill a discovery script that runs longer than this (default 30)",
    )


def selected_provider(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """Return ``(provider name, options)`` for the parsed arguments; ConfigError if ambiguous."""
    chosen: list[tuple[str, dict[str, str]]] = []
    if args.hosts:
        chosen.append(("static", {"hosts": args.hosts}))
    if args.host_discovery_script:
        chosen.append(
            ("script", {"path": args.host_discovery_script, "timeout_s": str(args.discovery_timeout)})
        )
    if args.provider:
        chosen.append((args.provider, _parse_options(args.provider_option)))
    elif args.provider_option:
        raise ConfigError("-o/--provider-option needs --provider NAME")
    if not chosen:
        raise ConfigError("no hosts: give -H/--hosts, --host-discovery-script or a provider (--provider NAME)")
    if len(chosen) > 1:
        raise ConfigError("choose one host source: " + " / ".join(name for name, _ in chosen) + " were given")
    return chosen[0]


def build_discovery(args: argparse.Namespace) -> HostDiscovery:
    """Load and configure the selected provider. No I/O beyond loading its entry point."""
    if args.slots_per_host is not None and args.slots_per_host < 1:
        raise ConfigError(f"--slots-per-host must be >= 1, got {args.slots_per_host}")
    name, options = selected_provider(args)
    cls = registry.load(name)
    return cls.from_options(options, slots_per_host=args.slots_per_host)


def _parse_options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-o expects KEY=VALUE, got {pair!r}")
        options[key.strip()] = value
    return options
