"""Which discovery provider a command line selects, and with what options.

``discovery_options`` adds the discovery flags to a click command (shared by
``run`` and ``discover``) and gathers them into one :class:`DiscoveryArgs`;
``build_discovery`` turns that into a provider instance. Dedicated flags (``-H``, ``--host-discovery-script``, the
cloud flags) are shorthands for ``--provider NAME -o key=value``: the cloud
flags come from one table, :data:`CLOUD_FLAGS`, so adding a cloud flag is one
row. ``--address-map`` applies to every provider (see
:mod:`cloud_elastic.providers.addressmap`).

The group flags repeat and mix (``--aws-asg a --aws-asg b --gcp-mig c``): each
group is then one host source of a :class:`~cloud_elastic.providers.multi.MultiSourceDiscovery`,
named after the group, and ``--source NAME:KEY=VALUE,...`` gives a source its
priority, price, fallback mark or provider options (see :mod:`.sources`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import click

from cloud_elastic.config import check_seconds
from cloud_elastic.errors import ConfigError

if TYPE_CHECKING:
    from cloud_elastic.providers.api import HostDiscovery
    from cloud_elastic.providers.sources import SourceSpec

__all__ = [
    "CloudFlag",
    "CLOUD_FLAGS",
    "DiscoveryArgs",
    "discovery_options",
    "parse_discovery_args",
    "selected_provider",
    "build_discovery",
    "build_sources",
    "source_specs",
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
    #: Repeatable: the values given are joined with commas into the one option. (A ``selects`` flag
    #: repeats too, but each value is a host source of its own.)
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
    #: Every group flag given, as (flag dest, group), in :data:`CLOUD_FLAGS` order, then as given.
    groups: tuple[tuple[str, str], ...] = ()
    #: ``--source NAME:KEY=VALUE,...`` values, as given.
    source: tuple[str, ...] = ()

    @classmethod
    def pop_from(cls, params: dict[str, Any]) -> "DiscoveryArgs":
        """Take the discovery flags out of a click command's ``params`` (the rest stay)."""
        base = {name: params.pop(name) for name in _BASE_PARAMS}
        for name, flag in _ONE_VALUE.items():  # click keeps the last of a repeated option: refuse instead
            base[name] = _once(flag, base[name])
        if base["discovery_timeout"] is None:
            del base["discovery_timeout"]  # the field's default
        base["provider_option"] = tuple(base["provider_option"])
        base["address_map"] = tuple(base["address_map"])
        base["source"] = tuple(base["source"])
        raw = {f.dest: params.pop(f.dest) for f in CLOUD_FLAGS}
        groups = tuple((f.dest, value) for f in CLOUD_FLAGS if f.selects for value in raw[f.dest] or ())
        cloud = {}
        for flag in CLOUD_FLAGS:
            value = raw[flag.dest]
            if value is None or value == ():
                continue
            # A group flag keeps its first value here (one source: as ever); ``groups`` holds them all.
            cloud[flag.dest] = value[0] if flag.selects else ",".join(value) if flag.multiple else _once(flag.flag, value)
        return cls(**base, cloud=MappingProxyType(cloud), groups=groups)

    @property
    def several(self) -> bool:
        """Whether the command line asks for a multi-source discovery (several groups, or ``--source``)."""
        return len(self.groups) > 1 or bool(self.source)


#: click parameter names of the discovery flags that are not cloud flags.
_BASE_PARAMS = ("hosts", "host_discovery_script", "provider", "provider_option", "slots_per_host",
                "discovery_timeout", "address_map", "source")
#: The host-source flags that take one value (the cloud flags' own are in :data:`CLOUD_FLAGS`): click takes
#: them as repeatable, so that a repeat is refused (:func:`_once`) rather than the first value silently dropped.
_ONE_VALUE = {"hosts": "-H/--hosts", "host_discovery_script": "--host-discovery-script", "provider": "--provider",
              "slots_per_host": "--slots-per-host", "discovery_timeout": "--discovery-timeout"}


