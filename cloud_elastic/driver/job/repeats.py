"""The same failure again and again without progress: how many times the job lets it happen.

A job whose workers fail the same way at the same point, with no progress in between, would otherwise go round
for ever (each relaunch forms a round, and a formed round restarts the ``--elastic-timeout`` clock).
:data:`REPEATS` bounds each such loop; the pieces that own the loops count them with a :class:`Streak`, keyed on
how far the job has trained (:meth:`Trained.at`):

* a slot whose worker fails :data:`REPEATS` times in a row without progress is blacklisted for the rest of the job
  (:meth:`.hosts.Blacklist.record_failure`); when that leaves fewer than ``--min-np`` slots, the job ends
  as any job below ``--min-np`` does;
* with ``--checkpoint-dir``, every worker lost :data:`REPEATS` times in a row without progress in between ends the
  job rather than resume again (:meth:`.failures.Failures.fail`); progress there is what the checkpoints hold (a
  resumed attempt that loads the checkpoint an earlier one of the streak loaded got no further), or, for a state
  without fingerprints, a commit of the resumed attempt past the one the job was lost at the time before;
* a round aborted for a stall that re-forms with the same members and stalls again without progress,
  :data:`REPEATS` times in a row, ends the job (:meth:`.completion.Completion.check_progress`), but only
  when every member was waiting inside a collective each time (a mismatch no rank can leave): a member
  busy outside any collective is a straggler, and its stalls never count;
* a worker given up while its process still ran (``WorkerRecord.hung``), :data:`REPEATS` times in a row with no
  progress of the job in between, ends the job, naming it, what it was doing and the remedy (:class:`Hangs`,
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
  its silence alone counts: an outage longer than ``--heartbeat-timeout``, three times without progress, then does.
  Workers given up together count once, however many scans found them and in whatever order: every member of one
  stuck round, and every worker of one outage (already running when its first worker was given up, and given up
  within one ``--heartbeat-timeout`` of it, on any host: a network drop of several hosts; a host's round member and
  its newcomer); a worker relaunched after a give-up, or one that ran on past the outage, counts again. Any
  progress starts the count again, so an elastic job that trains on without it never ends this way (its slot only
  cools down), and neither does a straggler that comes back.

*Progress* is what was trained, not how many commits were made (:class:`Trained`). Horovod's own loop
(``for state.batch in range(state.batch, N): ...; state.commit()``) redoes the restored batch after each restore
and commits it again before the bug recurs: every relaunch adds a commit, yet trains nothing new. So each worker
reports with its commits a fingerprint of the committed state's plain attributes (``batch``, ``epoch``, ``step``:
what ``State(**kwargs)`` and ``TorchState(model, opt, **kwargs)`` hold besides tensors) and of its samplers'
positions (``worker.commit.fingerprint``; floats are left out: a metric such as ``state.loss`` differs at each
redo); a commit whose fingerprint the job has seen before is a redo, one with a new fingerprint is progress. The
fingerprints are trusted only where they were seen to say where training is, so that a job that trains on is never
stopped for attributes that do not: a worker reports its fingerprint only once two commits in a row of its process
held different attributes, and says they cannot tell (for good) once they stood still over training, i.e. a commit
held its predecessor's attributes after an optimizer step, or the restored state's after two (Horovod's redo is one
step; a step kept in a tensor, or ``epoch`` alone committed every N batches, stands still over more). Where no
worker reported one, or one said so, the commit counts as before: a commit past the one of the last failure is
progress.

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
from typing import Hashable

from cloud_elastic.protocol_reports import UNTOLD  # what a worker reports once its attributes cannot tell

__all__ = ["REPEATS", "CRASH_SIGNALS", "OUTSIDE_SIGNALS", "SILENT", "REMEMBERED", "UNTOLD", "Hangs", "Streak",
           "Trained", "death_signal", "own_failure"]

#: How many times the same failure, without progress, ends its loop (see the module docstring). Three:
#: a second failure may still be bad luck (a host lost twice), a third in the same place is the script's.
REPEATS = 3
#: How many fingerprints of committed states a job remembers, the oldest forgotten first (one a heartbeat at most:
#: a state trained again after this many others counts as new once more).
REMEMBERED = 4096

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


@dataclass
class Trained:
    """How far the job has trained, as the fingerprints of its committed states tell (see the module docstring).

    Fed every fingerprint a worker reports (:meth:`note`: the state it would restore, with each heartbeat and at
    rendezvous) and every one a checkpoint load reports (``stored=True``). :attr:`mark` counts the distinct
    fingerprints committed, :attr:`stored` those loaded from checkpoints; a fingerprint seen before (among the last
    :data:`REMEMBERED`) adds nothing, so Horovod's redo of a restored batch leaves both where they were.
    Pure and bounded: two dicts of at most :data:`REMEMBERED` short strings."""

    #: Distinct fingerprints committed, and loaded from checkpoints, so far.
    mark: int = 0
    stored: int = 0
    #: False once a worker said its state's attributes do not tell its commits apart (:data:`UNTOLD`): for good.
    telling: bool = True
    #: Whether a worker reported a fingerprint of its own commits: it does only once it saw its attributes move
    #: with training (``worker.ledger.CommitLedger.trained``); a checkpoint's alone proves nothing.
    heard: bool = False
    _seen: dict[str, None] = field(default_factory=dict)
    _loaded: dict[str, None] = field(default_factory=dict)

    def note(self, fingerprint: str, *, stored: bool = False) -> None:
        """A worker reported ``fingerprint`` ("": none, a state without plain attributes or not committed yet);
        ``stored``: the state a checkpoint load gave (it is committed too)."""
        if not fingerprint:
            return
        if fingerprint == UNTOLD:
            self.telling = False
            return
        if not stored:
            self.heard = True
        if stored and _remember(self._loaded, fingerprint):
            self.stored += 1
        if _remember(self._seen, fingerprint):
            self.mark += 1

    @property
    def tells(self) -> bool:
        """Whether the fingerprints measure progress: a worker reported its commits' (its attributes moved with
        training), and none said they cannot."""
        return self.telling and self.heard and self.mark > 0

    def at(self, commit: int) -> Hashable:
        """The guards' key for the job at ``commit``: how many states it has trained where the fingerprints tell,
        else the commit itself (a state without plain attributes: the commit-count rule)."""
        return ("trained", self.mark) if self.tells else commit

    def loaded(self) -> Hashable | None:
        """The key of every-worker-lost's streak: how many distinct states checkpoint loads gave (None where the
        fingerprints do not tell, or no load reported one: the commit-count rule then)."""
        return ("stored", self.stored) if self.tells and self.stored else None

    @property
    def nothing(self) -> str:
        """What "without progress" means now, for the end lines: no commit, or none of a state not trained before."""
        return "no commit of a state not trained before" if self.tells else "no commit"

    def none_between(self, commit: int) -> str:
        """``at commit N, with no commit past it in between`` (or none of a new state), for the end lines."""
        return f"at commit {commit}, with {self.nothing if self.tells else 'no commit past it'} in between"


def _remember(seen: dict[str, None], fingerprint: str) -> bool:
    """Add ``fingerprint`` to ``seen`` (oldest first, at most :data:`REMEMBERED`); True when it was not there."""
    if fingerprint in seen:
        return False
    seen[fingerprint] = None
    if len(seen) > REMEMBERED:
        del seen[next(iter(seen))]
    return True


@dataclass
class Hangs:
    """Workers given up while their process still ran (``WorkerRecord.hung``), in a row without progress of the job.

    Workers given up together count once: each give-up comes with the keys of what it was part of (the round it was
    a member of, the outage it was given up in: see ``Failures._together``), and one that shares a key with a give-up
    already counted since the last progress counts 0. Every key seen since is kept (progress clears them): only
    the last one kept, one outage of two hosts whose workers the scans found in the order b, c, b counted 3 and ended
    a healthy job. Not a blacklist: the slot keeps its usual cooldown; the job ends at the :data:`REPEATS`-th (see the
    module docstring)."""

    streak: Streak = field(default_factory=Streak)
    _keys: set[Hashable] = field(default_factory=set)
    #: The workers given up as hung since the last progress, counted or not, first give-up first: id -> (host, slot).
    workers: dict[str, tuple[str, str]] = field(default_factory=dict)

    def given_up(self, at: Hashable, together: frozenset[Hashable], worker: str = "", host: str = "",
                 slot: str = "") -> int:
        """A hung worker (``worker`` on ``slot`` of ``host``) was given up with the job at ``at`` (how far it had
        trained: :meth:`Trained.at`), as part of everything in ``together``: how many such give-ups in a row there are
        now with no progress in between (0: it shares a key with a give-up already counted since; its other keys join
        that one's)."""
        if not self.streak.count or at != self.streak.key:
            self._keys.clear()
            self.workers.clear()
        self.workers[worker] = (host, slot)
        if self._keys & together:
            self._keys |= together
            return 0
        self._keys |= together
        return self.streak.note(at)

    def line(self, worker: str, commit: int, times: int, doing: str, nothing: str = "no commit") -> str:
        """The job's end line: the worker (``host[slot] (rank N)``), the commit, how many times, what it was doing
        (:data:`SILENT` first for one given up for silence), and the timeout that gave it up, to raise; ``nothing``:
        what came in between (no commit; or none of a new state, :meth:`Trained.none_between`). Where the
        give-ups were of more than one slot (an outage of several hosts, then others), it says how many workers on
        which hosts were given up, and names the last one."""
        remedy = ("raise --heartbeat-timeout if its script can hold the GIL that long" if doing.startswith(SILENT)
                  else "raise --progress-timeout if this step can take longer")
        if len(set(self.workers.values())) <= 1:  # one slot's worker each time (relaunched after each give-up)
            return (f"no progress: worker {worker} was given up {times} times in a row at commit {commit}, its process "
                    f"still running each time and {nothing} in between; what it was doing: {doing}; {remedy}")
        hosts = list(dict.fromkeys(host for host, _ in self.workers.values()))
        on = f"on host {hosts[0]}" if len(hosts) == 1 else f"on {len(hosts)} hosts ({', '.join(hosts[:8])}" + (
            ", ...)" if len(hosts) > 8 else ")")
        return (f"no progress: hung workers were given up {times} times in a row at commit {commit} "
                f"({len(self.workers)} workers {on}; those given up together, in one outage or one round, count "
                f"once), their processes still running each time and {nothing} in between; the last: worker {worker}, "
                f"what it was doing: {doing}; {remedy}")
