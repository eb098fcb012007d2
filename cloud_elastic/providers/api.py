"""The ``HostDiscovery`` seam: how the driver learns which hosts can run workers.

Guarantees a provider gives the driver:

* :meth:`HostDiscovery.find` is synchronous and returns a **complete snapshot**
  of the group every call, never a delta. Calling it twice in a row with no
  change in the cloud returns equal results (idempotent).
* A host appears at most once, either in ``ready`` (host -> slots, slots >= 1)
  or in ``draining`` (host -> :class:`Drain`), never both. Hosts that are gone
  simply do not appear.
* Host keys are the addresses workers are started on and reached at (usually a
  private IP). They are stable for the life of an instance, but a cloud may
  give the same address to a later instance: ``instances`` (host -> the cloud's
  instance id, where the source knows one) tells the two apart.
* Every snapshot passes :class:`DiscoveredHosts`' checks, whichever provider built it (a plugin's too):
  at most :data:`MAX_SLOTS_PER_HOST` slots per host, no IPv6 address (the driver listens and routes
  over IPv4 only), no host name over :data:`MAX_HOST_NAME` characters or with a label over
  :data:`MAX_LABEL`, and no name of digits and dots that is not an IPv4 address (``127.0.0.300``).
  A snapshot that breaks them raises :class:`~cloud_elastic.errors.FatalDiscoveryError` with one line
  naming the host.
* Transient trouble raises :class:`~cloud_elastic.errors.RetryableDiscoveryError`;
  trouble retrying cannot fix raises :class:`~cloud_elastic.errors.FatalDiscoveryError`.
  Any other exception is a bug in the provider and is treated as retryable.
* Constructors do no I/O: ``from_options`` validates options only. Cloud SDKs
  are imported lazily, on the first :meth:`find`.

Providers are registered under the entry-point group ``cloud_elastic.providers``
(see :mod:`cloud_elastic.providers.registry`); the built-in ones are registered
the same way in ``pyproject.toml``.
"""

from __future__ import annotations

import abc
import ipaddress
import logging
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping

from cloud_elastic.config import MAX_SLOTS_PER_HOST  # the limit --slots-per-host is held to, too
from cloud_elastic.errors import CapacityError, ConfigError, FatalDiscoveryError

__all__ = ["Drain", "DiscoveredHosts", "MAX_HOSTS", "MAX_SLOTS", "ProviderOption", "HostDiscovery", "lets_go", "parse_bool",
           "MAX_SLOTS_PER_HOST", "MAX_HOST_NAME", "MAX_LABEL", "cancel_find", "host_name_refusal",
           "ipv6_refusal"]

log = logging.getLogger(__name__)


#: The longest host name (DNS's limit, which a worker's own check of the names it is sent stays above), and the
#: longest label between its dots.
MAX_HOST_NAME = 253
MAX_LABEL = 63


def host_name_refusal(host: str) -> str | None:
    """The one line that refuses ``host`` for its length (the name shown cut short), or for digits and dots that
    are no IPv4 address; None when neither. A longer name crashed every worker it was sent to, and a 1 MB one
    wrote megabytes of log. A typo such as ``127.0.0.300`` was started as a local host whose every round failed
    ("Cannot resolve 127.0.0.300") for the whole elastic timeout; ``10.1`` or ``010.0.0.1`` would reach whatever
    address the resolver makes of them (``10.0.0.1``, octal)."""
    shown = repr(host if len(host) <= 40 else host[:40] + "...")
    if len(host) > MAX_HOST_NAME:
        return f"host name {shown} has {len(host):,} characters; at most {MAX_HOST_NAME} are allowed"
    longest = max(host.split("."), key=len)
    if len(longest) > MAX_LABEL:
        return f"host name {shown} has a label of {len(longest)} characters; at most {MAX_LABEL} between dots"
    if _DIGITS_AND_DOTS.match(host):  # no DNS name is all digits (no top-level domain is)
        try:
            ipaddress.IPv4Address(host)
        except ValueError as exc:
            return (f"host {shown} is not an IPv4 address ({exc}); give four numbers from 0 to 255 "
                    "separated by dots, or a host name")
    return None