def _once(flag: str, values: Sequence[Any] | None) -> Any:
    """The one value of a single-value discovery flag (None when absent); ConfigError when it was repeated:
    ``-H a:1 -H b:1`` would otherwise run on ``b`` alone, and say nothing of ``a``; a ``--slots-per-host``
    appended to a printed command line that has one would be dropped in silence, or win over it."""
    if not values:
        return None
    if len(values) > 1:
        hint = ": give one comma-separated list (-H a:1,b:1)" if flag.startswith("-H") else ": give it once"
        raise ConfigError(f"{flag} given {len(values)} times ({', '.join(map(repr, values))}){hint}")
    return values[0]


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
            help=cloud_flag.help + (" (repeatable: one host source each)" if cloud_flag.selects else ""),
            multiple=True,  # a single-value one refuses a repeat (see pop_from)
        )(wrapped)
    for decorator in reversed((
        click.option("-H", "--hosts", metavar="HOST[:SLOTS],...", multiple=True, help="a fixed list of hosts"),
        click.option("--host-discovery-script", metavar="PATH", multiple=True,
                     help="executable printing host[:slots] per line"),
        click.option("--provider", metavar="NAME", shell_complete=_complete_provider, multiple=True,
                     help="any installed provider (see 'cloud-elastic providers')"),
        click.option("-o", "--provider-option", metavar="KEY=VALUE", multiple=True,
                     help="an option of the selected provider, e.g. -o timeout_s=60 next to "
                          "--host-discovery-script (repeatable)"),
        click.option("--slots-per-host", type=int, metavar="N", multiple=True,
                     help="slots on each host; wins over what the provider reports (default 1 for -H/scripts)"),
        click.option("--discovery-timeout", type=float, metavar="SECONDS", multiple=True,
                     help="give up on a discovery call, and kill a discovery script, that runs longer than this (default 30)"),
        click.option("--address-map", metavar="FROM=TO", multiple=True,
                     help="rewrite discovered addresses, e.g. 10.0.1.0/24=127.0.1.0/24 (repeatable; any provider)"),
        click.option("--source", metavar="NAME:KEY=VALUE,...", multiple=True,
                     help="weigh the host source (group) NAME: priority=N, price=DOLLARS per slot-hour, fallback, "
                          "on_demand_price=DOLLARS per instance-hour (AWS), or an option of its provider "
                          "(repeatable; see docs/multi-source.md)"),
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

    ``-o key=value`` options go to the provider chosen by ``--provider``, by
    a cloud group flag (``--aws-asg NAME -o max_attempts=3``), by ``-H`` or by
    ``--host-discovery-script`` (``-o timeout_s=60``). A shorthand flag and an
    ``-o`` that set the same option to different values are an error, as is a
    cloud flag for a provider other than the selected one, or a key given twice.
    """
    given = [(f, args.cloud[f.dest]) for f in CLOUD_FLAGS if f.dest in args.cloud]
    if args.hosts is not None and not args.hosts.strip():
        raise ConfigError("-H/--hosts is empty: give host[:slots],... (e.g. -H 10.0.0.5:4,10.0.0.6:4)")
    # An unset shell variable ($SCRIPT, $PROVIDER) makes an empty value: named, not taken for a flag never given.
    if args.host_discovery_script is not None and not args.host_discovery_script.strip():
        raise ConfigError("--host-discovery-script is empty: give the path of a script that prints host[:slots] lines")
    if args.provider is not None and not args.provider.strip():
        raise ConfigError("--provider is empty: give a provider's name (cloud-elastic providers lists them)")
    chosen: list[str] = []
    said: list[str] = []  # the flags that chose each, as the user gave them
    if args.hosts:
        chosen.append("static")
        said.append("-H/--hosts")
    if args.host_discovery_script:
        chosen.append("script")
        said.append("--host-discovery-script")
    if args.provider:
        chosen.append(args.provider)
        said.append(f"--provider {args.provider}")
    for f, _ in given:
        if f.selects and f.provider != args.provider:
            chosen.append(f.provider)
            said.append(f.flag)
    if not chosen:
        raise ConfigError(
            "no hosts: give -H/--hosts, --host-discovery-script, a cloud group (--aws-asg, --gcp-mig, "
            "--azure-vmss, --ibm-instance-group), --k8s-selector or --provider NAME"
        )
    if len(chosen) > 1:
        raise ConfigError("choose one host source: " + ", ".join(said) + " were given")
    name = chosen[0]
    for cloud_flag, _ in given:  # before the shorthands return: a flag of another source is never ignored
        if cloud_flag.provider != name:
            owner = next(f.flag for f in CLOUD_FLAGS if f.selects and f.provider == cloud_flag.provider)
            raise ConfigError(f"{cloud_flag.flag} needs {owner} (or --provider {cloud_flag.provider})")
    # -H and --host-discovery-script are shorthands as the cloud flags are: -o gives their provider's other options.
    flags = [(f.flag, f.option, value) for f, value in given]
    if args.hosts:
        flags.insert(0, ("-H", "hosts", args.hosts))
    if args.host_discovery_script:
        flags.insert(0, ("--host-discovery-script", "path", args.host_discovery_script))
    options = _parse_options(args.provider_option)
    if name == "script":  # --discovery-timeout kills the script, unless -o timeout_s gives another
        options.setdefault("timeout_s", str(args.discovery_timeout))
    for flag, option, value in flags:
        if options.get(option, value) != value:
            raise ConfigError(f"{flag} and -o {option}=... disagree; give one")
        options[option] = value
    return name, options


def build_discovery(args: DiscoveryArgs) -> "HostDiscovery":
    """Load and configure the selected provider. No I/O beyond loading its entry point.

    Several groups, or any ``--source``, build a
    :class:`~cloud_elastic.providers.multi.MultiSourceDiscovery` (:func:`build_sources`).
    """
    # Imported here, not at the top: --help needs no provider table.
    from cloud_elastic.providers import registry
    from cloud_elastic.providers.addressmap import AddressMappedDiscovery, parse_address_map

    from cloud_elastic.providers.api import MAX_SLOTS_PER_HOST

    if args.slots_per_host is not None and not 1 <= args.slots_per_host <= MAX_SLOTS_PER_HOST:
        raise ConfigError(f"--slots-per-host must be 1-{MAX_SLOTS_PER_HOST}, got {args.slots_per_host}")
    check_seconds("--discovery-timeout", args.discovery_timeout)
    if args.several:
        return build_sources(args)
    name, options = selected_provider(args)
    rules = parse_address_map(list(args.address_map))
    cls = registry.load(name)
    discovery = cls.from_options(options, slots_per_host=args.slots_per_host)
    return AddressMappedDiscovery(discovery, rules) if rules else discovery


def source_specs(args: DiscoveryArgs) -> "tuple[SourceSpec, ...]":
    """The host sources of a multi-source command line, validated (no provider is loaded).

    Each group flag is one source named after its group; the provider's other
    cloud flags (``--aws-region``) are options of each of its sources, and
    ``--source NAME:...`` adds the source's weights and its own provider options.
    """
    from cloud_elastic.providers.sources import SourceSpec, check_unique, parse_source_flag

    group_flags = ", ".join(f.flag for f in CLOUD_FLAGS if f.selects)
    if args.hosts or args.host_discovery_script or args.provider or args.provider_option:
        if not args.groups:  # one source and --source: the mistake is --source, not "several sources"
            given = next(flag for flag, there in (("-H", args.hosts), ("--host-discovery-script",
                         args.host_discovery_script), ("--provider", args.provider), ("-o", args.provider_option))
                         if there)
            raise ConfigError(f"--source applies only to the cloud group flags ({group_flags}), to weigh their "
                              f"groups; it does not apply to {given}")
        raise ConfigError(f"several host sources come from the group flags ({group_flags}); -H, "
                          "--host-discovery-script, --provider and -o take one source only")
    if not args.groups:
        raise ConfigError("--source weighs a group given by a group flag (e.g. --aws-asg NAME); none was given")
    by_dest = {f.dest: f for f in CLOUD_FLAGS}
    check_unique([(value, f"{by_dest[dest].flag} {value}") for dest, value in args.groups])
    flags = {}
    names = [value for _, value in args.groups]
    for text in args.source:
        parsed = parse_source_flag(text, names)
        if parsed.name in flags:
            raise ConfigError(f"--source {parsed.name}: given twice; put its keys in one --source")
        flags[parsed.name] = parsed
    for name in flags:
        if name not in names:
            raise ConfigError(f"--source {name}: no host source is named {name!r} (sources: {', '.join(names)})")
    specs = []
    for dest, value in args.groups:
        flag = by_dest[dest]
        options = {flag.option: value}
        for other in CLOUD_FLAGS:
            if other.provider == flag.provider and not other.selects and other.dest in args.cloud:
                options[other.option] = args.cloud[other.dest]
        given = flags.get(value)
        if given is not None:
            if flag.option in given.options:
                raise ConfigError(f"--source {value}: {flag.option!r} is the group itself; it cannot be changed")
            options.update(given.options)
        if given is not None and given.on_demand_price is not None and flag.provider != "aws":
            raise ConfigError(f"--source {value}: on_demand_price is read for AWS groups only; give price=")
        specs.append(SourceSpec(
            name=value, provider=flag.provider, options=options,
            priority=given.priority if given is not None and given.priority is not None else 0,
            price=given.price if given is not None else None,
            on_demand_price=given.on_demand_price if given is not None else None,
            fallback=bool(given.fallback) if given is not None else False,
        ))
    queues = [s.options["notice_queue"] for s in specs if s.options.get("notice_queue")]
    if len(queues) != len(set(queues)):
        # Each source reads and deletes what its queue holds: a shared queue would lose one group's notices.
        raise ConfigError("a notice queue can serve one host source only (each reads and deletes what it holds): "
                          "give each AWS group its own with --source NAME:notice_queue=URL")
    if all(s.fallback for s in specs):
        raise ConfigError("every host source is marked fallback; at least one must not be")
    return tuple(specs)


def build_sources(args: DiscoveryArgs) -> "HostDiscovery":
    """A MultiSourceDiscovery over :func:`source_specs`; each source has the address map of its own."""
    from cloud_elastic.providers import registry
    from cloud_elastic.providers.addressmap import AddressMappedDiscovery, parse_address_map
    from cloud_elastic.providers.multi import MultiSourceDiscovery

    specs = source_specs(args)
    rules = parse_address_map(list(args.address_map))
    built = []
    for spec in specs:
        options = dict(spec.options)
        if spec.on_demand_price is not None:
            # In plain digits, as the provider's option takes it: repr() writes 0.00001 as 1e-05.
            options["on_demand_price"] = format(Decimal(repr(spec.on_demand_price)), "f")
        try:
            discovery = registry.load(spec.provider).from_options(options, slots_per_host=args.slots_per_host)
        except ConfigError as exc:
            raise ConfigError(f"host source {spec.name!r}: {exc}") from None
        built.append((spec, AddressMappedDiscovery(discovery, rules) if rules else discovery))
    return MultiSourceDiscovery(built)


def _parse_options(pairs: Sequence[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-o expects KEY=VALUE, got {pair!r}")
        if key.strip() in options:  # as a repeated -H: the first value must not be dropped in silence
            raise ConfigError(f"-o {key.strip()} given twice ({options[key.strip()]!r}, {value!r}): give it once")
        options[key.strip()] = value
    return options
