"""How a worker process ended, as the job's rules read it: :class:`ExitStatus` and :func:`signal_name`.

The core consumes both (a failure's cost, the completion rules, the fixed-size job); the launchers
(:mod:`cloud_elastic.driver.launch`) produce them and import them from here. :class:`LastErrors` keeps
the last error line of each worker's output (the driver reads every line of it, local and SSH alike), so
that a worker killed by a signal (Gloo's ``std::terminate``: SIGABRT) is named with what it said.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace

__all__ = ["ExitStatus", "LastErrors", "signal_name"]

#: An output line that reads as an error: a C++ exception's ``what():`` (Gloo's ``EnforceNotMet``), ``terminate
#: called ...``, or a Python ``SomeError: ...`` / ``SomeException: ...`` line (not faulthandler's dump that follows).
_ERROR_LINE = re.compile(r"\s*(what\(\):|terminate called|[\w.]*(Error|Exception)\b[^:]*:)")

#: The most characters of that line an exit status carries.
MAX_LAST_ERROR = 300


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
    #: The last error line of its output, for a process killed by a signal ('' for none; see :class:`LastErrors`).
    last_error: str = ""

    @property
    def describe(self) -> str:
        """One-line human description."""
        if self.transport_error:
            return self.transport_error
        if not self.known:
            return "ended without saying its exit code (this driver could not learn it: its exit code is unknown)"
        if self.code < 0:
            return f"killed by signal {-self.code}" + (f" after printing: {self.last_error}" if self.last_error else "")
        return f"exited with code {self.code}"


class LastErrors:
    """The last error line (:data:`_ERROR_LINE`, at most :data:`MAX_LAST_ERROR` characters) of each live worker's
    output, fed a line at a time by its output thread; :meth:`attach` hands it to the worker's exit status when a
    signal ended it, and forgets it either way. One short string per live worker; a dict's item set or pop is
    atomic, so the output threads need no lock."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def offer(self, worker_id: str, line: str) -> None:
        if _ERROR_LINE.match(line):
            self._last[worker_id] = line.strip()[:MAX_LAST_ERROR]

    def attach(self, worker_id: str, status: ExitStatus) -> ExitStatus:
        last = self._last.pop(worker_id, "")
        return replace(status, last_error=last) if last and status.known and status.code < 0 else status


def signal_name(number: int) -> str:
    """The name of signal ``number`` (``SIGKILL``), or ``signal N`` for one this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
