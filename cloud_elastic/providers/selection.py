"""Which discovery provider a command line selects, and with what options.

``discovery_options`` adds the discovery flags to a click command (shared by
``run`` and ``discover``) and gathers them into one :class:`DiscoveryArgs`;
``build_discovery`` turns that into a provider instance. Dedicated flags (``-H``, ``--host-discovery-script``, the
cloud flags) are shorthands for ``--provider NAME -o key=value``: the cloud
flags come from one table, :data:`CLOUD_FLAGS`, so adding a cloud flag is one
row. ``--address-map`` applies to every provider (see
:mod:`cloud_elastic.providers.addressmap`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import click

from cloud_elastic.config import MAX_DURATION_S
from cloud_elastic.errors import ConfigError

if TYPE_CHECKING:
    from cloud_elastic.providers.api import HostDiscovery

__all__ = [
    "CloudFlag",
    "CLOUD_FLAGS",
    "DiscoveryArgs",
    "discovery_options",
    "parse_discovery_args",
    "selected_provider",
    "build_discovery",
]


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
    #: Repeatable: the values given are joined with commas into the one option.
    multiple: bool = False

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
    CloudFlag("--k8s-selector", "kubernetes", "selector", "Kubernetes label selector of the worker pods, e.g. app=llm",
              "SELECTOR", selects=True),
    CloudFlag("--k8s-namespace", "kubernetes", "namespace",
              "namespace of the pods (default: the kubeconfig context's or the service account's)", "NS"),
    CloudFlag("--k8s-drain-taint", "kubernetes", "drain_taints",
              "a node taint key that drains the node's pods, besides the known ones (repeatable)", "KEY",
              multiple=True),
    CloudFlag("--kubeconfig", "kubernetes", "kubeconfig",
              "kubeconfig file (default: the service account in a pod, else $KUBECONFIG or ~/.kube/config)", "PATH"),
)


@dataclass(frozen=True)
class DiscoveryArgs:
    """The discovery flags of one command line, as given (no provider loaded yet).

    ``cloud`` maps a :class:`CloudFlag`'s ``dest`` to its value, only for the
    cloud flags that were given.
    """

    hosts: str | None = None
    host_discovery_script: str | None = None
    provider: str | None = None
    provider_option: tuple[str, ...] = ()
    slots_per_host: int | None = None
    discovery_timeout: float = 30.0
    address_map: tuple[str, ...] = ()
    cloud: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def pop_from(cls, params: dict[str, Any]) -> "DiscoveryArgs":
        """Take the discovery flags out of a click command's ``params`` (the rest stay)."""
        base = {name: params.pop(name) for name in _BASE_PARAMS}
        base["provider_option"] = tuple(base["provider_option"])
        base["address_map"] = tuple(base["address_map"])
        cloud = {f.dest: params.pop(f.dest) for f in CLOUD_FLAGS}
        cloud = {k: ",".join(v) if isinstance(v, (tuple, list)) else v for k, v in cloud.items()
                 if v is not None and v != ()}
        return cls(**base, cloud=MappingProxyType(cloud))


#: click parameter names of the discovery flags that are not cloud flags.
_BASE_PARAMS = ("hosts", "host_discovery_script", "provider", "provider_option", "slots_per_host",
                "discovery_timeout", "address_map")


