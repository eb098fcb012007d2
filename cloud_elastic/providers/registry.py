"""Finding providers through the ``cloud_elastic.providers`` entry-point group.

Only the selected entry point is loaded, so choosing ``static`` never imports
the code (or SDK) of a cloud provider. Built-in providers are registered the
same way in ``pyproject.toml``, so the plugin path is always the one exercised.
"""

from __future__ import annotations

from importlib import metadata

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.api import HostDiscovery

__all__ = ["ENTRY_POINT_GROUP", "available", "load"]

ENTRY_POINT_GROUP = "cloud_elastic.providers"


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """Names of every installed provider, sorted. Loads none of them."""
    return sorted(_entry_points())


def load(name: str) -> type[HostDiscovery]:
    """Load the provider class registered as ``name``.

    Raises ConfigError naming the installed providers when ``name`` is unknown,
    naming the provider when importing it raises anything,
    or when the entry point does not lead to a HostDiscovery subclass.
    """
    eps = _entry_points()
    if name not in eps:
        installed = ", ".join(sorted(eps)) or "none (is cloud-elastic installed with pip?)"
        raise ConfigError(f"unknown discovery provider {name!r}; installed: {installed}")
    try:
        cls = eps[name].load()
    except Exception as exc:  # a plugin's own bug (RuntimeError, SyntaxError) at import is not ours to crash on
        raise ConfigError(f"provider {name!r} could not be imported: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, HostDiscovery)):
        raise ConfigError(f"entry point {name!r} ({eps[name].value}) is not a HostDiscovery subclass")
    return cls
