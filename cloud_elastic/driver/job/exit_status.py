"""How a worker process ended, as the job's rules read it: :class:`ExitStatus` and :func:`signal_name`.

The core consumes both (a failure's cost, the completion rules, the fixed-size job); the launchers
(:mod:`cloud_elastic.driver.launch`) produce them and import them from here.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

__all__ = ["ExitStatus", "signal_name"]


@dataclass(frozen=True)
class ExitStatus:
    """How a worker process ended.

    ``code`` is the exit code (``-N`` when killed by signal N). ``transport_error``
    is set when the launcher's transport failed rather than the worker (for
    SSH: unreachable host, refused key, host key mismatch). ``known`` is False
    for a process whose exit code went to someone else (adopted from a
    predecessor, or started by a local fork server that died before it) and that
    did not say its exit code as it exited (``code`` is then 1).
    """

    code: int
    transport_error: str | None = None
    known: bool = True

    @property
    def describe(self) -> str:
        """One-line human description."""
        if self.transport_error:
            return self.transport_error
        if not self.known:
            return "ended without saying its exit code (this driver could not learn it: its exit code is unknown)"
        if self.code < 0:
            return f"killed by signal {-self.code}"
        return f"exited with code {self.code}"


def signal_name(number: int) -> str:
    """The name of signal ``number`` (``SIGKILL``), or ``signal N`` for one this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