def _complete_provider(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    # Names come from the entry points' metadata: no provider module (and no SDK) is imported.
    from cloud_elastic.providers import registry

    return [name for name in registry.available() if name.startswith(incomplete)]


def discovery_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with every discovery flag.

    The command receives them as one keyword argument, ``discovery``, a
    :class:`DiscoveryArgs`; the cloud flags come from :data:`CLOUD_FLAGS`.
    """

    def gather(**kwargs: Any) -> Any:
        return command(discovery=DiscoveryArgs.pop_from(kwargs), **kwargs)

    gather.__name__ = command.__name__
    gather.__doc__ = command.__doc__
    # Options declared below this decorator were attached to ``command``; keep them.
    gather.__click_params__ = list(getattr(command, "__click_params__", []))  # type: ignore[attr-defined]
    # click applies decorators bottom-up and lists options in reverse: add the cloud flags first
    # (in reverse) so that --help shows -H first and the cloud flags in table order.
    wrapped: Callable[..., Any] = gather
    for cloud_flag in reversed(CLOUD_FLAGS):
        wrapped = click.option(
            cloud_flag.flag, cloud_flag.dest, metavar=cloud_flag.metavar,
            help=cloud_flag.help, multiple=cloud_flag.multiple,
        )(wrapped)
    for decorator in reversed((
        click.option("-H", "--hosts", metavar="HOST[:SLOTS],...", help="a fixed list of hosts"),
        click.option("--host-discovery-script", metavar="PATH", help="executable printing host[:slots] per line"),
        click.option("--provider", metavar="NAME", shell_complete=_complete_provider,
                     help="any installed provider (see 'cloud-elastic providers')"),
        click.option("-o", "--provider-option", metavar="KEY=VALUE", multiple=True,
                     help="an option for --provider (repeatable)"),
        click.option("--slots-per-host", type=int, metavar="N",
                     help="slots on each host; wins over what the provider reports (default 1 for -H/scripts)"),
        click.option("--discovery-timeout", type=float, default=30.0, metavar="SECONDS", show_default=False,
                     help="kill a discovery script that runs longer than this (default 30)"),
        click.option("--address-map", metavar="FROM=TO", multiple=True,
                     help="rewrite discovered addresses, e.g. 10.0.1.0/24=127.0.1.0/24 (repeatable; any provider)"),
    )):
        wrapped = decorator(wrapped)
    return wrapped


def parse_discovery_args(argv: Sequence[str]) -> DiscoveryArgs:
    """Parse discovery flags alone, exactly as ``run`` and ``discover`` do (for tests and tools).

    A flag click refuses raises ConfigError with click's one-line message.
    """
    captured: list[DiscoveryArgs] = []

    @click.command()
    @discovery_options
    def parse(discovery: DiscoveryArgs) -> None:
        captured.append(discovery)

    try:
        parse.main(list(argv), prog_name="cloud-elastic", standalone_mode=False)
    except click.UsageError as exc:
        raise ConfigError(exc.format_message()) from None
    return captured[0]


def selected_provider(args: DiscoveryArgs) -> tuple[str, dict[str, str]]:
    """Return ``(provider name, options)`` for the parsed arguments; ConfigError if ambiguous.

    ``-o key=value`` options go to the provider chosen by ``--provider`` or by
    a cloud group flag (``--aws-asg NAME -o max_attempts=3``). A cloud flag
    and an ``-o`` that set the same option to different values are an error,
    as is a cloud flag for a provider other than the selected one.
    """
    given = [(f, args.cloud[f.dest]) for f in CLOUD_FLAGS if f.dest in args.cloud]
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
            "--azure-vmss, --ibm-instance-group), --k8s-selector or --provider NAME"
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


def build_discovery(args: DiscoveryArgs) -> "HostDiscovery":
    """Load and configure the selected provider. No I/O beyond loading its entry point."""
    # Imported here, not at the top: --help and completion never need importlib.metadata.
    from cloud_elastic.providers import registry
    from cloud_elastic.providers.addressmap import AddressMappedDiscovery, parse_address_map

    from cloud_elastic.providers.api import MAX_SLOTS_PER_HOST

    if args.slots_per_host is not None and not 1 <= args.slots_per_host <= MAX_SLOTS_PER_HOST:
        raise ConfigError(f"--slots-per-host must be 1-{MAX_SLOTS_PER_HOST}, got {args.slots_per_host}")
    if not (math.isfinite(args.discovery_timeout) and 0 < args.discovery_timeout <= MAX_DURATION_S):
        raise ConfigError(f"--discovery-timeout must be a finite number of seconds, > 0 and at most "
                          f"{MAX_DURATION_S:g}, got {args.discovery_timeout!r}")
    name, options = selected_provider(args)
    rules = parse_address_map(list(args.address_map))
    cls = registry.load(name)
    discovery = cls.from_options(options, slots_per_host=args.slots_per_host)
    return AddressMappedDiscovery(discovery, rules) if rules else discovery


def _parse_options(pairs: Sequence[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-o expects KEY=VALUE, got {pair!r}")
        options[key.strip()] = value
    return options