_DIGITS_AND_DOTS = re.compile(r"^[0-9.]+$")


def ipv6_refusal(host: str) -> str:
    """The one line that refuses an IPv6 ``host``."""
    return (f"host {host!r} is an IPv6 address, which is not supported: the driver listens and routes over "
            "IPv4 only (give an IPv4 address or a host name)")


@dataclass(frozen=True)
class Drain:
    """A host that is leaving: its workers should leave at their next commit.

    ``deadline`` is a Unix timestamp (seconds) when the cloud will take the host,
    or ``None`` when the cloud gives no deadline. ``reason`` is human-readable
    (for example ``"spot interruption"`` or ``"Terminating:Wait"``).
    """

    deadline: float | None = None
    reason: str = "draining"


#: The most hosts (ready and draining) and ready slots one discovery answer may hold: far beyond one job's size,
#: and a bound on the memory and CPU of the driver's planning over every slot (a typo in a script's output
#: that made 10,000 hosts of 1,024 slots took 1.4 GB and 13 s before the first launch).
MAX_HOSTS = 16_384
MAX_SLOTS = 131_072


@dataclass(frozen=True)
class DiscoveredHosts:
    """One complete snapshot of a group: ``ready`` host -> slots, ``draining`` host -> Drain.

    ``instances`` maps hosts (ready or draining) to the cloud's instance id where
    the source knows one (empty for static lists and scripts). The driver uses it
    to map instance-addressed notices (an SQS event names ``i-…``) to hosts and to
    tell a new instance from an old one that held the same address. ``soft``
    (a subset of ``ready``) names hosts with a soft notice.
    """

    ready: Mapping[str, int] = field(default_factory=dict)
    draining: Mapping[str, Drain] = field(default_factory=dict)
    instances: Mapping[str, str] = field(default_factory=dict)
    #: Ready hosts with a soft notice (host -> reason), e.g. an AWS rebalance recommendation:
    #: they keep their workers, but no new worker is placed there.
    soft: Mapping[str, str] = field(default_factory=dict)
    #: Host -> the name of the host source it came from, when the job has several (``providers.multi``).
    sources: Mapping[str, str] = field(default_factory=dict)
    #: Host -> price in dollars per slot-hour, where known (a source's ``price``, an AWS spot price).
    prices: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for host in (*self.ready, *self.draining):  # first: every line below may quote the name
            refusal = host_name_refusal(host) if isinstance(host, str) else None
            if refusal:
                raise FatalDiscoveryError(refusal)
        for host, slots in self.ready.items():
            if not isinstance(host, str) or not host:
                raise ValueError(f"host names must be non-empty strings, got {host!r}")
            if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
                raise ValueError(f"host {host!r} has invalid slot count {slots!r}")
            if slots > MAX_SLOTS_PER_HOST:  # a policy, not a bug: one line, and the job fails (retrying cannot help)
                raise FatalDiscoveryError(f"host {host!r} offers {slots} slots; at most {MAX_SLOTS_PER_HOST} "
                                          "per host are allowed")
        hosts = len(self.ready) + len(self.draining)
        total = sum(self.ready.values())
        if hosts > MAX_HOSTS or total > MAX_SLOTS:  # the driver plans over every slot at each step
            raise FatalDiscoveryError(f"discovery reported {hosts} hosts with {total} slots; at most {MAX_HOSTS} "
                                      f"hosts and {MAX_SLOTS} slots are allowed")
        for host in (*self.ready, *self.draining):
            if isinstance(host, str) and ":" in host:  # no host name has a colon: an IPv6 address, bracketed or not
                raise FatalDiscoveryError(ipv6_refusal(host))
        both = set(self.ready) & set(self.draining)
        if both:
            raise ValueError(f"hosts both ready and draining: {sorted(both)}")
        object.__setattr__(self, "ready", MappingProxyType(dict(self.ready)))
        object.__setattr__(self, "draining", MappingProxyType(dict(self.draining)))
        stray = set(self.instances) - set(self.ready) - set(self.draining)
        if stray:
            raise ValueError(f"instance ids given for hosts not in the snapshot: {sorted(stray)}")
        object.__setattr__(self, "instances", MappingProxyType(dict(self.instances)))
        if set(self.soft) - set(self.ready):
            raise ValueError(f"soft notices for hosts that are not ready: {sorted(set(self.soft) - set(self.ready))}")
        object.__setattr__(self, "soft", MappingProxyType(dict(self.soft)))
        known = set(self.ready) | set(self.draining)
        for name, mapping in (("sources", self.sources), ("prices", self.prices)):
            if set(mapping) - known:
                raise ValueError(f"{name} given for hosts not in the snapshot: {sorted(set(mapping) - known)}")
        for host, price in self.prices.items():
            if not isinstance(price, (int, float)) or isinstance(price, bool) or not 0 <= price < float("inf"):
                raise ValueError(f"host {host!r} has invalid price {price!r} (dollars per slot-hour, >= 0)")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "prices", MappingProxyType(dict(self.prices)))

    @property
    def total_slots(self) -> int:
        """Number of ready slots in the snapshot."""
        return sum(self.ready.values())


