"""A user's discovery script (``--host-discovery-script``): prints ``host[:slots]`` per line."""

from __future__ import annotations

import os
import subprocess
from typing import Mapping

from cloud_elastic.errors import ConfigError, RetryableDiscoveryError
from cloud_elastic.providers.api import DiscoveredHosts, HostDiscovery, ProviderOption
from cloud_elastic.providers.hostspec import parse_host_list

__all__ = ["DiscoveryScript"]

_MAX_OUTPUT = 1 << 20


class DiscoveryScript(HostDiscovery):
    """Runs an executable and parses its standard output.

    Every failure of the script (non-zero exit, garbage output, zero or
    negative slots, duplicate hosts, running past ``timeout_s``) raises
    RetryableDiscoveryError with a one-line message; the driver treats the
    first failing call as fatal and later ones as transient, keeping the last
    good snapshot. A hanging script is killed (its whole process group).
    """

    name = "script"
    description = "run an executable that prints host[:slots] per line (what --host-discovery-script uses)"
    options = (
        ProviderOption("path", "path of the executable discovery script", required=True),
        ProviderOption("timeout_s", "seconds before a hanging script is killed", default="30"),
    )

    def __init__(self, path: str, *, slots_per_host: int = 1, timeout_s: float = 30.0) -> None:
        self.path = path
        self.slots_per_host = slots_per_host
        self.timeout_s = timeout_s

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "DiscoveryScript":
        cls.check_options(options)
        path = options["path"]
        if not os.path.isfile(path):
            raise ConfigError(f"discovery script {path!r} does not exist or is not a file")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"discovery script {path!r} is not readable")
        if not os.access(path, os.X_OK):
            raise ConfigError(f"discovery script {path!r} is not executable (chmod +x it)")
        try:
            timeout_s = float(options.get("timeout_s", "30"))
        except ValueError as exc:
            raise ConfigError(f"option 'timeout_s' must be a number, got {options['timeout_s']!r}") from exc
        if timeout_s <= 0:
            raise ConfigError("option 'timeout_s' must be > 0")
        return cls(os.path.abspath(path), slots_per_host=slots_per_host or 1, timeout_s=timeout_s)

    def find(self) -> DiscoveredHosts:
        try:
            proc = subprocess.Popen(
                [self.path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise RetryableDiscoveryError(f"discovery script {self.path} could not start: {exc}") from exc
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RetryableDiscoveryError(
                f"discovery script {self.path} did not finish within {self.timeout_s:g}s and was killed"
            ) from None
        if proc.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise RetryableDiscoveryError(
                f"discovery script {self.path} exited with code {proc.returncode}: {last[0][:200]}"
            )
        if len(out) > _MAX_OUTPUT:
            raise RetryableDiscoveryError(f"discovery script {self.path} printed more than 1 MiB")
        try:
            hosts = parse_host_list(
                out.decode(errors="replace").splitlines(),
                default_slots=self.slots_per_host,
                source=f"discovery script {os.path.basename(self.path)}",
                unit="line",
            )
        except ValueError as exc:
            raise RetryableDiscoveryError(str(exc)) from exc
        return DiscoveredHosts(ready=hosts)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()
