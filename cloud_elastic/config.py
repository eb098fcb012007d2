"""Job configuration: frozen dataclasses validated on construction.

Environment variables the driver reads are read here and nowhere else
(:func:`elastic_timeout_default`). Durations are seconds and their names end in ``_s``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from cloud_elastic.errors import ConfigError

__all__ = ["JobConfig", "SSHConfig", "elastic_timeout_default", "ENV_ELASTIC_TIMEOUT", "SSH_OPTION", "NOTICE_WATCHERS"]

#: Values of ``--notice-watcher``.
NOTICE_WATCHERS = ("auto", "aws", "gcp", "azure", "none")

#: What an ``--ssh-option`` must look like: ``Key=Value`` or ``Key Value`` (passed as ``ssh -o``).
SSH_OPTION = re.compile(r"([A-Za-z][A-Za-z0-9]*)(\s*=\s*|\s+)\S")

#: Environment variable that sets the default of ``--elastic-timeout`` (Horovod's name).
ENV_ELASTIC_TIMEOUT = "HOROVOD_ELASTIC_TIMEOUT"
_ENV_ELASTIC_TIMEOUT_OURS = "CLOUD_ELASTIC_ELASTIC_TIMEOUT"


def elastic_timeout_default(fallback: float = 600.0) -> float:
    """The default of ``--elastic-timeout``: ``$CLOUD_ELASTIC_ELASTIC_TIMEOUT``, else Horovod's
    ``$HOROVOD_ELASTIC_TIMEOUT``, else ``fallback``; a one-line error if the value is not a number."""
    for var in (_ENV_ELASTIC_TIMEOUT_OURS, ENV_ELASTIC_TIMEOUT):
        raw = os.environ.get(var)
        if raw:
            try:
                return float(raw)
            except ValueError:
                raise ConfigError(f"environment variable {var} must be a number of seconds, got {raw!r}") from None
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
    completion_grace_s: float = 30.0
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
    #: A round in which no worker makes progress this long is aborted (its workers' stacks logged first); 0 = never.
    progress_timeout_s: float = 120.0
    #: A worker whose compute time per step stays this many times the round's median for the window is drained.
    straggler_factor: float = 2.0
    straggler_window_s: float = 60.0
    #: ``--whole-hosts``: every host offers this many slots (``--slots-per-host``) and its workers start, join
    #: rounds and leave together, so each round holds whole hosts; 0 = off (workers come and go one by one).
    whole_host_slots: int = 0

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no training command given (e.g. cloud-elastic run -np 2 python train.py)")
        if self.num_proc < 1:
            raise ConfigError(f"-np must be >= 1, got {self.num_proc}")
        if self.min_np < 1:
            raise ConfigError(f"--min-np must be >= 1, got {self.min_np}")
        if self.max_np < self.min_np:
            raise ConfigError(f"--max-np ({self.max_np}) must be >= --min-np ({self.min_np})")
        if not self.min_np <= self.num_proc <= self.max_np:
            raise ConfigError(
                f"-np ({self.num_proc}) must lie between --min-np ({self.min_np}) and --max-np ({self.max_np})"
            )
        if self.whole_host_slots < 0:
            raise ConfigError(f"--slots-per-host must be >= 1, got {self.whole_host_slots}")
        if self.whole_host_slots:
            counts = {"-np": self.num_proc, "--min-np": self.min_np, "--max-np": self.max_np}
            odd = [f"{flag} {n}" for flag, n in counts.items() if n % self.whole_host_slots]
            if odd:
                raise ConfigError(f"with --whole-hosts, -np, --min-np and --max-np count whole hosts' workers: "
                                  f"{', '.join(odd)} not a multiple of --slots-per-host {self.whole_host_slots}")
        lo, hi = self.cooldown_range_s
        if lo < 0 or hi < lo:
            raise ConfigError(f"--blacklist-cooldown-range needs 0 <= MIN <= MAX, got {lo:g} {hi:g}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ConfigError(f"--reset-limit must be >= 0, got {self.reset_limit}")
        flags = {
            "elastic_timeout_s": "--elastic-timeout",
            "start_timeout_s": "--start-timeout",
            "heartbeat_timeout_s": "--heartbeat-timeout",
            "discovery_interval_s": "--discovery-interval",
        }
        if self.host_missing_grace_s < 0:
            raise ConfigError(f"--host-missing-grace must be >= 0, got {self.host_missing_grace_s:g}")
        if self.driver_grace_s < 0:
            raise ConfigError(f"--driver-grace must be >= 0, got {self.driver_grace_s:g}")
        if not 0 <= self.progress_timeout_s < float("inf"):
            raise ConfigError(f"--progress-timeout must be >= 0 (0: never), got {self.progress_timeout_s:g}")
        if not (self.straggler_factor == 0 or 1 < self.straggler_factor < float("inf")):
            raise ConfigError(f"--straggler-factor must be above 1 (0: never), got {self.straggler_factor:g}")
        if not 0 < self.straggler_window_s < float("inf"):
            raise ConfigError(f"--straggler-window must be > 0, got {self.straggler_window_s:g}")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"--checkpoint-keep must be >= 1, got {self.checkpoint_keep}")
        if self.notice_watcher not in NOTICE_WATCHERS:
            raise ConfigError(
                f"--notice-watcher must be one of {', '.join(NOTICE_WATCHERS)}, got {self.notice_watcher!r}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"--metrics-port must be 0-65535, got {self.metrics_port}")
        flags["checkpoint_interval_s"] = "--checkpoint-interval"
        for name, flag in flags.items():
            if getattr(self, name) <= 0:
                raise ConfigError(f"{flag} must be > 0, got {getattr(self, name):g}")
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            raise ConfigError("--heartbeat-timeout must exceed twice the heartbeat interval")
