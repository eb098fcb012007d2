"""How a worker process ended, as the job's rules read it: :class:`ExitStatus` and :func:`signal_name`.

The core consumes both (a failure's cost, the completion rules, the fixed-size job); the launchers
(:mod:`cloud_elastic.driver.launch`) produce them and import them from here. :class:`LastErrors` keeps
the last error line of each worker's output (the driver reads every line of it, local and SSH alike), so
that a worker that crashed (Gloo's ``std::terminate``: SIGABRT) is named with what it said just before.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace
from typing import Callable

from cloud_elastic.driver.job.repeats import CRASH_SIGNALS, death_signal
from cloud_elastic.protocol_reports import MAX_ERROR_LINE, error_line, said_own_reason

__all__ = ["ExitStatus", "LastErrors", "reported_error_line", "signal_name"]

#: An output line that reads as an error: a C++ exception's ``what():`` (Gloo's ``EnforceNotMet``), ``terminate
#: called ...``, a Python ``SomeError: ...`` / ``SomeException: ...`` line (not faulthandler's dump that follows),
#: the interpreter's own ``python3: can't open file '...': [Errno 2] ...`` (a script's name mistyped), or argparse's
#: ``train.py: error: argument --lr: invalid float value: 'x'`` (a script's option mistyped: exit code 2).
#: Bounded, as it runs on every line a worker prints, under the driver's GIL: unbounded ``[\w.]*`` and ``[^:]*``
#: backtracked quadratically on a long line of ``Error.`` tokens without a colon (1.5 s for 64 KB).
_ERROR_LINE = re.compile(r"\s*(what\(\):|terminate called|[\w.]{0,200}(Error|Exception)\b[^:]{0,200}:"
                         r"|[^\s:]{0,200}: can't open file |[^\s:]{1,200}: error: )")

#: Only this many leading characters of a line are looked at (:data:`_ERROR_LINE`): an error line's head, its
#: colon included, comes well before; what follows is at most :data:`MAX_LAST_ERROR` characters kept anyway.
ERROR_SCAN_CHARS = 512

#: The most characters of that line an exit status carries.
MAX_LAST_ERROR = 300

#: The line an unported torchrun script dies with: torch's ``init_process_group`` (``env://``, its default) finding
#: none of torchrun's variables, or the script reading one itself (``int(os.environ["LOCAL_RANK"])``).
_TORCHRUN_LINE = re.compile(r"\s*(ValueError: Error initializing torch\.distributed using env:// rendezvous: "
                            r"environment variable \w+ expected|"
                            r"KeyError: '(LOCAL_RANK|RANK|LOCAL_WORLD_SIZE|WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT)')")

#: What such a line is followed by in the job's lines: what to change.
_TORCHRUN_HINT = (" (a torchrun script? cloud-elastic sets no RANK or WORLD_SIZE: port it to cloud_elastic.torch, "
                  "docs/torchrun.md)")

#: The line of a ``torch.distributed`` call on the default group (``dist.all_reduce``, ``dist.get_rank()``,
#: ``DistributedDataParallel``, ``DistributedSampler`` without ``num_replicas``) in a script that never formed one:
#: torch's ``_get_default_group`` (a ValueError; a RuntimeError before torch 2.3).
_DEFAULT_GROUP_LINE = re.compile(r"\s*(ValueError|RuntimeError): Default process group has not been initialized")

#: What that line is followed by: a job's workers never have a default group (their groups are the rounds').
_DEFAULT_GROUP_HINT = (" (a torch.distributed script? a job has no default process group: use hvd.allreduce, "
                       "hvd.DistributedOptimizer and hvd.rank() instead of dist.*, DDP or DistributedSampler, "
                       "docs/torchrun.md)")

#: Each line a script that is not (fully) ported dies with, and its hint (:func:`_hint`).
_PORTING_HINTS = ((_TORCHRUN_LINE, _TORCHRUN_HINT), (_DEFAULT_GROUP_LINE, _DEFAULT_GROUP_HINT))

#: An error line counts only when printed at most this long before its worker's exit was seen: one printed
#: earlier (a handled error, logged and trained past) says nothing of why the process ended.
LAST_ERROR_WINDOW_S = 5.0


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
    #: The last error line it printed just before a crash or an unreported non-zero exit ('' for none; see
    #: :class:`LastErrors`).
    last_error: str = ""

    @property
    def describe(self) -> str:
        """One-line human description."""
        if self.transport_error:
            return self.transport_error
        if not self.known:
            return "ended without saying its exit code (this driver could not learn it: its exit code is unknown)"
        printed = f" after printing: {self.last_error}" if self.last_error else ""
        if self.code < 0:
            return f"killed by signal {-self.code}{printed}"
        return f"exited with code {self.code}{printed}"


class LastErrors:
    """The one record of the last line each live worker printed that may say why it ended, fed a line at a time
    by its output thread (:meth:`offer`) and taken when its exit is seen (:meth:`attach`).

    A line counts if it reads as an error within its first :data:`ERROR_SCAN_CHARS` characters
    (:data:`_ERROR_LINE`; at most :data:`MAX_LAST_ERROR` of them are kept) and was printed at most
    :data:`LAST_ERROR_WINDOW_S` before the exit; it is attached only to a crash (:data:`~.repeats.CRASH_SIGNALS`:
    not a SIGKILL or SIGTERM from outside) or to a non-zero exit code the worker reported no error for. A shell
    wrapper's ``128 + N`` for those signals reads as the signal (:func:`~.repeats.death_signal`, the rule the
    repeat count reads too): 137 from outside names nothing, 134 is a crash. cloud-elastic's own final line for a
    worker that never reached the driver, or whose host lacks ``--network-interface``
    (:func:`~cloud_elastic.protocol_reports.said_own_reason`), wins over any other: it is the worker's reason.
    A line of a script not (fully) ported from torchrun or DDP (:data:`_PORTING_HINTS`) gets its hint, within the
    same bound.
    One short string per live worker; a dict's item set or pop is atomic, so the output threads need no lock.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last: dict[str, tuple[str, float, bool]] = {}  # worker id -> (line, printed at, cloud-elastic's own)

    def offer(self, worker_id: str, line: str) -> None:
        own = said_own_reason(line)
        if own:
            self._last[worker_id] = (own, self._clock(), True)
        elif _ERROR_LINE.match(line, 0, ERROR_SCAN_CHARS) and not self._last.get(worker_id, ("", 0.0, False))[2]:
            hint = _hint(line)
            if hint:
                line = line.strip()[:MAX_LAST_ERROR - len(hint)] + hint
            self._last[worker_id] = (line.strip()[:MAX_LAST_ERROR], self._clock(), False)

    def attach(self, worker_id: str, status: ExitStatus, reported: bool = False) -> tuple[ExitStatus, str]:
        """``status`` with the worker's last error line where it says why it ended, and the reason the worker
        gave in cloud-elastic's own final line ('' for none; its error, when it ``reported`` none). Forgets it."""
        line, at, own = self._last.pop(worker_id, ("", 0.0, False))
        if own:  # the worker's final line (it exits right after): its reason, unless it reported one
            return status, "" if reported else line
        if not line or not status.known or self._clock() - at > LAST_ERROR_WINDOW_S:
            return status, ""
        died_by = death_signal(status.code)  # a shell wrapper's 128 + N too: one rule with the repeat count
        if died_by in CRASH_SIGNALS or (died_by is None and status.code > 0 and not reported):
            return replace(status, last_error=line), ""
        return status, ""


def _hint(line: str) -> str:
    """What follows ``line`` in the job's lines when it is one of :data:`_PORTING_HINTS`' ('' when not)."""
    return next((hint for pattern, hint in _PORTING_HINTS if pattern.match(line, 0, ERROR_SCAN_CHARS)), "")


def reported_error_line(error: str) -> str:
    """The line the job's messages show for the error a worker's script reported it ended with (its exit report):
    :func:`~cloud_elastic.protocol_reports.error_line`'s, with its hint after a line of :data:`_PORTING_HINTS`,
    within the same bound. Such a script was ported half-way: ``hvd.init()`` reached the driver, and then it still
    called ``init_process_group()``, read ``LOCAL_RANK`` or used the default group (``dist.all_reduce``, DDP); its
    exit report, not its output, names why it ended, so :class:`LastErrors` never sees that line."""
    hint = _hint(error.strip())
    return error_line(error, MAX_ERROR_LINE - len(hint)) + hint if hint else error_line(error)


def signal_name(number: int) -> str:
    """The name of signal ``number`` (``SIGKILL``), or ``signal N`` for one this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
