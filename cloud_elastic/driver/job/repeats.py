"""The same failure again and again without progress: how many times the job lets it happen.

A job whose workers fail the same way at the same point, without progress in between, would otherwise
go round for ever (each relaunch forms a round, and a formed round restarts the ``--elastic-timeout`` clock).
:data:`REPEATS` bounds each such loop; the pieces that own the loops count them with a :class:`Streak`:

* a slot whose worker fails :data:`REPEATS` times in a row without progress is blacklisted for the rest of the job
  (:meth:`.hosts.Blacklist.record_failure`); when that leaves fewer than ``--min-np`` slots, the job ends
  as any job below ``--min-np`` does;
* with ``--checkpoint-dir``, every worker lost :data:`REPEATS` times in a row without progress in between
  (the resumed attempt made no commit past the checkpoint it resumed from, or was lost where it was the time
  before: :meth:`Mark.repeats`) ends the job rather than resume again (:meth:`.failures.Failures.fail`);
* a round aborted for a stall that re-forms with the same members and stalls again without progress,
  :data:`REPEATS` times in a row, ends the job (:meth:`.completion.Completion.check_progress`), but only
  when every member was waiting inside a collective each time (a mismatch no rank can leave): a member
  busy outside any collective is a straggler, and its stalls never count;
* a worker given up while its process still ran (``WorkerRecord.hung``), :data:`REPEATS` times in a row without
  progress in between, ends the job, naming it, what it was doing and the remedy (:class:`Hangs`,
  :meth:`.failures.Failures.give_up`); the job's end checkpoints its newest commit first (``ending.FailingEnd``).
  Such a worker is *stuck* (no progress past ``--progress-timeout`` after its round's abort while it still
  heartbeats: a deadlock; it counts as it is given up) or *silent* (its heartbeats stopped for the whole
  ``--heartbeat-timeout``: a hang holding the GIL; one the fast silence rule gave up sooner never counts, a
  healthy C call may hold the GIL for seconds). A silent one counts only once its process was killed
  (:meth:`.failures.Failures.signal_stacks`), and never if a heartbeat of it arrived after its give-up (a frozen
  host that thawed). Where its stacks signal is armed it counts only if it printed its stacks on the signal the
  stop sends: ``faulthandler``'s handler needs no GIL, so a GIL-hung process prints them, while a frozen host or
  one whose network is down (its ssh session still open) prints nothing, and such an outage never counts. Where it
  is not (the script handles SIGUSR1, a wrapper gets the signal, a Ray, Spark or adopted process cannot be asked)
  its silence alone counts: an outage longer than ``--heartbeat-timeout``, three times at one commit, then does.
  Workers given up together count once, however many scans found them and in whatever order: every member of one
  stuck round, and every worker of one outage (already running when its first worker was given up, and given up
  within one ``--heartbeat-timeout`` of it, on any host: a network drop of several hosts; a host's round member and
  its newcomer); a worker relaunched after a give-up, or one that ran on past the outage, counts again. Progress
  (below) starts the count again, so an elastic job that trains on without it never ends this way (its slot only
  cools down), and neither does a straggler that comes back.

*At the same commit* means no progress in between, as :meth:`Mark.repeats` decides: a failure repeats the one
before when the job's commit is the same (each attempt resumed from the checkpoint trains up to the bug and fails
there again), or when its round restored the commit the previous failing round restored or one commit past it and
itself made at most one commit. The second is Horovod's loop (``for state.batch in range(state.batch, ...)``), which
redoes the committed batch after each restore and commits it again before the bug recurs: one commit per relaunch,
so the job's commit never repeats. Anything that got further (a round that made two commits or more, one that
restored a later commit) starts the count again: a job that fails the same way every few commits progresses, and
none of these loops ever stops it.

Only a failure the worker's own process caused counts (:func:`own_failure`): an exception its script
reported, a non-zero exit code, or death by a crash signal (:data:`CRASH_SIGNALS`). A worker killed from
outside (SIGKILL or SIGTERM: a spot reclaim, a preemption, the OOM killer), a host that could not be reached
and a host lost from discovery keep the usual growing cooldown, however often they happen: a flapping host or
a storm of reclaims is not the script's fault (under ``--blacklist-cooldown-range 0 0`` any failure of a worker
blocks its slot for good, as Horovod does). A host that leaves discovery and comes back starts with a clean
record, but a slot blocked for good stays so unless a new instance holds the address
(:meth:`.hosts.HostManager.update`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Callable, Hashable

__all__ = ["REPEATS", "CRASH_SIGNALS", "OUTSIDE_SIGNALS", "SILENT", "Hangs", "Mark", "Streak", "death_signal",
           "own_failure", "repeated"]

#: How many times the same failure, without progress in between, ends its loop (see the module docstring). Three:
#: a second failure may still be bad luck (a host lost twice), a third in the same place is the script's.
REPEATS = 3

#: The signals a process dies by of its own doing (an abort(), a bad memory access, a bad instruction).
CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})
#: Killed from outside (a reclaim, a preemption, the OOM killer, an operator): never the script's fault.
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM})
#: What a worker given up for silence while its process still ran was doing, as far as the driver can tell; it
#: counts once it has printed its stacks on the driver's signal (see the module docstring).
SILENT = "silent (holding the GIL?)"


def death_signal(exit_code: int) -> int | None:
    """The signal a worker process died by, as its exit code tells: ``-N`` for signal N; under a shell wrapper
    (``bash run.sh`` whose ``python`` child died), the shell's ``128 + N``, read as a signal only for the ones the
    job's rules tell apart (:data:`CRASH_SIGNALS`, :data:`OUTSIDE_SIGNALS`), so ``sys.exit(130)`` stays a code.
    None when it did not die by one of those (or a signal at all). The one place both the repeat count
    (:func:`own_failure`) and the failure's line (``exit_status.LastErrors.attach``) read it."""
    if exit_code < 0:
        return -exit_code
    if exit_code > 128 and exit_code - 128 in CRASH_SIGNALS | OUTSIDE_SIGNALS:
        return exit_code - 128
    return None


