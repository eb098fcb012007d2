"""Job configuration: frozen dataclasses validated on construction.

Environment variables the driver reads are read here and nowhere else
(:func:`elastic_timeout_default`). Durations are seconds and their names end in ``_s``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from cloud_elastic.errors import ConfigError

__all__ = ["JobConfig", "SSHConfig", "elastic_timeout_default", "ENV_ELASTIC_TIMEOUT", "SSH_OPTION", "NOTICE_WATCHERS",
           "MAX_DRIVER_GRACE_S", "MAX_DURATION_S", "past_grace_s", "check_seconds", "checkpoint_protocol_error",
           "ENV_NAME",
           "MIN_HEARTBEAT_TIMEOUT_S", "MIN_DISCOVERY_INTERVAL_S", "MIN_PROGRESS_TIMEOUT_S"]

#: The longest duration any flag or setting may give (a year). Longer ones are typos, and they break
#: what they reach: ``threading`` waits refuse more than ~292 years, ``datetime`` arithmetic overflows, and a
#: ``--driver-grace`` of 1e12 s written beside the checkpoints crashed the driver that read it back.
MAX_DURATION_S = 365 * 86400.0
#: The most slots one host may offer. The largest machines have 8-16 accelerators; a count beyond this is a
#: typo (``-H host:100000000`` made the driver build a slot list of 1.8 GB in 20 s, under its job lock,
#: deaf to SIGTERM), so every host source is held to it (:mod:`cloud_elastic.providers.api`) and so is
#: ``--slots-per-host``.
MAX_SLOTS_PER_HOST = 1024
#: The longest ``--driver-grace``: a restarted driver reads it back from ``driver-alive.json`` beside the
#: checkpoints and refuses a longer one there (``checkpoint/alive.py``), so it is refused here first.
MAX_DRIVER_GRACE_S = 7 * 86400.0


def past_grace_s(heartbeat_timeout_s: float) -> float:
    """How long past the end of its ``--driver-grace`` a worker may still wait on one call to a driver that stopped
    answering without refusing (its node lost, its traffic dropped): a call is cut at the grace's end, but never
    shorter than a heartbeat's hold (a quarter of the heartbeat timeout, ``ControlPlane.poll_hold_s``) and 1 s. A
    restarted driver waits that much more for the old workers (review h32: they trained on a whole call, 15 s, past
    the grace, beside the new driver's workers)."""
    return heartbeat_timeout_s / 4 + 1.0


#: ``--spares`` at most: a spare holds a slot the job pays for, so a larger number is a mistake, not a plan.
MAX_SPARES = 1024

#: The shortest durations a job works with (a one-line error below them names the flag). A heartbeat timeout
#: under a second gives workers up between two of their heartbeats; a discovery interval under 0.1 s runs a
#: discovery script back to back; a progress timeout under 5 s aborts rounds that are still starting.
MIN_HEARTBEAT_TIMEOUT_S = 1.0
MIN_DISCOVERY_INTERVAL_S = 0.1
MIN_PROGRESS_TIMEOUT_S = 5.0

#: What a ``-x``/``--env`` name must be: a shell variable name, which every launcher can pass on (ssh's
#: ``env NAME=VALUE`` too); an empty one made the worker's ``os.environ`` update raise.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: Values of ``--notice-watcher``.
NOTICE_WATCHERS = ("auto", "aws", "gcp", "azure", "none")

#: What an ``--ssh-option`` must look like: ``Key=Value`` or ``Key Value`` (passed as ``ssh -o``).
SSH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)(\s*=\s*|\s+)\S")

#: Environment variable that sets the default of ``--elastic-timeout`` (Horovod's name).
ENV_ELASTIC_TIMEOUT = "HOROVOD_ELASTIC_TIMEOUT"
_ENV_ELASTIC_TIMEOUT_OURS = "CLOUD_ELASTIC_ELASTIC_TIMEOUT"


