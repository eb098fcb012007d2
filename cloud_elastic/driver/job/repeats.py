"""The same failure again and again without progress: how many times the job lets it happen.

A job whose workers fail the same way at the same point, with no commit past it in between, would otherwise
go round for ever (each relaunch forms a round, and a formed round restarts the ``--elastic-timeout`` clock).
:data:`REPEATS` bounds each such loop; the pieces that own the loops count them with a :class:`Streak`:

* a slot whose worker fails :data:`REPEATS` times at the same commit is blacklisted for the rest of the job
  (:meth:`.hosts.Blacklist.record_failure`); when that leaves fewer than ``--min-np`` slots, the job ends
  as any job below ``--min-np`` does;
* with ``--checkpoint-dir``, every worker lost :data:`REPEATS` times in a row without progress in between
  (the resumed attempt made no commit past the checkpoint it resumed from, or was lost at the same commit
  as the time before) ends the job rather than resume again (:meth:`.failures.Failures.fail`);
* a round aborted for a stall that re-forms with the same members and stalls again at the same commit,
  :data:`REPEATS` times in a row, ends the job (:meth:`.completion.Completion.check_progress`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

__all__ = ["REPEATS", "Streak"]

#: How many times the same failure, at the same commit, ends its loop (see the module docstring). Three:
#: a second failure may still be bad luck (a host lost twice), a third in the same place is the script's.
REPEATS = 3


@dataclass
class Streak:
    """How many times in a row the same thing (``key``) happened; another key starts the count again at 1."""

    key: Hashable = None
    count: int = 0

    def note(self, key: Hashable) -> int:
        """``key`` happened (again): return how many times in a row it has now."""
        if self.count and key == self.key:
            self.count += 1
        else:
            self.key, self.count = key, 1
        return self.count

    def clear(self) -> None:
        """Something else happened in between: the next :meth:`note` counts from 1."""
        self.key, self.count = None, 0