def own_failure(error: str, exit_code: int | None, transport: bool) -> bool:
    """Whether a worker's failure is its own process's doing, and so counts toward a repeat: it reported an
    exception (``error``), or its process ended with a non-zero code or a crash signal (``exit_code``, ``-N``
    for signal N, or a shell's ``128 + N``: :func:`death_signal`). Not when its host could not be reached
    (``transport``), it was killed from outside, or its end is unknown (given up as silent or stuck)."""
    if transport:
        return False
    if error:
        return True
    if exit_code is None or exit_code == 0:
        return False
    died_by = death_signal(exit_code)
    return exit_code > 0 if died_by is None else died_by in CRASH_SIGNALS


@dataclass(frozen=True)
class Mark:
    """Where in the job's history a failure happened: ``commit``, the job's commit then (the highest any worker
    reported), and ``start``, the commit its round continued from (what its members restored, or the checkpoint
    its rank 0 loaded: ``JobView.round_start``; None where unknown)."""

    commit: int
    start: int | None = None

    def repeats(self, before: Mark) -> bool:
        """Whether this failure got no further than ``before``, the previous one: the same commit, or (Horovod's
        loop, which redoes and commits the restored batch before the bug recurs) its round restored ``before``'s
        round's commit or the one past it, and made at most one commit of its own. The starts are what the
        members said at rendezvous (exact), so a round that kept two commits or more breaks the run however late
        its heartbeats came; only this round's own commits are as its heartbeats last said."""
        if self.commit == before.commit:
            return True
        if self.start is None or before.start is None:
            return False
        return before.start <= self.start <= before.start + 1 and self.commit - self.start <= 1


def repeated(key: tuple[Hashable, Mark], before: tuple[Hashable, Mark]) -> bool:
    """For a :class:`Streak` of ``(what, Mark)`` keys: the same ``what`` (error, members), no progress in between."""
    return key[0] == before[0] and key[1].repeats(before[1])