@dataclass(frozen=True)
class ProviderOption:
    """One ``-o key=value`` option a provider accepts, for ``cloud-elastic providers``."""

    name: str
    help: str
    required: bool = False
    default: str | None = None


def parse_bool(name: str, value: str) -> bool:
    """Parse a boolean provider option, with a clear error for anything else."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"option {name!r} must be true or false, got {value!r}")


class HostDiscovery(abc.ABC):
    """Where outsiders plug in: tells the driver which hosts can run workers.

    Subclasses set ``name`` (the entry-point name), ``description`` and
    ``options``, implement :meth:`from_options` and :meth:`find`, and may
    override :meth:`close`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[tuple[ProviderOption, ...]] = ()

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "HostDiscovery":
        """Build the provider from ``-o key=value`` options; no I/O.

        ``slots_per_host`` is the user's ``--slots-per-host`` (``None`` when not
        given); when set it wins over what the cloud reports. Raises
        :class:`~cloud_elastic.errors.ConfigError` for unknown or missing options.
        """

    @abc.abstractmethod
    def find(self) -> DiscoveredHosts:
        """Return a complete snapshot of ready and draining hosts (see module docstring)."""

    def release(self, host: str, instance: str | None) -> None:
        """The job no longer needs draining ``host`` (its workers have left).

        Optional write path: a provider whose cloud holds leaving instances for
        the job (an AWS lifecycle hook in ``Terminating:Wait``) lets them go here.
        Called from the driver's discovery thread, at most once per drained
        instance; raises DiscoveryError like :meth:`find`. The default does nothing.
        """

    def releases(self, host: str) -> bool:
        """Whether :meth:`release` of ``host`` lets anything go: only then does the driver log that it released
        the host "to the cloud". The default: whether the class overrides :meth:`release` (a ``-H`` list or a
        discovery script holds nothing). A provider over others (several sources, an address map) asks the one
        behind ``host``."""
        return type(self).release is not HostDiscovery.release

    #: Whether :meth:`set_capacity` can change the group (``--manage-capacity`` refuses a source without it).
    can_set_capacity: ClassVar[bool] = False

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        """Optional write path: set the group's desired capacity to ``hosts`` instances (``--manage-capacity``).

        Called one call of the source at a time (with several sources, on a thread of the
        source's own, which the discovery thread waits for up to the call limit), and only
        for a source the user marked ``fallback`` (``source`` names it when the job has several).
        Idempotent. Raises :class:`~cloud_elastic.errors.CapacityDeniedError` when
        the credentials may not change the group, and
        :class:`~cloud_elastic.errors.CapacityError` for anything else (retried).
        The default raises CapacityError: the provider cannot set a capacity.
        """
        raise CapacityError(f"provider {self.name!r} cannot set a group's desired capacity")

    def capacity_refused(self, exc: CapacityError) -> bool:
        """Whether ``exc``, raised by :meth:`set_capacity`, proves that the cloud refused the call and that no
        attempt of it can have landed (its SDK sent it once, and the cloud answered that one attempt with a
        refusal): the raise is then not the job's, and not carried for a driver restarted after a crash. False
        (the default): the provider cannot tell; a call retried, timed out, answered 5xx or not at all may have
        landed, and stays the job's (it is set back to 0 at the job's end, the cost-safe side)."""
        return False

    def capacity_limits(self) -> tuple[int, int] | tuple[int, int, int] | None:
        """The group's smallest and largest desired capacity (AWS MinSize, MaxSize) as the last :meth:`find`
        read them, and where known its desired capacity then (AWS DesiredCapacity); :meth:`set_capacity` is
        held within them (the cloud refuses a value outside), and never lowers a group whose desired capacity
        is known (a job's raise asked again while instances boot, beside an operator's or the group's own
        raise). None: no limits known (the default)."""
        return None

    def hourly_prices(self, snapshot: DiscoveredHosts) -> Mapping[str, float]:
        """Optional: the price the cloud quotes per instance-hour (dollars) of hosts of ``snapshot``.

        Called after :meth:`find`, one call of the source at a time (on a thread of the
        source's own, which the discovery thread waits for up to the call limit, its last
        prices kept meanwhile), only when the user
        gave no price for the source; a provider caches what it looked up. Hosts
        it cannot price are left out. Raises DiscoveryError like :meth:`find`
        (the job then goes on without those prices). The default knows none.
        """
        return {}

    def wake_on_news(self, wake: Callable[[], None]) -> None:
        """Ask for the next :meth:`find` as soon as news arrives, not at the next poll.

        Optional: a provider with a push source (a notice queue) calls ``wake()``
        from any thread when something came in that the next find() would
        show; ``wake`` returns at once and never blocks. Called once, from the
        discovery thread, after the driver's first find() and before it polls
        on; any receiver the
        provider starts for it stops in :meth:`close`. The default does nothing
        (the provider is polled at ``--discovery-interval`` only).
        """

    def find_limit_s(self, timeout_s: float) -> float:
        """How long the driver waits for one :meth:`find` under ``--discovery-timeout`` ``timeout_s``: optional;
        a provider that bounds its calls itself, longer, says so (the script provider kills its script at its
        own ``timeout_s``). Never less than ``timeout_s`` (``multi.call_limit_s``)."""
        return timeout_s

    def cancel_find(self) -> None:
        """From any thread: end the :meth:`find` running now, where the provider can, and start none again (the
        job is stopping: Ctrl-C during a slow first call). Optional; the default does nothing, and the driver
        stops waiting for the call at once anyway."""

    def close(self) -> None:
        """Release clients and caches. Called once when the driver stops."""

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        """Reject unknown options and missing required ones with a one-line ConfigError."""
        known = {o.name for o in cls.options}
        unknown = sorted(set(options) - known)
        if unknown:
            listing = ", ".join(sorted(known)) or "none"
            raise ConfigError(f"provider {cls.name!r} has no option {unknown[0]!r} (options: {listing})")
        for opt in cls.options:
            if opt.required and not options.get(opt.name):
                raise ConfigError(f"provider {cls.name!r} needs option {opt.name!r}: {opt.help}")


def lets_go(discovery: Any, host: str) -> bool:
    """``discovery.releases(host)``, asked so that a plugin written before that method cannot lose a release: one
    without it, or with an attribute of its own by that name (review rvL: a list there made every release fail,
    or never be called among several sources), or whose answer raises, counts as letting ``host`` go."""
    ask = getattr(discovery, "releases", None)
    if not callable(ask):
        return True
    try:
        return bool(ask(host))
    except Exception:  # noqa: BLE001 - a plugin's bug must not cost a release
        return True


def cancel_find(discovery: HostDiscovery) -> None:
    """``discovery.cancel_find()`` (the job is stopping), where it has one; a failure (a plugin's bug) is logged,
    not raised: the driver stops waiting for the call anyway."""
    cancel = getattr(discovery, "cancel_find", None)
    if cancel is None:
        return
    try:
        cancel()
    except Exception as exc:
        log.warning("discovery provider %s: cancel_find() failed: %s", type(discovery).__name__, exc)
