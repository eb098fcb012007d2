"""Finding providers: the ones this package ships by name, any other through the ``cloud_elastic.providers``
entry-point group.

Only the selected provider is loaded, so choosing ``static`` never imports
the code (or SDK) of a cloud provider. The shipped providers are registered as entry points in
``pyproject.toml`` too (a test checks the two tables agree), so :func:`available` lists them beside the
installed plugins; :func:`load` finds a shipped one without reading any package's metadata
(``importlib.metadata`` and the scan of every installed distribution's entry points were a tenth of a
driver's start-up CPU), and loads any other name through its entry point, as a plugin's.
"""

from __future__ import annotations

import pkgutil
from typing import TYPE_CHECKING, Any

from cloud_elastic.errors import ConfigError
from cloud_elastic.providers.api import HostDiscovery

if TYPE_CHECKING:
    from importlib import metadata

__all__ = ["ENTRY_POINT_GROUP", "SHIPPED", "available", "load", "shadowed"]

ENTRY_POINT_GROUP = "cloud_elastic.providers"

#: The providers this package ships: name -> ``module:Class``, as in pyproject.toml's entry points.
SHIPPED = {
    "static": "cloud_elastic.providers.static:StaticHosts",
    "script": "cloud_elastic.providers.script:DiscoveryScript",
    "aws": "cloud_elastic.providers.aws:AWSAutoScalingGroup",
    "gcp": "cloud_elastic.providers.gcp:GCPManagedInstanceGroup",
    "azure": "cloud_elastic.providers.azure:AzureScaleSet",
    "ibm": "cloud_elastic.providers.ibm:IBMInstanceGroup",
    "kubernetes": "cloud_elastic.providers.kubernetes:KubernetesPods",
}


class _Shipped:
    """A shipped provider, loaded as its entry point would be."""

    def __init__(self, value: str) -> None:
        self.value = value

    def load(self) -> Any:
        return pkgutil.resolve_name(self.value)


def _entry_points() -> dict[str, metadata.EntryPoint]:
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def shadowed() -> dict[str, list[str]]:
    """Installed entry points that take a shipped provider's name but lead elsewhere (a plugin's): shipped name ->
    their targets. They are never loaded: :func:`load` gives the shipped provider."""
    from importlib import metadata

    found: dict[str, list[str]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in SHIPPED and ep.value != SHIPPED[ep.name]:
            found.setdefault(ep.name, []).append(ep.value)
    return found


def available() -> list[str]:
    """Names of every installed provider, sorted. Loads none of them."""
    return sorted({*SHIPPED, *_entry_points()})


def load(name: str) -> type[HostDiscovery]:
    """Load the provider class registered as ``name``.

    Raises ConfigError naming the installed providers when ``name`` is unknown,
    naming the provider when importing it raises anything,
    or when the entry point does not lead to a HostDiscovery subclass.
    """
    eps: dict[str, Any] = {name: _Shipped(SHIPPED[name])} if name in SHIPPED else _entry_points()
    if name not in eps:
        installed = ", ".join(sorted({*SHIPPED, *eps}))
        raise ConfigError(f"unknown discovery provider {name!r}; installed: {installed}")
    try:
        cls = eps[name].load()
    except Exception as exc:  # a plugin's own bug (RuntimeError, SyntaxError) at import is not ours to crash on
        raise ConfigError(f"provider {name!r} could not be imported: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, HostDiscovery)):
        raise ConfigError(f"entry point {name!r} ({eps[name].value}) is not a HostDiscovery subclass")
    return cls
