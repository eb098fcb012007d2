"""What ``cloud-elastic providers`` and ``cloud-elastic discover`` print.

Both exist so a user can debug a setup before launching anything:
``providers`` lists what is installed and how to configure it; ``discover``
runs one discovery, exactly as the driver's first poll would
(``driver.runtime.discovery.discover``), and prints the snapshot as these
functions shape it.
"""

from __future__ import annotations

import datetime
import importlib.util
from typing import TextIO

from cloud_elastic.errors import CloudElasticError
from cloud_elastic.providers import registry
from cloud_elastic.providers.api import DiscoveredHosts

__all__ = ["list_providers", "snapshot_json", "write_table"]


def list_providers(out: TextIO) -> None:
    """Print every installed provider: name, description, SDK status and options.

    Loads each entry point (never a cloud SDK: providers import those lazily).
    A plugin that fails to load is listed with the reason instead of
    hiding the others.
    """
    names = registry.available()
    shadowed = registry.shadowed()
    for name in names:
        try:
            cls = registry.load(name)
        except CloudElasticError as exc:
            out.write(f"{name}\n    cannot be loaded: {exc}\n\n")
            continue
        out.write(f"{name}\n    {cls.description or '(no description)'}\n")
        for target in shadowed.get(name, ()):  # a plugin that took a built-in's name: it would never run
            out.write(f"    not used: the entry point {name} = {target} (a built-in provider's name)\n")
        missing = [m for m in getattr(cls, "requires", ()) if not _installed(m)]
        if missing:
            extra = getattr(cls, "extra", name)
            out.write(f"    SDK not installed: pip install 'cloud-elastic[{extra}]'\n")
        width = max((len(o.name) for o in cls.options), default=0)
        for opt in cls.options:
            note = " (required)" if opt.required else (f" (default {opt.default})" if opt.default else "")
            out.write(f"    -o {opt.name.ljust(width)}  {opt.help}{note}\n")
        out.write("\n")


def snapshot_json(provider: str, snapshot: DiscoveredHosts) -> dict:
    """The JSON shape of ``discover --json``: ready host -> slots, draining host -> {reason, deadline}; with
    several host sources also host -> source and host -> price per slot-hour (where known)."""
    shape = {
        "provider": provider,
        "ready": dict(snapshot.ready),
        "draining": {h: {"reason": d.reason, "deadline": d.deadline} for h, d in snapshot.draining.items()},
        "total_slots": snapshot.total_slots,
    }
    if snapshot.sources:
        shape.update(sources=dict(snapshot.sources), prices=dict(snapshot.prices))
    return shape


def write_table(snapshot: DiscoveredHosts, out: TextIO) -> None:
    rows = [(host, "ready", str(slots), "", "") for host, slots in snapshot.ready.items()]
    rows += [(host, "draining", "-", _when(d.deadline), d.reason) for host, d in snapshot.draining.items()]
    header: tuple[str, ...] = ("HOST", "STATE", "SLOTS", "DEADLINE", "REASON")
    if snapshot.sources:  # several host sources: which one each host came from, and its price
        price = snapshot.prices.get
        rows = [(*r[:3], snapshot.sources.get(r[0], "-"), "-" if price(r[0]) is None else f"{price(r[0]):.4g}",
                 *r[3:]) for r in rows]
        header = ("HOST", "STATE", "SLOTS", "SOURCE", "$/SLOT-H", "DEADLINE", "REASON")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
    out.write(
        f"{len(snapshot.ready)} ready host(s), {snapshot.total_slots} slot(s); "
        f"{len(snapshot.draining)} draining\n"
    )


def _when(deadline: float | None) -> str:
    if deadline is None:
        return ""
    return datetime.datetime.fromtimestamp(deadline, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
