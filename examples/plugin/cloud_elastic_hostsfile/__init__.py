"""An example cloud-elastic discovery plugin: hosts from a JSON file.

Some other program (a scheduler, a cron job, a person) keeps a file such as::

    {
      "ready":    {"10.0.0.5": 4, "10.0.0.6": 4},
      "draining": {"10.0.0.7": {"reason": "maintenance", "deadline": 1767225600}}
    }

up to date, and ``cloud-elastic run --provider hostsfile -o path=hosts.json ...``
follows it. ``draining`` entries may also be a bare reason string.

Failure behaviour, as the ``HostDiscovery`` contract asks:

* a missing file or a file that is not a JSON object with the shape above is a
  FatalDiscoveryError (the path or the writer is wrong: retrying won't help);
* a file that is not valid JSON is a RetryableDiscoveryError: the writer may
  be halfway through rewriting it (write to a temporary file and rename it
  into place to avoid that).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from cloud_elastic.errors import ConfigError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, Drain, HostDiscovery, ProviderOption

__all__ = ["HostsFile"]

_MAX_BYTES = 1 << 20


# Step 1 of writing a plugin: subclass HostDiscovery, name it and declare its options.
class HostsFile(HostDiscovery):
    """Ready and draining hosts read from a JSON file at every call (see module docstring)."""

    name = "hostsfile"
    description = "hosts from a JSON file that another program keeps up to date (example plugin)"
    options = (ProviderOption("path", "JSON file with 'ready' and optional 'draining' tables", required=True),)

    def __init__(self, path: str, *, slots_per_host: int | None = None) -> None:
        self.path = path
        self.slots_per_host = slots_per_host

    # Step 2: from_options validates without I/O; find() returns a complete snapshot every call.
    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "HostsFile":
        cls.check_options(options)
        path = options["path"].strip()
        if not path:
            raise ConfigError("provider 'hostsfile' needs option 'path'")
        return cls(os.path.abspath(path), slots_per_host=slots_per_host)

    def find(self) -> DiscoveredHosts:
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            raise FatalDiscoveryError(f"hosts file {self.path} does not exist") from None
        except OSError as exc:
            raise RetryableDiscoveryError(f"hosts file {self.path} could not be read: {exc.strerror}") from exc
        if len(raw) > _MAX_BYTES:
            raise FatalDiscoveryError(f"hosts file {self.path} is larger than 1 MiB")
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise RetryableDiscoveryError(f"hosts file {self.path} is not valid JSON (being rewritten?): {exc}") from exc
        try:
            return self._snapshot(document)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise FatalDiscoveryError(f"hosts file {self.path}: {exc}") from exc

    def _snapshot(self, document: Any) -> DiscoveredHosts:
        if not isinstance(document, dict) or not isinstance(document.get("ready", {}), dict):
            raise ValueError('expected {"ready": {host: slots}, "draining": {host: reason}}')
        ready = {str(h): self.slots_per_host or _slots(h, s) for h, s in document.get("ready", {}).items()}
        draining = {}
        for host, entry in (document.get("draining") or {}).items():
            if isinstance(entry, str):
                draining[str(host)] = Drain(reason=entry)
            else:
                deadline = entry.get("deadline")
                draining[str(host)] = Drain(deadline=None if deadline is None else float(deadline),
                                            reason=str(entry.get("reason", "draining")))
        return DiscoveredHosts(ready=ready, draining=draining)


def _slots(host: Any, slots: Any) -> int:
    """A host's slot count as the file gives it: a whole number (``true``, ``1.5`` or ``1e400`` is no count)."""
    if isinstance(slots, bool) or not isinstance(slots, (int, str)) or not str(slots).strip().isdigit():
        raise ValueError(f"host {host}: slots must be a whole number, not {json.dumps(slots)}")
    return int(slots)
