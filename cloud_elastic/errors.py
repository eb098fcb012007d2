"""Errors raised by cloud-elastic.

The whole tree::

    CloudElasticError                  anything cloud-elastic raises on purpose
    ├── ConfigError                    bad flags, options or environment (CLI exit code 2)
    ├── DiscoveryError                 a discovery provider could not answer
    │   ├── RetryableDiscoveryError    transient: throttling, timeouts, 5xx; retried
    │   ├── FatalDiscoveryError        retrying cannot fix it: no group, no credentials
    │   │   └── MissingDependencyError a cloud SDK is not installed (names the extra)
    │   └── CapacityError              a group's desired capacity could not be set (--manage-capacity)
    │       └── CapacityDeniedError    the credentials may not change the group (AccessDenied)
    ├── ControlPlaneError              a control message was forged, malformed or too big
    ├── LaunchError                    a worker could not be started on a host
    │   └── SSHError                   the SSH transport failed (not the worker)
    ├── CheckpointError                a durable checkpoint could not be written, read or loaded
    │   ├── CheckpointBackendMissing   (also a ConfigError) the URL's fsspec package is missing
    │   └── CheckpointBackendTooOld    (also a ConfigError) it is older than cloud-elastic needs
    └── JobFailed                      the elastic job ended unsuccessfully

Worker control-flow exceptions (``HostsUpdatedInterrupt``, ``CollectiveError``)
live in :mod:`cloud_elastic.worker.exceptions` and deliberately sit *outside*
this tree, so that ``except CloudElasticError`` in user code cannot swallow the
signals the elastic loop depends on.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "CloudElasticError",
    "ConfigError",
    "DiscoveryError",
    "RetryableDiscoveryError",
    "FatalDiscoveryError",
    "MissingDependencyError",
    "require_module",
    "CapacityError",
    "CapacityDeniedError",
    "ControlPlaneError",
    "LaunchError",
    "SSHError",
    "CheckpointError",
    "JobFailed",
]


class CloudElasticError(Exception):
    """Root of every error cloud-elastic raises on purpose."""


class ConfigError(CloudElasticError):
    """Invalid flags, provider options or environment; nothing was started."""


class DiscoveryError(CloudElasticError):
    """A discovery provider could not produce a snapshot of the group."""


class RetryableDiscoveryError(DiscoveryError):
    """Transient discovery trouble (throttling, timeout, 5xx). The poller retries it."""


class FatalDiscoveryError(DiscoveryError):
    """Discovery trouble that retrying cannot fix (no such group, no credentials)."""


class MissingDependencyError(FatalDiscoveryError):
    """An optional package is missing; the message names what needs it and the pip extra to install."""

    def __init__(self, package: str, extra: str, needed_by: str = "this provider") -> None:
        super().__init__(
            f"the {package!r} package is required for {needed_by}; "
            f"install it with: pip install 'cloud-elastic[{extra}]'"
        )
        self.package = package
        self.extra = extra


def require_module(module: str, *, package: str, extra: str, needed_by: str = "this provider") -> ModuleType:
    """Import ``module``, or raise a one-line :class:`MissingDependencyError` naming ``package`` and the pip ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(package, extra, needed_by) from exc


class CapacityError(DiscoveryError):
    """A group's desired capacity could not be set (``--manage-capacity``); the job goes on, retried later."""


class CapacityDeniedError(CapacityError):
    """The credentials may not change the group (AccessDenied): the job goes on without managing it."""


class ControlPlaneError(CloudElasticError):
    """A control-plane message was rejected (bad signature, malformed, oversized)."""


class LaunchError(CloudElasticError):
    """A worker process could not be started."""


class SSHError(LaunchError):
    """The SSH transport failed (unreachable, authentication, host key), not the worker."""


class CheckpointError(CloudElasticError):
    """A checkpoint could not be written or read, or a payload holds something a checkpoint cannot keep.

    ``CheckpointBackendMissing`` and ``CheckpointBackendTooOld`` (in :mod:`cloud_elastic.checkpoint`) are also
    ConfigErrors: the URL needs a package that is not installed, or a newer release of it.
    """


class JobFailed(CloudElasticError):
    """The elastic job ended unsuccessfully; ``reason`` is the one-line explanation."""

    def __init__(self, reason: str, exit_code: int = 1) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code