def check_seconds(flag: str, value: float, *, zero_ok: bool = False) -> None:
    """A one-line ConfigError unless ``value`` is a finite number of seconds, > 0 (>= 0 with ``zero_ok``),
    at most :data:`MAX_DURATION_S`. NaN fails every comparison, so it must be refused by name: ``nan <= 0`` is
    false, and a NaN heartbeat timeout meant a stopped worker was never given up."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(f"{flag} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{flag} must be {'>= 0' if zero_ok else '> 0'}, got {value:g}")
    if value > MAX_DURATION_S:
        raise ConfigError(f"{flag} must be at most {MAX_DURATION_S:g} seconds (a year), got {value:g}")


def checkpoint_protocol_error(url: str) -> str | None:
    """Why ``--checkpoint-dir URL`` names a protocol fsspec does not know (one line), or None.

    A plain path or ``file://`` is always fine; without fsspec installed the checkpoint backend names the
    extra to install when the job starts, so only a protocol an installed fsspec cannot resolve is refused
    here, before anything starts (it used to surface as fsspec's traceback from the running driver).
    """
    import importlib.util

    if "://" not in url and "::" not in url:
        return None
    protocols = []
    for bit in url.split("::"):
        if "://" in bit:
            protocols.append(bit.split("://", 1)[0].lower())
        elif bit and "/" not in bit:
            protocols.append(bit.lower())  # a chained wrapper: simplecache::s3://...
    protocols = [p for p in protocols if p != "file"]
    if not protocols or importlib.util.find_spec("fsspec") is None:
        return None
    from fsspec.registry import known_implementations, registry

    for protocol in protocols:
        if protocol not in known_implementations and protocol not in registry:
            return (f"--checkpoint-dir {url!r}: no fsspec implementation knows the protocol {protocol!r} "
                    "(e.g. s3://, gs://, az://, or a local path)")
    return None


def elastic_timeout_default(fallback: float = 600.0) -> float:
    """The default of ``--elastic-timeout``: ``$CLOUD_ELASTIC_ELASTIC_TIMEOUT``, else Horovod's
    ``$HOROVOD_ELASTIC_TIMEOUT``, else ``fallback``; a one-line error if the value is not a number."""
    for var in (_ENV_ELASTIC_TIMEOUT_OURS, ENV_ELASTIC_TIMEOUT):
        raw = os.environ.get(var)
        if raw:
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"environment variable {var} must be a number of seconds, got {raw!r}") from None
            check_seconds(f"environment variable {var}", value)
            return value
    return fallback


@dataclass(frozen=True)
class SSHConfig:
    """How the driver reaches non-local hosts. ``None`` fields use ssh's own defaults."""

    port: int | None = None
    identity_file: str | None = None
    user: str | None = None
    extra_options: tuple[str, ...] = ()
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.port is not None and not 0 < self.port < 65536:
            raise ConfigError(f"--ssh-port must be 1-65535, got {self.port}")
        check_seconds("the ssh connect timeout", self.connect_timeout_s)
        if self.identity_file is not None and self.identity_file.startswith("~"):  # as ssh -i reads it: a run line
            # written into a unit file or passed without a shell (terraform's printed line) keeps its "~"
            object.__setattr__(self, "identity_file", os.path.expanduser(self.identity_file))
        if self.identity_file is not None and not os.path.isfile(self.identity_file):
            raise ConfigError(f"--ssh-identity-file {self.identity_file!r} does not exist")
        for option in self.extra_options:
            if not SSH_OPTION.match(option):
                raise ConfigError(f"--ssh-option {option!r} must look like Key=Value (it is passed as ssh -o)")


@dataclass(frozen=True)
class JobConfig:
    """Everything the driver needs to run one elastic job."""

    command: tuple[str, ...]
    num_proc: int
    min_np: int
    max_np: int
    elastic_timeout_s: float = 600.0
    start_timeout_s: float = 600.0
    reset_limit: int | None = None
    #: ``--restarts``: a fixed-size job (a script without ``hvd.elastic.run``) starts again after a failure
    #: up to this many times (see ``driver.fixed``).
    restarts: int = 0
    cooldown_range_s: tuple[float, float] = (10.0, 300.0)
    discovery_interval_s: float = 1.0
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 5.0
    #: ``--finish-timeout``: once training completed, the work after it (a final save, an evaluation) gets this long
    #: before its workers are stopped and the job fails; None = as long as the workers heartbeat.
    finish_timeout_s: float | None = None
    terminate_grace_s: float = 5.0
    driver_address: str | None = None
    network_interface: str | None = None
    forward_env: tuple[str, ...] = ()
    cwd: str = field(default_factory=os.getcwd)
    ssh: SSHConfig = field(default_factory=SSHConfig)
    verbose: bool = False
    force_ssh: bool = False
    #: A host missing from discovery without a draining state leaves only after this long.
    host_missing_grace_s: float = 10.0
    #: Durable checkpoints: local path or fsspec URL; None = in-memory commits only.
    checkpoint_dir: str | None = None
    checkpoint_interval_s: float = 300.0
    checkpoint_keep: int = 2
    #: How long workers keep training without a driver before they stop.
    driver_grace_s: float = 60.0
    #: Which instance-metadata notice watcher runs on worker hosts: auto (from the provider), aws, gcp, azure, none.
    notice_watcher: str = "auto"
    #: Treat a rebalance recommendation / maintenance event like a termination notice.
    drain_on_rebalance: bool = False
    #: JSON-lines events file; None = no events file.
    events_file: str | None = None
    #: Prometheus metrics port; None = off.
    metrics_port: int | None = None
    #: The address the metrics server binds (``--metrics-addr``): loopback unless the user opens it up.
    metrics_addr: str = "127.0.0.1"
    #: A round in which no worker makes progress this long is aborted (its workers' stacks logged first); 0 = never.
    progress_timeout_s: float = 120.0
    #: A worker whose compute time per step stays this many times the round's median for the window is drained.
    straggler_factor: float = 2.0
    straggler_window_s: float = 60.0
    #: ``--whole-hosts``: every host offers this many slots (``--slots-per-host``) and its workers start, join
    #: rounds and leave together, so each round holds whole hosts; 0 = off (workers come and go one by one).
    whole_host_slots: int = 0
    #: ``--fallback-after``: with several host sources, below -np from the preferred ones this long, the fallback
    #: source tops the job up to -np (None: only below --min-np; see docs/multi-source.md).
    fallback_after_s: float | None = None
    #: ``--manage-capacity``: the driver raises a fallback group's desired capacity when the job needs it, and
    #: sets it back to 0 when the job is done with it; never otherwise.
    manage_capacity: bool = False
    #: ``--spares``: workers started beyond ``--max-np`` that wait outside the rounds to take the place of a lost
    #: or leaving member in the same round; under ``--whole-hosts`` whole hosts (see driver/job/spares.py).
    spares: int = 0

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no training command given (e.g. cloud-elastic run -np 2 python train.py)")
        if self.num_proc < 1:
            raise ConfigError(f"-np must be >= 1, got {self.num_proc}")
        if self.min_np < 1:
            raise ConfigError(f"--min-np must be >= 1, got {self.min_np}")
        if self.max_np < self.min_np:
            if self.num_proc < self.min_np:  # --max-np defaults to -np: name the flags the user set
                raise ConfigError(f"--min-np ({self.min_np}) must be <= -np ({self.num_proc})")
            if self.max_np < self.num_proc:  # and --min-np to -np
                raise ConfigError(f"-np ({self.num_proc}) must be <= --max-np ({self.max_np})")
            raise ConfigError(f"--max-np ({self.max_np}) must be >= --min-np ({self.min_np})")
        for item in self.forward_env:
            name = item.partition("=")[0]
            if not ENV_NAME.match(name):
                raise ConfigError(f"-x/--env {item!r}: {name!r} is not an environment variable name (letters, digits "
                                  "and _, not starting with a digit)")
        if not self.min_np <= self.num_proc <= self.max_np:
            raise ConfigError(
                f"-np ({self.num_proc}) must lie between --min-np ({self.min_np}) and --max-np ({self.max_np})"
            )
        if not 0 <= self.whole_host_slots <= MAX_SLOTS_PER_HOST:
            raise ConfigError(f"--slots-per-host must be 1-{MAX_SLOTS_PER_HOST}, got {self.whole_host_slots}")
        if self.whole_host_slots:
            counts = {"-np": self.num_proc, "--min-np": self.min_np, "--max-np": self.max_np}
            # --min-np and --max-np default to -np: named only where they say something -np does not
            odd = [f"{flag} {n}" for flag, n in counts.items()
                   if n % self.whole_host_slots and (flag == "-np" or n != self.num_proc)]
            if odd:
                raise ConfigError(f"with --whole-hosts, -np, --min-np and --max-np count whole hosts' workers: "
                                  f"{', '.join(odd)} not a multiple of --slots-per-host {self.whole_host_slots}")
        self._check_numbers()
        if not 0 <= self.spares <= MAX_SPARES:
            raise ConfigError(f"--spares must be 0-{MAX_SPARES}, got {self.spares}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ConfigError(f"--reset-limit must be >= 0, got {self.reset_limit}")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"--checkpoint-keep must be >= 1, got {self.checkpoint_keep}")
        if self.notice_watcher not in NOTICE_WATCHERS:
            raise ConfigError(
                f"--notice-watcher must be one of {', '.join(NOTICE_WATCHERS)}, got {self.notice_watcher!r}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"--metrics-port must be 0-65535, got {self.metrics_port}")
        if not self.metrics_addr.strip() or any(c.isspace() for c in self.metrics_addr):
            raise ConfigError(f"--metrics-addr must be an address or host name, got {self.metrics_addr!r}")
        if self.driver_address is not None and ":" in self.driver_address:
            raise ConfigError(f"--driver-address {self.driver_address!r}: IPv6 is not supported (the driver listens "
                              "and routes over IPv4 only); give an IPv4 address or a host name")
        if self.checkpoint_dir is not None:
            why = checkpoint_protocol_error(self.checkpoint_dir)
            if why is not None:
                raise ConfigError(why)
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ConfigError("--heartbeat-timeout must exceed twice the heartbeat interval")

    def _check_numbers(self) -> None:
        """Every duration finite and within :data:`MAX_DURATION_S`; the factor and the cooldowns too."""
        lo, hi = self.cooldown_range_s
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi):  # NaN compares false: refused here
            raise ConfigError(f"--blacklist-cooldown-range needs 0 <= MIN <= MAX, got {lo:g} {hi:g}")
        check_seconds("--blacklist-cooldown-range MAX", hi, zero_ok=True)
        positive = {
            "--elastic-timeout": self.elastic_timeout_s,
            "--start-timeout": self.start_timeout_s,
            "--heartbeat-timeout": self.heartbeat_timeout_s,
            "--discovery-interval": self.discovery_interval_s,
            "--checkpoint-interval": self.checkpoint_interval_s,
            "--straggler-window": self.straggler_window_s,
            "the heartbeat interval": self.heartbeat_interval_s,
        }
        floors = (("--heartbeat-timeout", self.heartbeat_timeout_s, MIN_HEARTBEAT_TIMEOUT_S, ""),
                  ("--discovery-interval", self.discovery_interval_s, MIN_DISCOVERY_INTERVAL_S, ""),
                  ("--progress-timeout", self.progress_timeout_s, MIN_PROGRESS_TIMEOUT_S, " (or 0: never)"))
        for flag, value, floor, besides in floors:  # first: 0 is below the floor, not just "not > 0"
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)  # else check_seconds says
            if numeric and math.isfinite(value) and value < floor and not (besides and value == 0):
                raise ConfigError(f"{flag} must be at least {floor:g}s{besides}, got {value:g}")
        for flag, value in positive.items():
            check_seconds(flag, value)
        zero_ok = {
            "--host-missing-grace": self.host_missing_grace_s,
            "--driver-grace": self.driver_grace_s,
            "--progress-timeout": self.progress_timeout_s,
            "the terminate grace": self.terminate_grace_s,
        }
        for flag, value in zero_ok.items():
            check_seconds(flag, value, zero_ok=True)
        if self.fallback_after_s is not None:
            check_seconds("--fallback-after", self.fallback_after_s, zero_ok=True)
        if self.finish_timeout_s is not None:
            check_seconds("--finish-timeout", self.finish_timeout_s)
        if self.driver_grace_s > MAX_DRIVER_GRACE_S:
            raise ConfigError(f"--driver-grace must be at most {MAX_DRIVER_GRACE_S:g} seconds (7 days), "
                              f"got {self.driver_grace_s:g}")
        factor = self.straggler_factor
        if not (factor == 0 or (math.isfinite(factor) and 1 < factor <= 1000)):
            raise ConfigError(f"--straggler-factor must be above 1 and at most 1000 (0: never), got {factor:g}")