@dataclass
class Streak:
    """How many times in a row the same thing (``key``) happened; another key starts the count again at 1.
    ``same(key, before)`` says whether ``key`` is the same thing as the one before (default: equal); the count
    goes on from the latest key, so a chain of small steps (:meth:`Mark.repeats`) is compared one link at a time."""

    key: Hashable = None
    count: int = 0

    def note(self, key: Hashable, same: Callable[[Hashable, Hashable], bool] | None = None) -> int:
        """``key`` happened (again): return how many times in a row it has now."""
        if self.count and (key == self.key if same is None else same(key, self.key)):
            self.key, self.count = key, self.count + 1
        else:
            self.key, self.count = key, 1
        return self.count

    def clear(self) -> None:
        """Something else happened in between: the next :meth:`note` counts from 1."""
        self.key, self.count = None, 0


@dataclass
class Hangs:
    """Workers given up while their process still ran (``WorkerRecord.hung``), in a row without progress in between
    (:meth:`Mark.repeats`).

    Workers given up together count once: each give-up comes with the keys of what it was part of (the round it was
    a member of, the outage it was given up in: see ``Failures._together``), and one that shares a key with a give-up
    already counted in this run counts 0. Every key seen in the run is kept (progress clears them): only
    the last one kept, one outage of two hosts whose workers the scans found in the order b, c, b counted 3 and ended
    a healthy job. Not a blacklist: the slot keeps its usual cooldown; the job ends at the :data:`REPEATS`-th (see the
    module docstring)."""

    streak: Streak = field(default_factory=Streak)
    _keys: set[Hashable] = field(default_factory=set)
    #: The workers given up as hung in this run, counted or not, first give-up first: id -> (host, slot).
    workers: dict[str, tuple[str, str]] = field(default_factory=dict)

    def given_up(self, commit: int | Mark, together: frozenset[Hashable], worker: str = "", host: str = "",
                 slot: str = "") -> int:
        """A hung worker (``worker`` on ``slot`` of ``host``) was given up with the job at ``commit`` (a plain number:
        its commit, round start unknown), as part of everything in ``together``: how many such give-ups in a row there
        are now without progress in between (:meth:`Mark.repeats`; 0: it shares a key with a give-up already counted
        in this run; its other keys join that one's). The keys are kept for the whole run: a round's members found
        by two scans with a late heartbeat's commit in between still count once."""
        mark = commit if isinstance(commit, Mark) else Mark(commit)
        if not self.streak.count or not mark.repeats(self.streak.key):
            self._keys.clear()
            self.workers.clear()
            self.streak.clear()
        self.workers[worker] = (host, slot)
        if self._keys & together:
            self._keys |= together
            return 0
        self._keys |= together
        return self.streak.note(mark, Mark.repeats)

    def line(self, worker: str, commit: int, times: int, doing: str) -> str:
        """The job's end line: the worker (``host[slot] (rank N)``), the commit, how many times, what it was doing
        (:data:`SILENT` first for one given up for silence), and the timeout that gave it up, to raise. Where the
        give-ups were of more than one slot (an outage of several hosts, then others), it says how many workers on
        which hosts were given up, and names the last one."""
        remedy = ("raise --heartbeat-timeout if its script can hold the GIL that long" if doing.startswith(SILENT)
                  else "raise --progress-timeout if this step can take longer")
        if len(set(self.workers.values())) <= 1:  # one slot's worker each time (relaunched after each give-up)
            return (f"no progress: worker {worker} was given up {times} times in a row at commit {commit}, its process "
                    f"still running each time and no progress in between (at most one redone commit); what it was "
                    f"doing: {doing}; {remedy}")
        hosts = list(dict.fromkeys(host for host, _ in self.workers.values()))
        on = f"on host {hosts[0]}" if len(hosts) == 1 else f"on {len(hosts)} hosts ({', '.join(hosts[:8])}" + (
            ", ...)" if len(hosts) > 8 else ")")
        return (f"no progress: hung workers were given up {times} times in a row at commit {commit} "
                f"({len(self.workers)} workers {on}; those given up together, in one outage or one round, count "
                f"once), their processes still running each time and no progress in between; the last: worker "
                f"{worker}, what it was doing: {doing}; {remedy}")
