"""Which discovery provider a command line selects, and with what options.

``add_discovery_arguments`` adds the discovery flags to a parser (shared by
``run`` and ``discover``); ``build_discovery`` turns parsed arguments into a
provider instance. Dedicated flags (``-H``, ``--host-discovery-script``, the
cloud flags) are shorthands for ``--provider NAME -o key=value``: the cloud
flags come from one table, :data:`CLOUD_FLAGS`, so adding a cloud flag is one
row. ``--address-map`` applies to every provider (see
:mod:`cloud_elastic.providers.addressmap`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers import registry
from cloud_elastic.providers.addressmap import AddressMappedDiscovery, parse_address_map
from cloud_elastic.providers.api import HostDiscovery

__all__ = ["CloudFlag", "CLOUD_FLAGS", "add_discovery_arguments", "selected_provider", "build_discovery"]


@dataclass(frozen=True)
class CloudFlag:
    """A shorthand flag for one option of one provider.

    A ``selects`` flag chooses its provider by itself (``--aws-asg NAME`` is
    ``--provider aws -o group=NAME``); the others add an option to it and are
    an error when their provider is not the one selected.
    """

    flag: str
    provider: str
    option: str
    help: str
    metavar: str = "VALUE"
    selects: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


CLOUD_FLAGS: tuple[CloudFlag, ...] = (
    CloudFlag("--aws-asg", "aws", "group", "AWS Auto Scaling group name", "NAME", selects=True),
    CloudFlag("--aws-region", "aws", "region", "AWS region (default: boto3's configuration)", "REGION"),
    CloudFlag("--aws-endpoint-url", "aws", "endpoint_url", "AWS endpoint (default: AWS_ENDPOINT_URL)", "URL"),
    CloudFlag("--aws-notice-queue", "aws", "notice_queue",
              "SQS queue URL carrying spot, rebalance and lifecycle events for the group", "URL"),
    CloudFlag("--gcp-mig", "gcp", "group", "GCP Managed Instance Group name", "NAME", selects=True),
    CloudFlag("--gcp-project", "gcp", "project", "GCP project ID", "PROJECT"),
    CloudFlag("--gcp-zone", "gcp", "zone", "zone of a zonal MIG", "ZONE"),
    CloudFlag("--gcp-region", "gcp", "region", "region of a regional MIG", "REGION"),
    CloudFlag("--gcp-endpoint", "gcp", "endpoint", "Compute API endpoint", "URL"),
    CloudFlag("--azure-vmss", "azure", "group", "Azure scale set name", "NAME", selects=True),
    CloudFlag("--azure-resource-group", "azure", "resource_group", "resource group of the scale set", "GROUP"),
    CloudFlag("--azure-subscription", "azure", "subscription", "subscription ID (default: AZURE_SUBSCRIPTION_ID)", "ID"),
    CloudFlag("--azure-endpoint", "azure", "endpoint", "Resource Manager endpoint", "URL"),
    CloudFlag("--ibm-instance-group", "ibm", "group", "IBM Cloud VPC instance group ID", "ID", selects=True),
    CloudFlag("--ibm-region", "ibm", "region", "IBM Cloud VPC region", "REGION"),
    CloudFlag("--ibm-endpoint", "ibm", "endpoint", "VPC API URL (default: VPC_URL or the region's)", "URL"),
)


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
    group.add_argument(
        "--address-map", metavar="FROM=TO", action="append", default=[],
        help="rewrite discovered addresses, e.g. 10.0.1.0/24=127.0.1.0/24 (repeatable; any provider)",
    )
    clouds = parser.add_argument_group("cloud groups (shorthands for --provider NAME -o key=value)")
    for cloud_flag in CLOUD_FLAGS:
        clouds.add_argument(cloud_flag.flag, dest=cloud_flag.dest, metavar=cloud_flag.metavar, help=cloud_flag.help)


def selected_provider(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """Return ``(provider name, options)`` for the parsed arguments; ConfigError if ambiguous.

    ``-o key=value`` options go to the provider chosen by ``--provider`` or by
    a cloud group flag (``--aws-asg NAME -o max_attempts=3``). A cloud flag
    and an ``-o`` that set the same option to different values are an error,
    as is a cloud flag for a provider other than the selected one.
    """
    given = [(f, getattr(args, f.dest, None)) for f in CLOUD_FLAGS]
    given = [(f, value) for f, value in given if value is not None]
    chosen: list[str] = []
    if args.hosts:
        chosen.append("static")
    if args.host_discovery_script:
        chosen.append("script")
    if args.provider:
        chosen.append(args.provider)
    chosen.extend(f.provider for f, _ in given if f.selects and f.provider != args.provider)
    if not chosen:
        raise ConfigError(
            "no hosts: give -H/--hosts, --host-discovery-script, a cloud group (--aws-asg, --gcp-mig, "
            "--azure-vmss, --ibm-instance-group) or --provider NAME"
        )
    if len(chosen) > 1:
        raise ConfigError("choose one host source: " + " / ".join(chosen) + " were given")
    name = chosen[0]
    if name in ("static", "script") and args.provider_option:
        raise ConfigError("-o/--provider-option needs --provider NAME or a cloud group flag")
    if name == "static":
        return name, {"hosts": args.hosts}
    if name == "script":
        return name, {"path": args.host_discovery_script, "timeout_s": str(args.discovery_timeout)}
    options = _parse_options(args.provider_option)
    for cloud_flag, value in given:
        if cloud_flag.provider != name:
            owner = next(f.flag for f in CLOUD_FLAGS if f.selects and f.provider == cloud_flag.provider)
            raise ConfigError(f"{cloud_flag.flag} needs {owner} (or --provider {cloud_flag.provider})")
        if options.get(cloud_flag.option, value) != value:
            raise ConfigError(f"{cloud_flag.flag} and -o {cloud_flag.option}=... disagree; give one")
        options[cloud_flag.option] = value
    return name, options


def build_discovery(args: argparse.Namespace) -> HostDiscovery:
    """Load and configure the selected provider. No I/O beyond loading its entry point."""
    if args.slots_per_host is not None and args.slots_per_host < 1:
        raise ConfigError(f"--slots-per-host must be >= 1, got {args.slots_per_host}")
    name, options = selected_provider(args)
    rules = parse_address_map(getattr(args, "address_map", None) or [])
    cls = registry.load(name)
    discovery = cls.from_options(options, slots_per_host=args.slots_per_host)
    return AddressMappedDiscovery(discovery, rules) if rules else discovery


def _parse_options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-o expects KEY=VALUE, got {pair!r}")
        options[key.strip()] = value
    return options
